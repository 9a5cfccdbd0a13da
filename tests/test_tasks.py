"""Tasks, tokenizer and rewards: hand-worked values and clear errors."""
import random

import pytest

from grpo_lab import tasks
from grpo_lab.tasks.rewards import REWARDS, resolve_rewards, weighted_reward
from grpo_lab.tasks import Example, decode, encode, get_task, sample_examples
from grpo_lab.tasks.task_data import load_eval, load_jsonl

EX = [Example("12+34=", "46", "addition", answer_chars="0123456789")] * 4


def test_tokenizer_round_trip_and_errors():
    assert decode(encode("sort:3142=") + [tasks.EOS, 5, 6]) == "sort:3142="
    with pytest.raises(ValueError, match=r"outside the tokenizer's alphabet: \['A', '_'\]"):
        encode("A_1")


def test_rewards_by_hand():
    comps = ["46", "47", "4", "x6"]
    stopped = [True, True, True, False]
    assert REWARDS["accuracy"](comps, EX, stopped) == [1.0, 0.0, 0.0, 0.0]
    # partial: matches at aligned positions / max(len) -> 2/2, 1/2, 1/2, 1/2
    assert REWARDS["partial"](comps, EX, stopped) == [1.0, 0.5, 0.5, 0.5]
    # format: stopped and only digits -> 1, 1, 1, 0 (not stopped and a letter)
    assert REWARDS["format"](comps, EX, stopped) == [1.0, 1.0, 1.0, 0.0]
    weights = {"accuracy": 1.0, "partial": 0.5, "format": 0.1}
    total, parts = weighted_reward(comps, EX, resolve_rewards(weights), stopped)
    assert total.tolist() == pytest.approx([1.6, 0.35, 0.35, 0.25])
    assert set(parts) == {"accuracy", "partial", "format"}


def test_examples_carry_their_tasks_answer_chars():
    # drawn (Task.draw, sample_examples) and held out (check_held_out): the task's alphabet,
    # which the format reward reads; an example built without it is refused by name
    rng = random.Random(0)
    assert get_task("compare").draw(rng).answer_chars == "<>="
    drawn = sample_examples([get_task("reverse"), get_task("sort")], 20, rng)
    assert {e.answer_chars for e in drawn} == {"abcdefghijklmnopqrstuvwxyz", "0123456789"}
    assert {e.answer_chars for e in load_eval("addition")} == {"0123456789"}
    assert REWARDS["format"](["<"], [get_task("compare").draw(rng)], [True]) == [1.0]
    with pytest.raises(ValueError, match=r"'addition' example '12\+34=' has no answer_chars "
                                         r"\(Task.draw sets them\)"):
        REWARDS["format"](["46"], [Example("12+34=", "46", "addition")], [True])


def test_accuracy_needs_the_stop():
    assert REWARDS["accuracy"](["46"], EX[:1], [False]) == [0.0]


def test_non_finite_reward_names_function_and_sample(monkeypatch):
    monkeypatch.setitem(REWARDS, "broken", lambda c, e, s: [0.0, float("nan"), 1.0, 1.0])
    with pytest.raises(ValueError, match=r"reward function 'broken' returned nan for sample 1 "
                                         r"\(completion '47'\)"):
        weighted_reward(["46", "47", "4", "5"], EX, resolve_rewards({"broken": 1.0}))
    with pytest.raises(ValueError, match=r"unknown reward function 'speed'; known: "
                                         r"\[.*'accuracy', .*'partial'.*\]"):
        weighted_reward(["46"], EX[:1], resolve_rewards({"speed": 1.0}))
    with pytest.raises(ValueError, match="2 completions, 4 examples and 2 stopped flags"):
        weighted_reward(["46", "4"], EX, resolve_rewards({"accuracy": 1.0}))


def test_eval_sets_are_held_out_and_answers_right():
    for name in tasks.MIXTURE_TASKS:                                       # the shipped tasks
        exs = load_eval(name)
        assert len(exs) == 200 and len({e.prompt for e in exs}) == 200
        assert all(e.task == name for e in exs)
    for e in load_eval("addition"):
        a, b = e.prompt[:-1].split("+")
        assert int(e.answer) == int(a) + int(b)
    held = {e.prompt for e in load_eval("addition")}
    drawn = sample_examples([get_task("addition")], 500, random.Random(0), held)
    assert not held & {e.prompt for e in drawn}


def test_bad_task_and_data(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'division'"):
        sample_examples([get_task("division")], 3, random.Random(0))
    with pytest.raises(ValueError, match="must be positive, got 0"):
        sample_examples([get_task("addition")], 0, random.Random(0))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2", "task": "addition"}\n{"prompt": "2+2="}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_jsonl(bad)


def test_distinct_examples_keeps_first_draws_and_refuses_an_impossible_n():
    from grpo_lab.tasks import distinct_examples
    make = lambda rng: Example(f"{rng.randrange(3)}=", "0", "t")      # only 3 distinct prompts
    got = distinct_examples(make, 3, random.Random(0))
    assert sorted(e.prompt for e in got) == ["0=", "1=", "2="]
    assert [e.prompt for e in got] == [e.prompt for e in distinct_examples(make, 3, random.Random(0))]
    with pytest.raises(ValueError, match="n=4 distinct prompts; 3 found in 400 draws"):
        distinct_examples(make, 4, random.Random(0))
