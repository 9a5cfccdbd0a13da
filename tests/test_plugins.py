"""Prototyping without editing the package: a grouper, a task with its own held-out file and a
reward defined in tests/plugins/lab_plugin.py train through ``train()`` and through
``grpo-lab train --plugin``, and appear in the grouping explorer; bad input is named."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_lab.cli import main
from grpo_lab.config import preset
from grpo_lab.grouping import GROUPERS, PromptBatch, get_grouper, register_grouper
from grpo_lab.registry import load_plugins
from grpo_lab.tasks import Example, TASKS, load_eval, register_task
from grpo_lab.trainer import train

PLUGIN = str(Path(__file__).resolve().parent / "plugins" / "lab_plugin.py")
RUN = dict(steps=3, eval_size=10, eval_every=0, threads=1, time_budget_s=0.0)


def test_plugin_grouper_task_and_reward_train_through_train(tmp_path):
    c = preset("quick", plugins=PLUGIN, task="double,addition", grouping="by_difficulty",
               group_k=2, reward_weights={"accuracy": 1.0, "short": 0.2},
               out_dir=str(tmp_path), **RUN)
    assert GROUPERS["by_difficulty"].needs_reward_stats and "double" in TASKS
    history = train(c, progress=False)
    last = history[-1]
    assert {"reward/short", "eval/accuracy/double", "eval/accuracy/addition"} <= set(last)
    assert all(h["group/size_mean"] == 8 * 4 / 2 for h in history[1:])   # 2 buckets of 4 prompts
    assert len(load_eval("double")) == 30                                # its own held-out file


def test_plugin_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(["train", "--preset", "quick", "--plugin", PLUGIN, "--task", "double",
                 "--grouping", "by_difficulty", "--group_k", "2", "--steps", "2",
                 "--eval_size", "10", "--threads", "1", "--out_dir", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and "eval/accuracy" in rows[-1]
    code = main(["train", "--plugin", "no_such_module_xyz", "--out_dir", str(tmp_path / "x")])
    assert code == 2 and "plugin 'no_such_module_xyz' could not be imported" in \
        capsys.readouterr().err


def test_plugin_grouper_in_the_grouping_explorer():
    from grpo_lab.widgets.grouping import grouping_explorer
    load_plugins(PLUGIN)
    prompts = ["1+2=", "3+4=", "rev:abc=", "rev:xyz="]
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 0.5])      # means 1, 0, .5, .5
    box, parts = grouping_explorer(prompts, ["addition"] * 2 + ["reverse"] * 2, rewards, G=2,
                                   k=2, strategy="by_difficulty")
    assert "by_difficulty" in parts["strategy"].options
    assert parts["data"]["ids"] == [1, 0, 0, 1]                           # stable by mean: 1,2 | 3,0
    parts["k"].value = 4
    assert parts["data"]["ids"] == [3, 0, 1, 2]


def test_a_function_or_record_is_a_grouping(tmp_path):
    def halves(batch, k, seed=0):
        return np.arange(len(batch.prompts)) * 2 // len(batch.prompts)
    c = preset("quick", grouping=halves, out_dir=str(tmp_path), **RUN)
    assert c.grouping == "halves" and GROUPERS["halves"].takes_k
    rec = get_grouper("halves")
    assert rec(PromptBatch(["1+1=", "2+2=", "3+3=", "4+4="]), 2).tolist() == [0, 0, 1, 1]
    register_grouper("halves", halves)                                    # a re-run cell: fine


def test_bad_groupers_tasks_and_plugins_are_named():
    b = PromptBatch(["1+1=", "2+2=", "3+3="])
    with pytest.raises(ValueError, match="k=5 groups is more than the 3 prompts"):
        get_grouper("random")(b, 5)
    with pytest.raises(ValueError, match="number of groups k must be a positive integer, got 0"):
        get_grouper("kmeans_semantic")(b, 0)

    @register_grouper("two_ids")
    def two_ids(batch, k, seed=0):
        return np.zeros(2, dtype=np.int64)
    with pytest.raises(ValueError, match="grouper 'two_ids' returned 2 ids .* for 3 prompts"):
        get_grouper("two_ids")(b)

    @register_grouper("float_ids")
    def float_ids(batch, k, seed=0):
        return np.zeros(3)
    with pytest.raises(ValueError, match="grouper 'float_ids' returned ids of dtype float64"):
        get_grouper("float_ids")(b)
    with pytest.raises(ValueError, match="grouping 'by_prompt' is already registered"):
        register_grouper("by_prompt", two_ids)
    with pytest.raises(ValueError, match=r"99 groups \(group_k=99\) is more than"):
        preset("quick", plugins=PLUGIN, grouping="by_difficulty", group_k=99)

    def shout(rng):
        return Example("HI=", "1", "shout")
    with pytest.raises(ValueError, match="task 'shout': prompt 'HI=' has character 'H'"):
        register_task("shout", shout, "0123456789", 1)
    assert "shout" not in TASKS

    def long_answer(rng):
        return Example("n=", "12345", "long")
    with pytest.raises(ValueError, match="longer than max_answer_len=2"):
        register_task("long", long_answer, "0123456789", 2)

    def no_eval(rng):
        return Example(f"id:{rng.randrange(9)}=", "1", "no_eval")
    register_task("no_eval", no_eval, "1", 1)
    with pytest.raises(ValueError, match="task 'no_eval' has no held-out set"):
        load_eval("no_eval")
    with pytest.raises(ValueError, match="plugin 'tests/nope.py' could not be imported"):
        load_plugins("tests/nope.py")
