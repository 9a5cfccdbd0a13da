"""Verifiable tasks: families of prompts with checkable answers (the char tokenizer: tokenizer.py).

A task makes prompts with known answers, so a reward is a plain function of the
completion text: no learned reward model (DeepSeekMath sec. 4 uses rule-based
rewards the same way). Every task has the form ``"<prompt>="`` -> ``"<answer><eos>"``:

  * ``addition``: "12+34=" -> "46" (operands 0-99)
  * ``sort``:     "sort:3102=" -> "0123" (3-6 digits)
  * ``reverse``:  "rev:abc=" -> "cba" (3-6 letters)
  * ``count``:    "count:a,banana=" -> "3" (how often the letter occurs; 0 allowed)
  * ``compare``:  "cmp:37,52=" -> "<" (one prompt in eight compares a number with itself)
  * ``max``, ``min``: "max:12,7,40=" -> "40" (2-4 numbers 0-99)
The last four and the first three form the grouping lab's mixture (``MIXTURE_TASKS``).

Rewards are rewards.py; held-out sets and the task mixture (data files) task_data.py.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Callable, Sequence

from grpo_lab.paths import resolve_path
from grpo_lab.registry import check_new, lookup
from grpo_lab.tokenizer import (ALPHABET, EOS, ITOS, PAD, STOI, VOCAB_SIZE,  # noqa: F401 (re-exported)
                                decode, encode)

@dataclass(frozen=True)
class Example:
    prompt: str   # e.g. "12+34="
    answer: str   # e.g. "46"
    task: str     # task name, e.g. "addition"
    fmt: str = ""  # "" the toy's exact format; else the answer format asked for (instruct.py)
    raw_prompt: str = ""  # the task's own prompt before instruct.render ("": ``prompt`` is it)
    fields: dict = field(default_factory=dict, compare=False, hash=False)
    """The task's own values behind the prompt (``{"a": 12, "b": 34}``): what ``make`` put
    there, for a grouper (grouping.PromptBatch.fields); {} when the task gives none."""
    answer_chars: str = field(default="", compare=False)  # Task.answer_chars: Task.draw sets it


@dataclass(frozen=True)
class Task:
    """A family of prompts with checkable answers.

    ``make(rng)`` draws one example; ``answer_chars`` is the alphabet a well-formed
    answer uses (the format reward checks it).
    """
    name: str
    make: Callable[[random.Random], Example]
    answer_chars: str
    max_answer_len: int
    eval_file: str | None = None
    """Held-out set (JSONL: prompt, answer, task); None: data/eval_<name>.jsonl if shipped."""
    eval_fn: Callable[[], list] | None = None
    """Or a function making the held-out examples (seeded, so the same list every call)."""
    description: str = ""
    alphabet: str | None = ALPHABET
    """What it needs from a tokenizer: the characters its prompts and answers are written in.
    The toy's ``ALPHABET`` (the default; prompts end with "="): the toy's format, which the toy
    char policy reads and instruct.QUESTIONS can ask in words. None: written in words for a
    subword tokenizer (an instruct task, trained on policy="hf" with an answer_format).
    Either way the run's policy is checked at setup to read every character (trainer.py)."""

    def draw(self, rng: random.Random) -> Example:
        """``make(rng)``'s example carrying this task's ``answer_chars`` (the format reward's)."""
        return replace(self.make(rng), answer_chars=self.answer_chars)


def in_words(name: str) -> bool:
    """The task is written in words (``alphabet`` None): no toy form, its prompt is the
    question an instruct model is asked. An unknown name is not (its lookup names it)."""
    return name in TASKS and TASKS[name].alphabet is None


def distinct_examples(make: Callable[[random.Random], Example], n: int,
                      rng: random.Random) -> list[Example]:
    """``n`` examples with distinct prompts drawn by ``make(rng)``, in the order first drawn
    (a seeded ``rng`` gives the same list on every call). A family with fewer than ``n``
    distinct prompts is an error after 100 * n draws, not an endless loop."""
    seen: dict[str, Example] = {}
    for _ in range(100 * n):
        if len(seen) == n:
            break
        ex = make(rng)
        seen.setdefault(ex.prompt, ex)
    if len(seen) < n:
        raise ValueError(f"asked for n={n} distinct prompts; {len(seen)} found in {100 * n} draws")
    return list(seen.values())


def _addition(rng: random.Random) -> Example:
    a, b = rng.randrange(100), rng.randrange(100)
    return Example(f"{a}+{b}=", str(a + b), "addition", fields={"a": a, "b": b})


def _sort_digits(rng: random.Random) -> Example:
    s = "".join(rng.choice("0123456789") for _ in range(rng.randint(3, 6)))
    return Example(f"sort:{s}=", "".join(sorted(s)), "sort")


def _reverse(rng: random.Random) -> Example:
    s = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 6)))
    return Example(f"rev:{s}=", s[::-1], "reverse")


