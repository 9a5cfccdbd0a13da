"""Verifiable tasks, their reward functions and the char tokenizer they share.

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

Rewards (each returns floats in [0, 1], one per completion):
  * ``accuracy``: 1 if the completion equals the answer exactly.
  * ``partial``:  fraction of answer characters right at their position, divided by the
                   longer of the two lengths (so padding an answer with junk costs credit).
  * ``format``:   1 if the completion stopped (emitted <eos>) and uses only the task's
                   answer alphabet.
They are combined by ``weighted_reward`` with weights from the config; add your own by
putting a function of the same signature into ``REWARDS``. An example rendered for an
instruct model (``Example.fmt`` set, instruct.py) is scored the instruct way instead
(answers.py): accuracy reads the answer whatever wraps it, partial compares that answer,
format checks the requested answer format.
"""
from __future__ import annotations

import json
import math
import numbers
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from grpo_lab.answers import extract, follows_format, is_correct, kind_of

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

# ---------------------------------------------------------------- tokenizer
PAD, EOS = 0, 1
ALPHABET = " 0123456789+-*=<>:,.?abcdefghijklmnopqrstuvwxyz"
ITOS = ["<pad>", "<eos>"] + list(ALPHABET)
STOI = {c: i for i, c in enumerate(ITOS) if i >= 2}
VOCAB_SIZE = len(ITOS)


def encode(text: str) -> list[int]:
    """Characters to token ids; raises on a character outside ``ALPHABET``."""
    bad = sorted({c for c in text if c not in STOI})
    if bad:
        raise ValueError(f"text {text!r} has characters outside the tokenizer's alphabet: {bad}")
    return [STOI[c] for c in text]


