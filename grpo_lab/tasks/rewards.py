"""Reward functions of the verifiable tasks (DeepSeekMath sec. 4 uses rule-based rewards the
same way: no learned reward model).

Rewards (each returns floats in [0, 1], one per completion):
  * ``accuracy``: 1 if the completion equals the answer exactly.
  * ``partial``:  fraction of answer characters right at their position, divided by the
                   longer of the two lengths (so padding an answer with junk costs credit).
  * ``format``:   1 if the completion stopped (emitted <eos>) and uses only the task's
                   answer alphabet.
  * ``format_if_correct``: ``format`` where ``accuracy`` is 1, else 0: a format reward that a
                   wrong answer cannot collect (the additive ``format`` pays for a well-wrapped
                   guess; on SmolLM2 at weight 1 that taught a boxed guess in 4 steps).
They are combined by ``weighted_reward`` with weights from the config (``resolve_rewards``:
once per run), each function given lists of its own (one that edits them, as
``completions[i] = c.strip()``, would change what every function after it scores, and the
samples logged); add your own with ``register_reward``. An example rendered for an instruct
model (``Example.fmt`` set, instruct.py) is scored the instruct way instead (answers.py):
accuracy reads the answer whatever wraps it, partial compares that answer, format checks the
requested answer format.
"""
from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Mapping, Set
from typing import Callable, Sequence

import torch

from grpo_lab.tasks.answers import extract, follows_format, is_correct, kind_of
from grpo_lab.registry import check_new, lookup
from grpo_lab.timelimit import guard
from grpo_lab.tasks import Example


def register_reward(name: str, fn=None):
    """Add a reward ``(completions, examples, stopped) -> list of floats`` to ``REWARDS``
    (use it with ``reward_weights={name: w}``); as a decorator too. Values are checked
    finite at every call (``weighted_reward``); a function defined outside grpo_lab runs under
    the user-code time limit (timelimit.guard)."""
    if fn is None:
        return lambda f: (register_reward(name, f), f)[1]
    check_new(REWARDS, "reward", name, fn)
    REWARDS[name] = guard(f"reward function {name!r} on a batch of completions", fn)
    return fn


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
    read = [c if not ex.fmt else (extract(c, kind_of(ex.task).read) or "")     # instruct
            for c, ex in zip(completions, examples)]
    return [sum(a == b for a, b in zip(c, ex.answer)) / max(len(c), len(ex.answer), 1)
            for c, ex in zip(read, examples)]


def format_reward(completions: Sequence[str], examples: Sequence[Example],
                  stopped: Sequence[bool]) -> list[float]:
    check_batch(completions, examples, stopped)
    return [float(follows_format(c, s, ex.fmt)) if ex.fmt else   # instruct: the requested format
            float(bool(s) and len(c) > 0 and set(c) <= set(ex.answer_chars or _no_chars(ex)))
            for c, ex, s in zip(completions, examples, stopped)]


def _no_chars(ex: Example) -> str:
    raise ValueError(f"{ex.task!r} example {ex.prompt!r} has no answer_chars (Task.draw sets them)")


def format_if_correct_reward(completions: Sequence[str], examples: Sequence[Example],
                             stopped: Sequence[bool]) -> list[float]:
    return [a * f for a, f in zip(accuracy_reward(completions, examples, stopped),
                                  format_reward(completions, examples, stopped))]


def step_rewards(completions: Sequence[str], examples: Sequence[Example],
                 stopped: Sequence[bool]) -> list[list[float]]:
    """Per-token rewards for process supervision: one per completion token.

    Character j earns 1 if it equals the answer's character j; the final <eos> earns 1 if
    the completion stopped at exactly the answer's length. A completion cut off at the
    length limit has no <eos> token and so no reward for it.
    """
    check_batch(completions, examples, stopped)
    return [[float(j < len(ex.answer) and ch == ex.answer[j]) for j, ch in enumerate(c)]
            + ([float(len(c) == len(ex.answer))] if s else [])             # the <eos>, if any
            for c, ex, s in zip(completions, examples, stopped)]


