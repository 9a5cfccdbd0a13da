"""Samples you can read: each evaluation's first prompts with their completions and rewards.

With a real model the first thing to look at is what it writes. Every evaluation (the base
before training, then every ``eval_every`` steps and at the end) appends one line to
``out_dir/samples.jsonl``:

    {"step": -1, "samples": [{"task", "prompt", "completion", "answer", "reward",
                              "accuracy", "format", "reward/<name>", ..., "stopped"}, ...]}

``reward`` is the weighted sum of the ``reward/<name>`` parts, one for every reward function
in reward_weights, a plugin's included (flat keys, so a tracker's table shows them as
columns); ``accuracy`` and ``format`` are read whatever their weights.

The same held-out prompts each time (the first ``PER_TASK`` of each task's set), greedy, so
lines compare the policy with itself; the report shows the first and the last (``markdown``).
"""
from __future__ import annotations

import json
from pathlib import Path

from grpo_lab.rundir import write_lines_atomic

FILE = "samples.jsonl"
PER_TASK = 4


def rows(scored, accuracy, fmt=None, k: int = PER_TASK) -> list[dict]:
    """The first ``k`` prompts of a greedy evaluation (``rollout.Scored``, one completion per
    prompt) -> sample dicts."""
    return [{"task": ex.task, "prompt": ex.prompt, "completion": scored.texts[i],
             "answer": ex.answer, "reward": round(float(scored.rewards[i]), 4),
             "accuracy": float(accuracy[i]),
             **({"format": float(fmt[i])} if fmt is not None else {}),
             **{f"reward/{name}": round(float(v[i]), 4) for name, v in scored.parts.items()},
             "stopped": bool(scored.rollout.stopped[i])}
            for i, ex in enumerate(scored.examples[:min(k, len(scored.texts))])]


def append(out_dir: str | Path, step: int, samples: list[dict]) -> None:
    with open(Path(out_dir) / FILE, "a") as f:
        f.write(json.dumps({"step": step, "samples": samples}) + "\n")


def keep_through(out_dir: str | Path, step: int) -> None:
    """Drop the lines of steps after ``step`` (a run resumed from that step's checkpoint
    evaluates them again; a line cut by a kill goes too)."""
    path = Path(out_dir) / FILE
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError):
            break
    write_lines_atomic(path, kept)


def read(out_dir: str | Path) -> list[dict]:
    """The file's lines as dicts. A last line cut by a kill is left out (``keep_through``
    drops it when the run resumes); any other line that is not JSON is an error naming it."""
    path = Path(out_dir) / FILE
    if not path.exists():
        return []
    lines, out = path.read_text().splitlines(), []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if any(rest.strip() for rest in lines[i:]):
                raise ValueError(f"{path}:{i} is not JSON ({e}): {line[:80]!r}") from None
    return out


def _cell(text: str, n: int = 160) -> str:
    text = text if len(text) <= n else text[:n - 3] + "..."
    return text.replace("|", "\\|").replace("\n", " ⏎ ")


def markdown(evals: list[dict]) -> list[str]:
    """Report lines: the first and the last evaluation's samples side by side."""
    if not evals:
        return []
    first, last = evals[0], evals[-1]
    lines = ["## Samples (greedy, held-out)", "",
             f"| prompt | answer | step {first['step']} | step {last['step']} |",
             "|---|---|---|---|"]
    for a, b in zip(first["samples"], last["samples"]):
        mark = lambda s: f"{'✓' if s['accuracy'] else '✗'}{'' if s['stopped'] else ' (cut)'}"  # noqa: E731
        lines.append(f"| {_cell(a['prompt'], 90)} | {_cell(a['answer'])} | "
                     f"{mark(a)} {_cell(a['completion'])} | {mark(b)} {_cell(b['completion'])} |")
    return lines + [""]