def decode(ids: Sequence[int]) -> str:
    """Token ids to text, stopping at the first <eos> and skipping <pad>."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS:
            break
        if i != PAD:
            out.append(ITOS[i])
    return "".join(out)


# ---------------------------------------------------------------- tasks
@dataclass(frozen=True)
class Example:
    prompt: str   # e.g. "12+34="
    answer: str   # e.g. "46"
    task: str     # task name, e.g. "addition"
    fmt: str = ""  # "" the toy's exact format; else the answer format asked for (instruct.py)


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


def _addition(rng: random.Random) -> Example:
    a, b = rng.randrange(100), rng.randrange(100)
    return Example(f"{a}+{b}=", str(a + b), "addition")


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
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)} (register your "
                         f"own with tasks.register_task)")
    return TASKS[name]


def register_task(name: str, make: Callable[[random.Random], Example], answer_chars: str,
                  max_answer_len: int, eval_file: str | None = None,
                  eval_fn: Callable[[], list] | None = None, description: str = "",
                  check: int = 200) -> Task:
    """Add a task to ``TASKS`` -> its record. ``make(rng) -> Example(prompt, answer, name)``.

    Checked now, on ``check`` seeded draws, rather than at sampling time: every prompt and
    answer character is in the tokenizer's ``ALPHABET``, prompts end with "=", answers use
    ``answer_chars`` and fit ``max_answer_len``, each example names this task. The held-out
    set is ``eval_file`` (JSONL, checked now and at every load by ``check_held_out``) or
    ``eval_fn()`` (checked at every load); without either, training needs ``eval_size=0``
    (no evaluation).

    The held-out file is JSONL, one object per line with three strings, ``task`` being this
    task's ``name`` (not a field called "name")::

        {"prompt": "dbl:21=", "answer": "42", "task": "double"}

    Held out means held out: the trainer removes every prompt of the whole file (not only the
    ``eval_size`` it scores) from the training draws of ``make``, so make may produce them and
    training still never sees one. ``tasks.eval_path(name)`` gives the file."""
    from grpo_lab.registry import check_new
    check_new(TASKS, "task", name, make, lambda t: t.make)
    if max_answer_len < 1:
        raise ValueError(f"task {name!r}: max_answer_len must be >= 1, got {max_answer_len}")
    for c in answer_chars:
        if c not in STOI:
            raise ValueError(f"task {name!r}: answer character {c!r} is not in the alphabet "
                             f"{ALPHABET!r}")
    rng = random.Random(f"check-{name}")
    for _ in range(check):
        ex = make(rng)
        if not isinstance(ex, Example) or ex.task != name:
            raise ValueError(f"task {name!r}: make(rng) must return Example(prompt, answer, "
                             f"{name!r}), got {ex!r}")
        for text, what in ((ex.prompt, "prompt"), (ex.answer, "answer")):
            bad = [c for c in text if c not in STOI]
            if bad:
                raise ValueError(f"task {name!r}: {what} {text!r} has character {bad[0]!r}, "
                                 f"which is not in the alphabet {ALPHABET!r}")
        if not ex.prompt.endswith("="):
            raise ValueError(f"task {name!r}: prompt {ex.prompt!r} must end with '='")
        if len(ex.answer) > max_answer_len or any(c not in answer_chars for c in ex.answer):
            raise ValueError(f"task {name!r}: answer {ex.answer!r} is longer than "
                             f"max_answer_len={max_answer_len} or uses characters outside "
                             f"answer_chars={answer_chars!r}")
    record = Task(name, make, answer_chars, max_answer_len, eval_file, eval_fn,
                  description or (make.__doc__ or "").strip().split("\n")[0])
    if eval_file:                                  # checked now, and again at every load
        from grpo_lab.checkpoint import resolve_path
        check_held_out(record, read_rows(resolve_path(eval_file)))
    TASKS[name] = record
    return record


def register_reward(name: str, fn=None):
    """Add a reward ``(completions, examples, stopped) -> list of floats`` to ``REWARDS``
    (use it with ``reward_weights={name: w}``); as a decorator too. Values are checked
    finite at every call (``weighted_reward``)."""
    from grpo_lab.registry import check_new
    if fn is None:
        return lambda f: (register_reward(name, f), f)[1]
    check_new(REWARDS, "reward", name, fn)
    REWARDS[name] = fn
    return fn


def sample_examples(task_names: Sequence[str], n: int, rng: random.Random,
                    exclude: set[str] | None = None) -> list[Example]:
    """``n`` examples drawn uniformly over ``task_names``, skipping prompts in ``exclude``."""
    if n <= 0:
        raise ValueError(f"number of examples must be positive, got {n}")
    if not task_names:
        raise ValueError("task_names is empty")
    tasks = [get_task(t) for t in task_names]
    out: list[Example] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise RuntimeError(f"could not draw {n} examples outside the excluded set")
        ex = rng.choice(tasks).make(rng)
        if exclude and ex.prompt in exclude:
            continue
        out.append(ex)
    return out


# ---------------------------------------------------------------- held-out data
def eval_path(task: str) -> Path:
    """The held-out file of ``task``: its ``eval_file`` when registered with one (a plugin
    task's own file, resolved from the repository like every config path), else the shipped
    data/eval_<task>.jsonl (which exists for the built-in tasks only)."""
    t = TASKS.get(task)
    if t is not None and t.eval_file:
        from grpo_lab.checkpoint import resolve_path
        return resolve_path(t.eval_file)
    return DATA_DIR / f"eval_{task}.jsonl"


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


def load_jsonl(path: str | Path) -> list[Example]:
    """Examples from a JSONL file with ``prompt``, ``answer`` and ``task`` fields."""
    return [ex for _, ex in read_rows(path)]


def check_held_out(task: Task, rows: list[tuple[str, Example]]) -> list[Example]:
    """The examples of ``rows`` [(where, Example)] if each fits ``task`` -> else an error
    naming the row: it names the task, its answer fits max_answer_len (a longer answer can
    never be produced: the sampler stops at max_answer_len + 2 tokens, so it scores 0,
    silently) and, for a task in the toy's format (its own examples are: every task made by
    ``register_task``; not the instruct-only families written in words), its prompt ends
    with "=" and its prompt and answer use the tokenizer's ALPHABET."""
    probe = task.make(random.Random("check-format"))
    toy = probe.prompt.endswith("=") and all(c in STOI for c in probe.prompt + probe.answer)
    for where, ex in rows:
        if ex.task != task.name:
            raise ValueError(f"{where}: held-out example of task {ex.task!r} in the set of "
                             f"task {task.name!r}")
        if not 1 <= len(ex.answer) <= task.max_answer_len:
            raise ValueError(f"{where}: answer {ex.answer!r} has {len(ex.answer)} characters; "
                             f"task {task.name!r} has max_answer_len={task.max_answer_len}")
        if not toy:
            continue
        if not ex.prompt.endswith("="):
            raise ValueError(f"{where}: prompt {ex.prompt!r} must end with '='")
        for text, what in ((ex.prompt, "prompt"), (ex.answer, "answer")):
            bad = sorted({c for c in text if c not in STOI})
            if bad:
                raise ValueError(f"{where}: {what} {text!r} has characters {bad} outside the "
                                 f"tokenizer's alphabet {ALPHABET!r}")
    return [ex for _, ex in rows]