REWARDS = {"accuracy": accuracy_reward, "partial": partial_reward, "format": format_reward,
           "format_if_correct": format_if_correct_reward}


def resolve_rewards(weights: dict[str, float]) -> dict[str, tuple[Callable, float]]:
    """``{name: weight}`` (``TrainConfig.reward_weights``) -> ``{name: (function, weight)}``
    for ``weighted_reward``, once per run; an error names an unknown reward or a bad weight."""
    for name, w in sorted(weights.items(), key=lambda nw: str(nw[0])):
        lookup(REWARDS, name, "reward function")
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
            raise ValueError(f"reward weight {name!r} must be a finite number, got {w!r}")
    return {name: (REWARDS[name], w) for name, w in weights.items()}


def weighted_reward(completions: Sequence[str], examples: Sequence[Example],
                    rewards: dict, stopped: Sequence[bool] | None = None
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted sum of ``rewards`` (resolve_rewards) -> (total (N,), {name: (N,)}); a ValueError
    names any value (and its sample) not a finite number within ``REWARD_CEILING``."""
    stopped = [True] * len(completions) if stopped is None else list(stopped)
    check_batch(completions, examples, stopped)
    parts, total = {}, torch.zeros(len(completions))
    for name, (fn, w) in rewards.items():
        parts[name] = check_finite_rewards(name, fn(list(completions), list(examples),
                                                    list(stopped)), completions)  # own lists
        total += w * parts[name]
    if not bool((total.abs() <= REWARD_CEILING).all()):                   # nan, inf, too big
        _refuse_total(total, {name: w for name, (_, w) in rewards.items()})
    return total, parts


def _refuse_total(total: torch.Tensor, weights: dict) -> None:
    i = int((~(total.abs() <= REWARD_CEILING)).nonzero()[0])
    raise ValueError(f"weighted reward of sample {i} is {float(total[i]):.4g}: weights "
                     f"{weights} take it beyond |reward| <= {REWARD_CEILING:g} "
                     f"(rewards.REWARD_CEILING)")


REWARD_CEILING = 1e6
"""Largest |reward| accepted. Finite is not enough: GRPO's advantages divide by a group's
std, which squares the rewards (float32 overflows past ~1e19), Dr. GRPO's do not divide at
all (a loss of 1e38), and no verifiable reward needs more than a few digits: rescale."""


def check_finite_rewards(name: str, values, completions: Sequence[str]) -> torch.Tensor:
    """A reward function's values -> (N,) float32, or a ``ValueError`` naming the function
    and the sample of a value that is no finite number (a str is none) within ``REWARD_CEILING``."""
    v = None
    if hasattr(values, "__len__") and not isinstance(values, NOT_A_LIST):
        with contextlib.suppress(TypeError, ValueError, AttributeError):  # _refuse_values says
            v = torch.tensor([x.__float__() for x in values], dtype=torch.float64)  # (N,)
    if v is None or len(v) != len(completions) or not bool((v.abs() <= REWARD_CEILING).all()):
        _refuse_values(name, values, completions)
    return v.float()


NOT_A_LIST = (str, bytes, Mapping, Set)
"""Values with a length that are no list of rewards: a dict's iteration gives its keys (0, 1, 2,
... read as rewards), a set's has no order."""


def _refuse_values(name: str, values, completions: Sequence[str]) -> None:
    if not hasattr(values, "__len__") or isinstance(values, NOT_A_LIST):
        raise ValueError(f"reward function {name!r} returned {values!r:.60}, not a list of "
                         f"{len(completions)} numbers (one per completion)")
    if len(values) != len(completions):
        raise ValueError(f"reward function {name!r} returned {len(values)} values "
                         f"for {len(completions)} completions")
    for i, v in enumerate(values):
        try:
            if isinstance(v, (str, bytes)):        # the completion itself ("161"), not its score
                raise TypeError
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
                             f"|reward| <= {REWARD_CEILING:g} (rewards.REWARD_CEILING): rescale it")
