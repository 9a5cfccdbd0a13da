"""The task families added for the grouping lab, and the seeded task mixture."""
import json
import random

import pytest

from grpo_lab.tasks import ALPHABET, MIXTURE_TASKS, TASKS, Example, encode
from grpo_lab.tasks.rewards import accuracy_reward, format_reward
from grpo_lab.tasks.task_data import load_mixture, mixture_path, write_mixture

NEW = ["count", "compare", "max", "min"]


def solve(prompt: str) -> str:
    """An independent solver for the new families, written from the prompt format."""
    head, body = prompt[:-1].split(":", 1)
    if head == "count":
        letter, word = body.split(",")
        return str(sum(ch == letter for ch in word))
    if head == "cmp":
        a, b = (int(x) for x in body.split(","))
        return "<" if a < b else ">" if a > b else "="
    xs = [int(x) for x in body.split(",")]
    return str({"max": max, "min": min}[head](xs))


@pytest.mark.parametrize("name", NEW)
def test_new_task_examples_are_well_formed_and_right(name):
    task, rng = TASKS[name], random.Random(0)
    for _ in range(500):
        ex = task.make(rng)
        assert ex.task == name
        assert ex.prompt.endswith("=") and len(ex.prompt) <= 16, ex.prompt
        assert all(c in ALPHABET for c in ex.prompt + ex.answer), ex
        encode(ex.prompt)
        assert 1 <= len(ex.answer) <= min(6, task.max_answer_len), ex
        assert set(ex.answer) <= set(task.answer_chars), ex
        assert ex.answer == solve(ex.prompt), ex


def test_compare_draws_all_three_answers():
    rng = random.Random(1)
    answers = [TASKS["compare"].make(rng).answer for _ in range(400)]
    assert {a: answers.count(a) > 20 for a in "<>="} == {"<": True, ">": True, "=": True}


def test_rewards_know_the_new_tasks():
    ex = [Example("cmp:37,52=", "<", "compare", answer_chars=TASKS["compare"].answer_chars),
          Example("count:a,banana=", "3", "count", answer_chars=TASKS["count"].answer_chars)]
    assert accuracy_reward(["<", "2"], ex, [True, True]) == [1.0, 0.0]
    assert format_reward(["<", "<"], ex, [True, True]) == [1.0, 0.0]   # "<" is not a digit
    assert solve("count:a,banana=") == "3" and solve("min:40,7,93=") == "7"


def test_write_mixture_is_seeded_balanced_and_distinct(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rows = write_mixture(a, n=103, seed=5)
    write_mixture(b, n=103, seed=5)
    assert a.read_bytes() == b.read_bytes()
    write_mixture(b, n=103, seed=6)
    assert a.read_bytes() != b.read_bytes()
    counts = {t: sum(r.task == t for r in rows) for t in MIXTURE_TASKS}
    assert len(counts) >= 5 and sum(counts.values()) == 103
    assert max(counts.values()) - min(counts.values()) <= 1
    assert len({r.prompt for r in rows}) == 103
    assert load_mixture(a) == rows
    assert json.loads(a.read_text().splitlines()[0]).keys() == {"prompt", "answer", "task"}


def test_shipped_mixture_is_the_default_regenerated(tmp_path):
    shipped = load_mixture()
    assert len(shipped) >= 200 and len({e.task for e in shipped}) >= 5
    regenerated = write_mixture(tmp_path / "m.jsonl")
    assert regenerated == shipped, f"{mixture_path()} is stale: rerun task_data.write_mixture()"


def test_write_mixture_bad_input(tmp_path):
    with pytest.raises(ValueError, match="n=3"):
        write_mixture(tmp_path / "m.jsonl", n=3)
    with pytest.raises(ValueError, match="'nope'"):
        write_mixture(tmp_path / "m.jsonl", n=20, tasks=("addition", "nope"))


def test_mixture_and_eval_sets_for_new_tasks_are_disjoint():
    from grpo_lab.tasks.task_data import load_eval
    held = {e.prompt for t in MIXTURE_TASKS for e in load_eval(t)}
    assert len(held) == 200 * len(MIXTURE_TASKS)
    assert not held & {e.prompt for e in load_mixture()}
    for name in NEW:
        assert all(e.answer == solve(e.prompt) for e in load_eval(name))