# The grouping lab's families (grouping.py): prompts look alike within a family and differ
# across families, so a prompt embedder has structure to find. Each prompt fits in 16
# characters, each answer in 6, using only ``ALPHABET``.
def _count_letter(rng: random.Random) -> Example:
    # "count:a,banana=" -> "3": how often the letter occurs in the word (0 allowed).
    word = "".join(rng.choice("abcde") for _ in range(rng.randint(3, 6)))
    letter = rng.choice("abcde")
    return Example(f"count:{letter},{word}=", str(word.count(letter)), "count")


def _compare(rng: random.Random) -> Example:
    # "cmp:37,52=" -> "<"; about one prompt in eight compares a number with itself.
    a = rng.randrange(100)
    b = a if rng.random() < 0.125 else rng.randrange(100)
    return Example(f"cmp:{a},{b}=", "<" if a < b else ">" if a > b else "=", "compare")


def _number_list(rng: random.Random) -> list[int]:
    return [rng.randrange(100) for _ in range(rng.randint(2, 4))]   # "max:" + 11 + "=" <= 16


def _max(rng: random.Random) -> Example:
    xs = _number_list(rng)
    return Example(f"max:{','.join(map(str, xs))}=", str(max(xs)), "max")


def _min(rng: random.Random) -> Example:
    xs = _number_list(rng)
    return Example(f"min:{','.join(map(str, xs))}=", str(min(xs)), "min")


TASKS: dict[str, Task] = {
    "addition": Task("addition", _addition, "0123456789", 3),
    "sort": Task("sort", _sort_digits, "0123456789", 6),
    "reverse": Task("reverse", _reverse, "abcdefghijklmnopqrstuvwxyz", 6),
    "count": Task("count", _count_letter, "0123456789", 1),
    "compare": Task("compare", _compare, "<>=", 1),
    "max": Task("max", _max, "0123456789", 2),
    "min": Task("min", _min, "0123456789", 2),
}


def get_task(name: str) -> Task:
    return lookup(TASKS, name, "task", "register your own with tasks.register_task")


def register_task(name: str, make: Callable[[random.Random], Example], answer_chars: str,
                  max_answer_len: int, eval_file: str | None = None,
                  eval_fn: Callable[[], list] | None = None, description: str = "",
                  check: int = 200, alphabet: str | None = ALPHABET,
                  answer_kind=None) -> Task:
    """Add a task to ``TASKS`` -> its record. ``make(rng) -> Example(prompt, answer, name)``.

    ``alphabet`` says what the task needs from a tokenizer (``Task.alphabet``): the toy's
    ``ALPHABET`` by default, or None for a task written in words for an instruct model (the
    shipped word_problems and countdown register this way). Checked now, on ``check`` seeded
    draws, rather than at sampling time: each example names this task, its answer uses
    ``answer_chars`` and fits ``max_answer_len``; with an alphabet, every prompt and answer
    character is in it and prompts end with "=". Whether the run's policy reads the text is
    checked at setup, against that policy (trainer.check_readable). ``answer_kind``: how an
    instruct model's free-text answer is read and compared (``answers.AnswerKind``, or a name
    in ``answers.KINDS``: "number", "text"); needed for a task in words. The held-out set is
    ``eval_file`` (JSONL, checked now and at every load by ``check_held_out``) or
    ``eval_fn()`` (checked at every load); without either, training needs ``eval_size=0``
    (no evaluation).

    The held-out file is JSONL, one object per line with three strings, ``task`` being this
    task's ``name`` (not a field called "name")::

        {"prompt": "dbl:21=", "answer": "42", "task": "double"}

    Held out means held out: the trainer removes every prompt of the whole file (not only the
    ``eval_size`` it scores) from the training draws of ``make``, so make may produce them and
    training still never sees one. ``task_data.eval_path(name)`` gives the file."""
    from grpo_lab.tasks.answers import KINDS, AnswerKind, register_kind

    check_new(TASKS, "task", name, make, lambda t: t.make)
    if max_answer_len < 1:
        raise ValueError(f"task {name!r}: max_answer_len must be >= 1, got {max_answer_len}")
    if alphabet is not None and not (isinstance(alphabet, str) and alphabet):
        raise ValueError(f"task {name!r}: alphabet must be a non-empty string of characters "
                         f"or None (written in words), got {alphabet!r}")
    if isinstance(answer_kind, str):
        answer_kind = lookup(KINDS, answer_kind, "answer kind")
    if answer_kind is not None and not isinstance(answer_kind, AnswerKind):
        raise ValueError(f"task {name!r}: answer_kind must be an answers.AnswerKind or one of "
                         f"{sorted(KINDS)}, got {answer_kind!r}")
    if alphabet is None and answer_kind is None:
        raise ValueError(f"task {name!r} is written in words (alphabet=None): give it an "
                         f"answer_kind (one of {sorted(KINDS)} or an answers.AnswerKind), how "
                         f"an instruct model's answer is read from its text")
    for c in answer_chars if alphabet is not None else ():
        if c not in alphabet:
            raise ValueError(f"task {name!r}: answer character {c!r} is not in the task's "
                             f"alphabet {alphabet!r}")
    rng = random.Random(f"check-{name}")
    for _ in range(check):
        ex = make(rng)
        if not isinstance(ex, Example) or ex.task != name:
            raise ValueError(f"task {name!r}: make(rng) must return Example(prompt, answer, "
                             f"{name!r}), got {ex!r}")
        if not (isinstance(ex.prompt, str) and ex.prompt.strip()):
            raise ValueError(f"task {name!r}: make(rng) returned an empty prompt {ex.prompt!r}")
        for text, what in ((ex.prompt, "prompt"), (ex.answer, "answer")):
            bad = [c for c in text if alphabet is not None and c not in alphabet]
            if bad:
                raise ValueError(f"task {name!r}: {what} {text!r} has character {bad[0]!r}, "
                                 f"which is not in the task's alphabet {alphabet!r} (a task "
                                 f"written in words registers with alphabet=None)")
        if alphabet is not None and not ex.prompt.endswith("="):
            raise ValueError(f"task {name!r}: prompt {ex.prompt!r} must end with '=' (the "
                             f"toy's format; a task in words registers with alphabet=None)")
        if len(ex.answer) > max_answer_len or any(c not in answer_chars for c in ex.answer):
            raise ValueError(f"task {name!r}: answer {ex.answer!r} is longer than "
                             f"max_answer_len={max_answer_len} or uses characters outside "
                             f"answer_chars={answer_chars!r}")
    record = Task(name, make, answer_chars, max_answer_len, eval_file, eval_fn,
                  description or (make.__doc__ or "").strip().split("\n")[0], alphabet)
    if eval_file:                                  # checked now, and again at every load
        check_held_out(record, read_rows(resolve_path(eval_file)))
    TASKS[name] = record
    if answer_kind is not None:
        register_kind(name, answer_kind)
    return record


