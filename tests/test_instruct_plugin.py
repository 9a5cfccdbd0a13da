"""Tasks for any tokenizer: a task declares what it needs (``Task.alphabet``), the run's policy
is checked against it at setup, a task in words registers through the public register_task;
a grouper sees the task's own prompt and fields beside the rendered one, and one that falls
back to by_prompt is reported; notebooks/plugins/instruct_lab.py trains on data/hf_tiny
through the CLI."""
import json
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_lab.algorithm.grouping import PromptBatch, register_grouper
from grpo_lab.algorithm.grouping import GroupingFallback, StepGrouper
from grpo_lab.cli import main
from grpo_lab.registry import load_plugins
from grpo_lab.tasks import TASKS, Example, in_words, register_task
from grpo_lab.tasks.answers import TASK_KINDS, AnswerFormat, is_correct, register_format
from grpo_lab.tasks.instruct import render
from grpo_lab.training.config import preset
from grpo_lab.training.trainer import UnreadableText, check_readable, setup

PLUGIN = str(Path(__file__).resolve().parents[1] / "notebooks" / "plugins" / "instruct_lab.py")


def _times_words(rng: random.Random) -> Example:
    a = rng.randint(2, 9)
    return Example(f"What is {a} times two?", str(2 * a), "times_words", fields={"a": a})


def test_a_task_in_words_registers_through_the_public_api(monkeypatch):
    monkeypatch.delitem(TASKS, "times_words", raising=False)
    with pytest.raises(ValueError, match="has character 'W', which is not in the task's "
                                         "alphabet"):
        register_task("times_words", _times_words, "0123456789", 2)       # the toy's default
    with pytest.raises(ValueError, match="written in words .* give it an answer_kind"):
        register_task("times_words", _times_words, "0123456789", 2, alphabet=None)
    rec = register_task("times_words", _times_words, "0123456789", 2, alphabet=None,
                        answer_kind="number")
    assert rec.alphabet is None and in_words("times_words")
    assert TASK_KINDS["times_words"].name == "number"
    assert is_correct("5 times two is 10.", True, "tags", "times_words", "10")
    # the shipped instruct tasks are registered the same way
    assert TASKS["word_problems"].alphabet is None and TASKS["countdown"].alphabet is None
    assert TASKS["addition"].alphabet == TASKS["sort"].alphabet and not in_words("addition")
    # rendering keeps the task's own prompt: "What is 5 times two?" is already the question
    ex = render(_times_words(random.Random(0)), "tags")
    assert ex.raw_prompt.startswith("What is ") and ex.prompt == \
        ex.raw_prompt + " Put the final answer in <answer></answer> tags."
    with pytest.raises(ValueError, match="answer_kind must be an answers.AnswerKind"):
        register_task("bad_kind", _times_words, "0123456789", 2, alphabet=None, answer_kind=3)
    with pytest.raises(ValueError, match="alphabet must be a non-empty string"):
        register_task("bad_alpha", _times_words, "0123456789", 2, alphabet="")
    with pytest.raises(ValueError, match="answer format 'raw' is the toy's own"):
        register_format(AnswerFormat("raw", "x", bool, False))
    with pytest.raises(ValueError, match="answer format 'tags' is already registered"):
        register_format(AnswerFormat("tags", "x", bool, False))


def test_the_policy_is_checked_at_setup_naming_the_task_and_character(monkeypatch, tmp_path):
    # a toy-format task whose own alphabet has '#': registered, but the toy policy cannot read it
    def hash_task(rng):
        a = rng.randrange(10)
        return Example(f"{a}#{a}=", str(a), "hashed")
    monkeypatch.delitem(TASKS, "hashed", raising=False)
    register_task("hashed", hash_task, "0123456789", 1, alphabet="0123456789#=")
    cfg = preset("quick", task="hashed", eval_size=0, out_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"task 'hashed': prompt '\d#\d=' has character '#', "
                                         r"which the toy policy cannot read"):
        setup(cfg)
    # a task in words on the toy: refused when the config is built (it needs an answer_format)
    monkeypatch.delitem(TASKS, "times_words", raising=False)
    register_task("times_words", _times_words, "0123456789", 2, alphabet=None,
                  answer_kind="number")
    with pytest.raises(ValueError, match="task .times_words. is written for instruct models"):
        preset("quick", task="times_words", eval_size=0)