def has_eval(task: str) -> bool:
    t = get_task(task)
    return bool(t.eval_file or t.eval_fn or eval_path(t.name).exists())


def load_eval(task: str) -> list[Example]:
    """The task's held-out examples: its ``eval_file``, its ``eval_fn()``, or the shipped
    data/eval_<task>.jsonl."""
    from grpo_lab.checkpoint import resolve_path
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
        rng = random.Random(f"{seed}-{name}")
        seen: dict[str, Example] = {}
        while len(seen) < n:
            ex = TASKS[name].make(rng)
            seen.setdefault(ex.prompt, ex)
        lines = [json.dumps({"prompt": e.prompt, "answer": e.answer, "task": e.task})
                 for e in seen.values()]
        eval_path(name).write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- rewards
# Every reward function has one signature: (completions, examples, stopped) -> list[float],
# where ``stopped[i]`` says whether completion i emitted <eos> before the length limit.
# ``weighted_reward`` turns the lists into float32 tensors and checks every value.
def check_batch(completions: Sequence, examples: Sequence, stopped: Sequence) -> None:
    """Raise ValueError unless completions, examples and stopped have one length
    (``zip`` would silently drop the tail of the longer ones)."""
    if not len(completions) == len(examples) == len(stopped):
        raise ValueError(f"{len(completions)} completions, {len(examples)} examples and "
                         f"{len(stopped)} stopped flags: need one of each per completion")


def accuracy_reward(completions: Sequence[str], examples: Sequence[Example],
                    stopped: Sequence[bool]) -> list[float]:
    check_batch(completions, examples, stopped)
    return [float(s and c == ex.answer) if not ex.fmt else   # instruct: answers.py
            float(is_correct(c, s, ex.fmt, ex.task, ex.answer))
            for c, ex, s in zip(completions, examples, stopped)]


def partial_reward(completions: Sequence[str], examples: Sequence[Example],
                   stopped: Sequence[bool]) -> list[float]:
    check_batch(completions, examples, stopped)
    out = []
    for c, ex in zip(completions, examples):
        c = c if not ex.fmt else (extract(c, kind_of(ex.task).read) or "")   # instruct
        hits = sum(a == b for a, b in zip(c, ex.answer))
        out.append(hits / max(len(c), len(ex.answer), 1))
    return out


def format_reward(completions: Sequence[str], examples: Sequence[Example],
                  stopped: Sequence[bool]) -> list[float]:
    check_batch(completions, examples, stopped)
    out = []
    for c, ex, s in zip(completions, examples, stopped):
        if ex.fmt:                                      # instruct: the requested format
            out.append(float(follows_format(c, s, ex.fmt)))
            continue
        chars = get_task(ex.task).answer_chars
        out.append(float(bool(s) and len(c) > 0 and all(ch in chars for ch in c)))
    return out


