"""The tasks' data files: held-out sets (``data/eval_<task>.jsonl``, or a task's own
``eval_file`` / ``eval_fn``, each row checked against its task: tasks.check_held_out), the one
place the held-out prompts are put together (``held_out``, ``held_out_prompts``: training never
draws them), and the grouping lab's task mixture (``data/mixture.jsonl``). JSONL rows: prompt,
answer, task.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Sequence

from grpo_lab.paths import DATA_DIR, resolve_path
from grpo_lab.tasks import (MIXTURE_TASKS, TASKS, Example, check_held_out,  # noqa: F401
                            distinct_examples, get_task, read_rows)


def eval_path(task: str) -> Path:
    """The held-out file of ``task``: its ``eval_file`` when registered with one (a plugin
    task's own file, resolved from the repository like every config path), else the shipped
    data/eval_<task>.jsonl (which exists for the built-in tasks only)."""
    t = TASKS.get(task)
    if t is not None and t.eval_file:
        return resolve_path(t.eval_file)
    return DATA_DIR / f"eval_{task}.jsonl"


def load_jsonl(path: str | Path) -> list[Example]:
    """Examples from a JSONL file with ``prompt``, ``answer`` and ``task`` fields."""
    return [ex for _, ex in read_rows(path)]


def has_eval(task: str) -> bool:
    t = get_task(task)
    return bool(t.eval_file or t.eval_fn or eval_path(t.name).exists())


def load_eval(task: str) -> list[Example]:
    """The task's held-out examples: its ``eval_file``, its ``eval_fn()``, or the shipped
    data/eval_<task>.jsonl."""
    t = get_task(task)
    if t.eval_file:
        return check_held_out(t, read_rows(resolve_path(t.eval_file)))
    if t.eval_fn is not None:
        out = list(t.eval_fn())
        if not out:
            raise ValueError(f"task {task!r}: eval_fn() returned no examples")
        for i, ex in enumerate(out):
            if not isinstance(ex, Example):
                raise ValueError(f"task {task!r}: eval_fn() item {i} is {ex!r}, not an Example")
        return check_held_out(t, [(f"task {task!r}: eval_fn() item {i}", ex)
                                  for i, ex in enumerate(out)])
    if not eval_path(t.name).exists():
        raise ValueError(f"task {task!r} has no held-out set: register it with eval_file=... "
                         f"or eval_fn=..., or train with eval_size=0 (no evaluation)")
    return check_held_out(t, read_rows(eval_path(t.name)))


def write_eval_sets(n: int = 200, seed: int = 1234) -> None:
    """Rebuild ``data/eval_<task>.jsonl`` for the shipped tasks (made with the defaults)."""
    for name in MIXTURE_TASKS:
        examples = distinct_examples(TASKS[name].make, n, random.Random(f"{seed}-{name}"))
        lines = [json.dumps({"prompt": e.prompt, "answer": e.answer, "task": e.task})
                 for e in examples]
        eval_path(name).write_text("\n".join(lines) + "\n")


def held_out(task_names: Sequence[str], required: bool = False) -> dict[str, list[Example]]:
    """The held-out sets of ``task_names`` (task -> examples): the one place they are put
    together. Tasks without one are skipped, unless ``required`` (evaluation), which raises."""
    return {t: load_eval(t) for t in task_names if required or has_eval(t)}


def held_out_prompts(task_names: Sequence[str]) -> set[str]:
    """Every held-out prompt of ``task_names``: what training prompts must never be."""
    return {e.prompt for exs in held_out(task_names).values() for e in exs}


def mixture_path() -> Path:
    return DATA_DIR / "mixture.jsonl"


def write_mixture(path: str | Path | None = None, n: int = 350,
                  tasks: Sequence[str] = MIXTURE_TASKS, seed: int = 2024) -> list[Example]:
    """Write a seeded mixture of ``n`` distinct prompts, balanced over ``tasks``, as JSONL.

    Each line carries its ``task`` label, so grouping can be scored against the families
    (cluster purity). Prompts of the held-out eval sets (``data/eval_<task>.jsonl``, where
    present) are left out. Rows are shuffled; the shipped ``data/mixture.jsonl`` is the default.
    """
    if len(tasks) < 1:
        raise ValueError("tasks is empty")
    if n < len(tasks):
        raise ValueError(f"n={n} is smaller than the number of tasks ({len(tasks)})")
    rng = random.Random(f"mixture-{seed}")
    rows: list[Example] = []
    seen = {e.prompt for t in tasks if eval_path(get_task(t).name).exists() for e in load_eval(t)}
    for i, name in enumerate(tasks):
        quota = n // len(tasks) + (i < n % len(tasks))
        task, tries = get_task(name), 0
        while quota:
            tries += 1
            if tries > 1000 * n:
                raise RuntimeError(f"task {name!r} ran out of distinct prompts")
            ex = task.make(rng)
            if ex.prompt not in seen:
                seen.add(ex.prompt)
                rows.append(ex)
                quota -= 1
    rng.shuffle(rows)
    path = Path(path) if path is not None else mixture_path()
    path.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer, "task": e.task})
                            + "\n" for e in rows))
    return rows


def load_mixture(path: str | Path | None = None) -> list[Example]:
    """The task mixture (default ``data/mixture.jsonl``) as examples with task labels."""
    return load_jsonl(path if path is not None else mixture_path())