def test_the_tiny_hf_tokenizer_would_drop_a_capital_and_says_so(monkeypatch):
    pytest.importorskip("transformers")
    from grpo_lab.policies.hf import load_hf_policy
    tiny = load_hf_policy("data/hf_tiny")
    assert tiny.unknown_chars("What is 5 times two?") == ["W"]            # dropped, silently
    assert tiny.unknown_chars("what is 5 times two?") == []
    monkeypatch.delitem(TASKS, "times_words", raising=False)
    register_task("times_words", _times_words, "0123456789", 2, alphabet=None,
                  answer_kind="number")
    cfg = preset("hf_tiny_cpu", task="times_words", answer_format="number", eval_size=0)
    draw = lambda rng, n: [render(_times_words(rng), "number") for _ in range(n)]  # noqa: E731
    with pytest.warns(UnreadableText, match=r"task 'times_words': prompt 'What is \d times "
                                            r"two\? Answer with the number only.' has character "
                                            r"'A', .*\['A', 'W'\].*data/hf_tiny.* drops it"):
        check_readable(tiny, cfg, {}, draw)
    load_plugins(PLUGIN)                               # its lower-case "plain" format
    asked = render(Example("what is 2 times two?", "4", "times_words"), "plain")
    ok = lambda rng, n: [asked] * n                                       # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_readable(tiny, cfg, {}, ok)              # nothing dropped: silent


def test_a_grouper_sees_the_raw_prompt_and_fields_beside_the_rendered_one():
    exs = [Example(f"{a}+{b}=", str(a + b), "addition", fields={"a": a, "b": b})
           for a, b in ((7, 74), (15, 5), (3, 4), (20, 30))]
    shown = [render(e, "boxed") for e in exs]
    b = PromptBatch([e.prompt for e in shown], [e.task for e in shown], examples=shown)
    assert b.prompts[0] == "What is 7 + 74? Put the final answer in \\boxed{}."
    assert b.raw_prompts == ["7+74=", "15+5=", "3+4=", "20+30="]
    assert b.fields[1] == {"a": 15, "b": 5}
    toy = PromptBatch(["7+74="])                       # built from text alone: raw = prompts
    assert toy.raw_prompts == ["7+74="] and toy.fields == [{}]
    with pytest.raises(ValueError, match="3 examples for 4 prompts"):
        PromptBatch(b.prompts, examples=shown[:3])


def test_a_grouper_that_falls_back_to_by_prompt_is_warned_once():
    @register_grouper("carry_on_text", takes_k=True)
    def carry_on_text(batch, k, seed=0):
        """pools prompts by carry, read from toy text; anything else gets its own group"""
        ids = []
        for i, p in enumerate(batch.prompts):
            if p.endswith("=") and "+" in p:
                a, b = p[:-1].split("+")
                ids.append(int(int(a) % 10 + int(b) % 10 >= 10))
            else:
                ids.append(2 + i)
        return np.array(ids)
    exs = [render(Example(f"{a}+{b}=", str(a + b), "addition", fields={"a": a, "b": b}), "tags")
           for a, b in ((7, 74), (15, 5), (3, 4), (20, 30))]
    g = StepGrouper("carry_on_text", 2)
    args = ([e.prompt for e in exs], ["addition"] * 4, torch.zeros(8),
            torch.arange(4).repeat_interleave(2))
    with pytest.warns(GroupingFallback, match=r"'carry_on_text' put each of the 4 prompts in "
                                              r"its own group at step 0, though k=2.*raw_prompts"):
        g(*args, 0, examples=exs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # once per run, not every step
        g(*args, 1, examples=exs)
        ids = g([e.raw_prompt for e in exs], *args[1:], 2, examples=exs)   # the toy's text
    assert ids.tolist() == [1, 1, 0, 0]                # 7+74 and 15+5 carry


def test_instruct_plugin_trains_on_the_tiny_hf_model_through_the_cli(tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "run"
    code = main(["train", "--preset", "hf_tiny_cpu", "--plugin", PLUGIN, "--task", "times",
                 "--answer_format", "plain", "--grouping", "by_size", "--group.k", "2",
                 "--reward_weights", "accuracy=1,format=0.2,shows_work=0.1",
                 "--max_new_tokens", "8", "--steps", "2", "--prompts_per_step", "4",
                 "--group_size", "4", "--eval_size", "10", "--eval_every", "0",
                 "--threads", "1", "--time_budget_s", "0", "--out_dir", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [-1, 0, 1]
    assert {"reward/shows_work", "reward/format", "eval/format"} <= set(rows[-1])
    assert all(r["group/size_mean"] == 4 * 4 / 2 for r in rows[1:])     # 2 groups of 2 prompts
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert samples[0]["samples"][0]["prompt"].endswith("? reply with the number.")
    load_plugins(PLUGIN)
    held = TASKS["times"].eval_fn()
    assert len(held) == 100 and held == TASKS["times"].eval_fn()          # seeded, the same
    assert is_correct("7 x 8 = 56", True, "plain", "times", "56")
    assert not is_correct("56 = 7 x 9", True, "plain", "times", "56")     # after the last "="