def step_rewards(completions: Sequence[str], examples: Sequence[Example],
                 stopped: Sequence[bool]) -> list[list[float]]:
    """Per-token rewards for process supervision: one per completion token.

    Character j earns 1 if it equals the answer's character j; the final <eos> earns 1 if
    the completion stopped at exactly the answer's length. A completion cut off at the
    length limit has no <eos> token and so no reward for it.
    """
    check_batch(completions, examples, stopped)
    out = []
    for c, ex, s in zip(completions, examples, stopped):
        row = [float(j < len(ex.answer) and ch == ex.answer[j]) for j, ch in enumerate(c)]
        if s:
            row.append(float(len(c) == len(ex.answer)))
        out.append(row)
    return out


REWARDS = {"accuracy": accuracy_reward, "partial": partial_reward, "format": format_reward}


def weighted_reward(completions: Sequence[str], examples: Sequence[Example],
                    weights: dict[str, float], stopped: Sequence[bool] | None = None
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted sum of the named rewards -> (total (N,), {name: (N,)}).

    Raises if a weight is not a finite number, or a reward function returns a value that
    is not a finite number, naming the function and the sample, so a broken reward never
    reaches the advantages; and if the weighted sum overflows float32.
    """
    if len(completions) != len(examples):
        raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
    unknown = set(weights) - set(REWARDS)
    if unknown:
        raise ValueError(f"unknown reward functions {sorted(unknown)}; known: {sorted(REWARDS)}")
    for name, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
            raise ValueError(f"reward weight {name!r} must be a finite number, got {w!r}")
    stopped = [True] * len(completions) if stopped is None else list(stopped)
    check_batch(completions, examples, stopped)
    parts = {}
    total = torch.zeros(len(completions))
    for name, w in weights.items():
        vals = REWARDS[name](completions, examples, stopped)
        check_finite_rewards(name, vals, completions)
        parts[name] = torch.tensor([float(v) for v in vals], dtype=torch.float32)   # (N,)
        total += w * parts[name]
    bad = (~(total.abs() <= REWARD_CEILING)).nonzero().flatten()          # nan, inf, too big
    if len(bad):
        raise ValueError(f"weighted reward of sample {int(bad[0])} is {float(total[bad[0]]):.4g}: "
                         f"weights {weights} take it beyond |reward| <= {REWARD_CEILING:g} "
                         f"(tasks.REWARD_CEILING)")
    return total, parts


REWARD_CEILING = 1e6
"""Largest |reward| accepted. Finite is not enough: GRPO's advantages divide by a group's
std, which squares the rewards (float32 overflows past ~1e19), Dr. GRPO's do not divide at
all (a loss of 1e38), and no verifiable reward needs more than a few digits: rescale."""


def check_finite_rewards(name: str, values: Sequence[float], completions: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the reward function and sample of a non-finite reward or one
    beyond ``REWARD_CEILING``."""
    if len(values) != len(completions):
        raise ValueError(f"reward function {name!r} returned {len(values)} values "
                         f"for {len(completions)} completions")
    for i, v in enumerate(values):
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"reward function {name!r} returned {v!r} for sample {i} "
                             f"(completion {completions[i]!r}), not a number") from None
        if not math.isfinite(v):
            raise ValueError(f"reward function {name!r} returned {v} for sample {i} "
                             f"(completion {completions[i]!r})")
        if abs(v) > REWARD_CEILING:
            raise ValueError(f"reward function {name!r} returned {v:.4g} for sample {i} "
                             f"(completion {completions[i]!r}), beyond the ceiling "
                             f"|reward| <= {REWARD_CEILING:g} (tasks.REWARD_CEILING): rescale it")


# ---------------------------------------------------------------- task mixture
MIXTURE_TASKS = ("addition", "sort", "reverse", "count", "compare", "max", "min")


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