def sample_examples(tasks: Sequence[Task], n: int, rng: random.Random,
                    exclude: set[str] | None = None) -> list[Example]:
    """``n`` examples drawn uniformly over the task records ``tasks``, skipping ``exclude``."""
    if n <= 0:
        raise ValueError(f"number of examples must be positive, got {n}")
    if not tasks:
        raise ValueError("tasks is empty")
    draws = (rng.choice(tasks).draw(rng) for _ in range(100 * n + 1000))  # bounded: ``exclude``
    out = list(islice((ex for ex in draws if ex.prompt not in (exclude or ())), n))  # may hold all
    if len(out) < n:
        raise RuntimeError(f"could not draw {n} examples outside the excluded set")
    return out


# ---------------------------------------------------------------- a task's held-out rows
def read_rows(path: str | Path) -> list[tuple[str, Example]]:
    """[("path:line", Example)] from a JSONL file of objects with string ``prompt``,
    ``answer`` and ``task`` fields; an error names the line and what is wrong with it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no data file at {path}")
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e}): {line[:80]!r}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object with prompt, answer and task, got "
                             f"a JSON {type(row).__name__}: {line[:80]!r}")
        for key in ("prompt", "answer", "task"):
            if not isinstance(row.get(key), str):
                got = "no such field" if key not in row else f"{row[key]!r} ({type(row[key]).__name__})"
                raise ValueError(f"{where}: field {key!r} must be a string, got {got}")
        out.append((where, Example(row["prompt"], row["answer"], row["task"])))
    if not out:
        raise ValueError(f"{path} holds no examples")
    return out


def check_held_out(task: Task, rows: list[tuple[str, Example]]) -> list[Example]:
    """The examples of ``rows`` [(where, Example)] with the task's ``answer_chars``, if each
    fits ``task`` -> else an error naming the row: it names the task, its answer fits
    max_answer_len (a longer one is never produced: the sampler stops at max_answer_len + 2
    tokens, so it scores 0, silently) and, for a task with an alphabet (``Task.alphabet``: the
    toy's format), its prompt ends with "=" and its prompt and answer use that alphabet."""
    alphabet = task.alphabet
    for where, ex in rows:
        if ex.task != task.name:
            raise ValueError(f"{where}: held-out example of task {ex.task!r} in the set of "
                             f"task {task.name!r}")
        if not 1 <= len(ex.answer) <= task.max_answer_len:
            raise ValueError(f"{where}: answer {ex.answer!r} has {len(ex.answer)} characters; "
                             f"task {task.name!r} has max_answer_len={task.max_answer_len}")
        if alphabet is None:
            continue
        if not ex.prompt.endswith("="):
            raise ValueError(f"{where}: prompt {ex.prompt!r} must end with '='")
        for text, what in ((ex.prompt, "prompt"), (ex.answer, "answer")):
            bad = sorted({c for c in text if c not in alphabet})
            if bad:
                raise ValueError(f"{where}: {what} {text!r} has characters {bad} outside the "
                                 f"task's alphabet {alphabet!r}")
    return [replace(ex, answer_chars=task.answer_chars) for _, ex in rows]


# the grouping lab's families (task_data.write_mixture, config's task="mixture")
MIXTURE_TASKS = ("addition", "sort", "reverse", "count", "compare", "max", "min")
