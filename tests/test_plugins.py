"""Prototyping without editing the package: a grouper, a task with its own held-out file and a
reward defined in tests/plugins/lab_plugin.py train through ``train()`` and through
``grpo-lab train --plugin``, and appear in the grouping explorer; bad input is named."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_lab.cli import main
from grpo_lab.training.config import preset
from grpo_lab.algorithm.grouping import GROUPERS, PromptBatch, get_grouper, register_grouper
from grpo_lab.registry import load_plugins
from grpo_lab.tasks import Example, TASKS, register_task
from grpo_lab.tasks.task_data import load_eval
from grpo_lab.training.trainer import train

PLUGIN = str(Path(__file__).resolve().parent / "plugins" / "lab_plugin.py")
RUN = dict(steps=3, eval_size=10, eval_every=0, threads=1, time_budget_s=0.0)


def test_plugin_grouper_task_and_reward_train_through_train(tmp_path):
    c = preset("quick", plugins=PLUGIN, task="double,addition", grouping="by_difficulty",
               group={"k": 2}, reward_weights={"accuracy": 1.0, "short": 0.2},
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
                 "--grouping", "by_difficulty", "--group.k", "2", "--steps", "2",
                 "--eval_size", "10", "--threads", "1", "--out_dir", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and "eval/accuracy" in rows[-1]
    code = main(["train", "--plugin", "no_such_module_xyz", "--out_dir", str(tmp_path / "x")])
    assert code == 2 and "plugin 'no_such_module_xyz' could not be imported" in \
        capsys.readouterr().err


def test_a_plugin_path_that_is_a_folder_is_named_as_one(tmp_path, capsys):
    """--plugin FOLDER said "no such file FOLDER", of a folder that is there."""
    code = main(["train", "--plugin", str(tmp_path), "--out_dir", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and f"plugin {str(tmp_path)!r} could not be imported: IsADirectoryError: " \
        f"{tmp_path} is a folder: name the plugin's .py file" in err
    assert not (tmp_path / "x").exists()


def test_plugin_grouper_in_the_grouping_explorer():
    from grpo_lab.teaching.widgets.grouping import grouping_explorer
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
    register_grouper("halves", halves, takes_k=True)                      # a re-run cell: fine
    with pytest.raises(TypeError, match="grouper 'halves' needs 'k'"):   # called without k
        register_grouper("halves", halves)
    assert GROUPERS["halves"].takes_k                                     # left as it was


def test_bad_groupers_tasks_and_plugins_are_named():
    b = PromptBatch(["1+1=", "2+2=", "3+3="])
    with pytest.raises(ValueError, match="k=5 groups is more than the 3 prompts"):
        get_grouper("random")(b, 5)
    with pytest.raises(ValueError, match="number of groups k must be a positive integer, got 0"):
        get_grouper("kmeans_semantic")(b, 0)

    @register_grouper("two_ids")
    def two_ids(batch, seed=0):
        return np.zeros(2, dtype=np.int64)
    with pytest.raises(ValueError, match="grouper 'two_ids' returned 2 ids .* for 3 prompts"):
        get_grouper("two_ids")(b)

    @register_grouper("float_ids")
    def float_ids(batch, seed=0):
        return np.zeros(3)
    with pytest.raises(ValueError, match="grouper 'float_ids' returned ids of dtype float64"):
        get_grouper("float_ids")(b)
    with pytest.raises(ValueError, match="grouping 'by_prompt' is already registered"):
        register_grouper("by_prompt", two_ids)
    with pytest.raises(ValueError, match=r"99 groups \(group.k=99\) is more than"):
        preset("quick", plugins=PLUGIN, grouping="by_difficulty", group={"k": 99})

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


def test_k_is_passed_only_to_a_grouper_that_takes_it(tmp_path):
    seen = []

    @register_grouper("pairs_no_k")                        # takes_k=False: called (batch, seed)
    def pairs_no_k(batch, seed=0):
        seen.append(seed)
        return np.arange(len(batch.prompts)) // 2

    b = PromptBatch(["1+1=", "2+2=", "3+3=", "4+4="])
    assert get_grouper("pairs_no_k")(b, 3, seed=5).tolist() == [0, 0, 1, 1] and seen == [5]
    c = preset("quick", grouping="pairs_no_k", out_dir=str(tmp_path), **RUN)
    assert [h["group/size_mean"] for h in train(c, progress=False)[1:]] == [2 * c.group_size] * 3


def test_group_k_for_a_k_less_grouper_is_an_error_and_a_missing_k_a_warned_default(tmp_path,
                                                                                    capsys):
    code = main(["train", "--preset", "quick", "--grouping", "by_prompt", "--group.k", "4",
                 "--out_dir", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert code == 2 and "--group.k 4 but grouping 'by_prompt' takes no k" in err
    assert "'kmeans_semantic'" in err and not (tmp_path / "a").exists()
    # one task, no group.k: not k = 1 (one group of the whole batch) but prompts_per_step // 4
    with pytest.warns(UserWarning, match=r"group.k is not set: using k = 4 \(max\(2, "):
        c = preset("quick", plugins=PLUGIN, task="double", grouping="by_difficulty",
                   prompts_per_step=16)
    assert c.group.n_groups(c) == 4
    with pytest.warns(UserWarning, match=r"k = 7 \(one per task\)"):
        c = preset("quick", task="mixture", grouping="random")
        assert c.group.n_groups(c) == 7
    with pytest.warns(UserWarning, match="k = 2"):                    # never more than 2 of 2
        c = preset("quick", grouping="random", prompts_per_step=2)
        assert c.group.n_groups(c) == 2
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # an explicit k, or no k: silent
        c = preset("quick", grouping="random", group={"k": 3})
        assert c.group.n_groups(c) == 3
        preset("quick", grouping="by_prompt")


def test_plugin_flag_on_every_subcommand_and_one_in_help(tmp_path, capsys):
    from grpo_lab.cli import build_parser
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices
    help_text = sub["train"].format_help()
    assert "--plugin MODULE" in help_text and "--plugins" not in help_text   # listed once
    for cmd in ("eval", "pretrain"):
        assert "--plugin" in sub[cmd].format_help(), cmd
    args = parser.parse_args(["train", "--plugins", "a.py,b.py", "--plugin", "c"])
    assert args.plugin == ["a.py,b.py", "c"]                 # the old spelling is an alias
    # eval a plugin task's held-out set, the plugin given by path
    code = main(["eval", "--plugin", PLUGIN, "--task", "double", "--eval_size", "5"])
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["task"] == "double"
    # pretrain a plugin task's demonstrations: the plugin is loaded before the config is read
    code = main(["pretrain", "--plugin", PLUGIN, "--tasks", "double", "--steps", "2",
                 "--stop_after", "2", "--batch_size", "4", "--out", str(tmp_path / "p.safetensors")])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "p.safetensors").exists()


def test_eval_defaults_to_the_checkpoint_task_and_a_checkpoint_can_start_a_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--preset", "quick", "--plugin", PLUGIN, "--task", "double,addition",
                 "--steps", "2", "--eval_size", "10", "--threads", "1",
                 "--out_dir", str(out)]) == 0
    capsys.readouterr()
    ckpt = out / "checkpoint.safetensors"
    assert main(["eval", "--checkpoint", str(ckpt), "--eval_size", "5"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["task"] == "double,addition"                  # the run's task, its plugin loaded
    assert {"eval/accuracy/double", "eval/accuracy/addition"} <= set(res)
    # a training checkpoint as base_checkpoint: a new run from its weights, with a warning
    from grpo_lab.checkpoint import read_training_checkpoint
    from grpo_lab.policies.model import load_policy
    with pytest.warns(UserWarning, match="training checkpoint .saved at step 1.*--resume"):
        policy = load_policy(ckpt)
    saved = read_training_checkpoint(ckpt)["policy"]
    assert all(torch.equal(v, saved[k]) for k, v in policy.state_dict().items() if k in saved)
    assert main(["train", "--preset", "quick", "--base_checkpoint", str(ckpt), "--steps", "1",
                 "--eval_size", "5", "--threads", "1", "--out_dir", str(tmp_path / "b")]) == 0


def test_eval_path_of_a_plugin_task_and_the_held_out_rule_in_the_docstring():
    from grpo_lab.tasks.task_data import eval_path
    load_plugins(PLUGIN)
    assert eval_path("double") == Path(PLUGIN).parent / "eval_double.jsonl"
    assert eval_path("double").exists() and eval_path("addition").exists()
    rows = [json.loads(x) for x in eval_path("double").read_text().splitlines()]
    assert set(rows[0]) == {"prompt", "answer", "task"}          # the format the docstring gives
    doc = register_task.__doc__
    assert '{"prompt": "dbl:21=", "answer": "42", "task": "double"}' in doc
    assert "removes every prompt of the whole file" in doc
    # the rule itself: no training draw of the plugin task is one of its held-out prompts
    from grpo_lab.training.trainer import prompt_source
    held = {e.prompt for e in load_eval("double")}
    draw = prompt_source(preset("quick", plugins=PLUGIN, task="double"), held)
    import random
    assert not held & {e.prompt for e in draw(random.Random(0), 2000)}


def test_a_plugin_grouper_declares_its_settings_block_and_trains_with_it(tmp_path, capsys,
                                                                       forget_plugin):
    plugin = str(Path(__file__).resolve().parent / "plugins" / "length_buckets.py")
    load_plugins(plugin)
    rec = GROUPERS["by_length"]
    b = PromptBatch(["1+2=", "10+2=", "3+4=", "10+20="])                  # lengths 4, 5, 4, 6
    assert rec(b, settings=rec.settings(width=1)).tolist() == [0, 1, 0, 2]
    assert rec(b, settings=rec.settings(width=2)).tolist() == [0, 0, 0, 1]  # 2, 2, 2, 3
    with pytest.raises(ValueError, match="by_length.width must be >= 1, got 0"):
        preset("quick", plugins=plugin, grouping="by_length", by_length={"width": 0})
    # the command line reaches it as it reaches the built-in blocks; the trainer's grouper
    # gives it the block: 100 characters a bucket puts all 8 prompts in one group of 8 x 4 rows
    out = tmp_path / "cli"
    assert main(["train", "--preset", "quick", "--plugin", plugin, "--grouping", "by_length",
                 "--by_length.width", "100", "--steps", "2", "--eval_size", "0",
                 "--threads", "1", "--out_dir", str(out)]) == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["by_length"] == {"width": 100}
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["group/size_mean"] for r in rows if r["step"] >= 0] == [32, 32]


def test_a_plugin_that_raises_at_import_is_one_line_naming_it(tmp_path, capsys):
    f = tmp_path / "raising_plugin.py"
    f.write_text("import numpy\nraise RuntimeError('no data folder')\n")
    with pytest.raises(ValueError, match=r"plugin '.*raising_plugin.py' could not be imported: "
                       r"RuntimeError: no data folder \(raised at raising_plugin.py:2"):
        load_plugins(str(f))
    # the command line: one line and exit 2, not the traceback a RuntimeError gave
    code = main(["train", "--preset", "quick", "--plugin", str(f), "--out_dir",
                 str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert "raising_plugin.py' could not be imported: RuntimeError: no data folder" in err
