"""The shipped environments, offline, in the toy's alphabet (tokenizer.ALPHABET).

``guess``: guess the number with higher/lower feedback. The prompt ``g:23-30=`` names a range
of ``WIDTH`` = 8 numbers; the secret is the example's answer (hidden from the policy). Each
action is a guess ("27" then <eos>); the observation is ``<`` (the secret is lower) or ``>``
(higher), ``?`` for an action that is not a number the feedback so far leaves possible; the
right guess ends the episode with reward 1 - ``TURN_COST`` x the wrong guesses before it (a
reward only at the end, never negative: an episode that stalls, truncated, gets 0, less than
any success). The state key is the range the
feedback so far leaves possible, so anchor states repeat across a prompt's G episodes (all
start from the whole range; every episode that guessed 26 first and heard ">" stands in 27-30).
The best policy bisects: ``optimal_guesses(8)`` = 2.625 guesses on average (21 / 8 for a
uniform secret), at most 4 = floor(log2 8) + 1; max_turns 5 leaves one spare. Held out: the
ranges starting at ``HELD_OUT_STARTS``, never drawn for training.

``guess4``: the same game on ranges of 4 (``g:23-26=``, 3 turns).

``add_retry``: the toy's two-digit sums (the addition task's prompts and held-out set),
answered again after higher/lower feedback (3 turns): the base policy already gets many right,
so GRPO has a signal at once; the quick end-to-end check.

``add_tool``: ToolEnvironment over 3-term sums ``12+34+5=`` with the tool ``add``
(``?add:12,34`` -> ``46``): the tool-call path (parse, errors as observations) on the toy.
"""
from __future__ import annotations

import random
from functools import lru_cache

from grpo_lab.agents.environments import (AgentSettings, ToolEnvironment, register_environment,
                                          register_tool)
from grpo_lab.tasks import Example, distinct_examples

TURN_COST = 0.1
"""What each wrong guess takes off the final reward of 1: fewer turns is better."""
HELD_OUT_STARTS = (3, 14, 25, 36, 47, 58, 69, 80, 91)
"""Ranges starting here are the held-out set of ``guess`` and ``guess4``: one per tens digit
and each last digit but 2 once, so training sees ranges like them (starts 3, 13, ..., 83, all
ending in 3, left the toy facing a last digit it never saw: 55% sampled success held out
where training's was 94%)."""


@lru_cache(maxsize=None)
def optimal_guesses(n: int) -> float:
    """Expected guesses of the best higher/lower policy on n equally likely numbers: guess the
    middle; E(n) = 1 + (k E(k) + (n-1-k) E(n-1-k)) / n with k = (n-1) // 2 (E(0) = 0)."""
    if n == 0:
        return 0.0
    k = (n - 1) // 2
    return 1 + (k * optimal_guesses(k) + (n - 1 - k) * optimal_guesses(n - 1 - k)) / n


class GuessNumber:
    """One episode of the guessing game (module docstring)."""

    def reset(self, example: Example, seed: int) -> str:
        self.lo, self.hi = example.fields["lo"], example.fields["hi"]
        self.secret, self.wrong = int(example.answer), 0
        return ""

    def step(self, action: str):
        g = int(action) if action.isdigit() else None
        if g == self.secret:
            return "", 1.0 - TURN_COST * self.wrong, True
        self.wrong += 1
        if g is None or not self.lo <= g <= self.hi:   # not a number the feedback left open
            return "?", 0.0, False
        if g > self.secret:
            self.hi = g - 1
            return "<", 0.0, False
        self.lo = g + 1
        return ">", 0.0, False

    def state_key(self):
        return (self.lo, self.hi)


def _guess_example(width: int, name: str, rng: random.Random, lo: int | None = None,
                   secret: int | None = None) -> Example:
    lo = rng.randrange(0, 101 - width) if lo is None else lo
    hi = lo + width - 1
    secret = rng.randint(lo, hi) if secret is None else secret
    return Example(f"g:{lo}-{hi}=", str(secret), name, fields={"lo": lo, "hi": hi})


def _held_out(width: int, name: str) -> list[Example]:
    return [_guess_example(width, name, None, lo, lo + j) for lo in HELD_OUT_STARTS
            for j in range(width)]


def guess_examples(rng: random.Random) -> Example:
    """Guess the number in a range of 8 with higher/lower feedback."""
    return _guess_example(8, "guess", rng)


def guess4_examples(rng: random.Random) -> Example:
    """Guess the number in a range of 4 with higher/lower feedback."""
    return _guess_example(4, "guess4", rng)


def random_consistent_guess(env: GuessNumber, rng: random.Random) -> str:
    """The warm-up's player (warmup.py): a number the feedback so far leaves possible."""
    return str(rng.randint(env.lo, env.hi))


register_environment("guess", GuessNumber, guess_examples, demo=random_consistent_guess,
                     settings=AgentSettings(max_turns=5, max_action_tokens=3, max_observation_tokens=1),
                     answer_chars="0123456789", max_answer_len=2,
                     eval_fn=lambda: _held_out(8, "guess"))
register_environment("guess4", GuessNumber, guess4_examples, demo=random_consistent_guess,
                     settings=AgentSettings(max_turns=3, max_action_tokens=3, max_observation_tokens=1),
                     answer_chars="0123456789", max_answer_len=2,
                     eval_fn=lambda: _held_out(4, "guess4"))


# ---- the quick one: a sum, answered again after higher/lower feedback

RETRY_COST = 0.3
"""What each wrong answer takes off add_retry's reward of 1."""


class AddRetry:
    """``12+34=``: answer; a wrong answer hears ``<`` (the sum is lower) or ``>`` (higher) and
    may answer again; the right one ends the episode with 1 - RETRY_COST x the wrong answers
    before it. The state key is the feedback heard so far."""

    def reset(self, example: Example, seed: int) -> str:
        self.answer, self.heard = int(example.answer), ""
        return ""

    def step(self, action: str):
        n = int(action) if action.isdigit() else None
        if n == self.answer:
            return "", 1.0 - RETRY_COST * len(self.heard), True
        obs = "?" if n is None else "<" if n > self.answer else ">"
        self.heard += obs
        return obs, 0.0, False

    def state_key(self):
        return self.heard


def add_retry_examples(rng: random.Random) -> Example:
    """Two-digit addition, answered again after higher/lower feedback."""
    a, b = rng.randrange(100), rng.randrange(100)
    return Example(f"{a}+{b}=", str(a + b), "add_retry", fields={"a": a, "b": b})


def _add_retry_held_out() -> list[Example]:
    from dataclasses import replace

    from grpo_lab.tasks.task_data import held_out
    return [replace(e, task="add_retry") for e in held_out(["addition"])["addition"]]


register_environment("add_retry", AddRetry, add_retry_examples,
                     AgentSettings(max_turns=3, max_action_tokens=4, max_observation_tokens=1),
                     answer_chars="0123456789", max_answer_len=3, eval_fn=_add_retry_held_out)


# ---- a tool on the toy: 3-term sums with an adder

def add(a: str, b: str) -> str:
    """a + b of two whole numbers written in digits."""
    return str(int(a) + int(b))


register_tool("add", add)


class AddWithTool(ToolEnvironment):
    offers = ("add",)


def add3_examples(rng: random.Random) -> Example:
    """A sum of three numbers below 50, with the tool add."""
    a, b, c = (rng.randrange(50) for _ in range(3))
    return Example(f"{a}+{b}+{c}=", str(a + b + c), "add_tool")


def _add3_held_out() -> list[Example]:
    return distinct_examples(add3_examples, 100, random.Random("add_tool-held-out"))


register_environment("add_tool", AddWithTool, add3_examples,
                     AgentSettings(max_turns=3, max_action_tokens=8, max_observation_tokens=4),
                     answer_chars="0123456789", max_answer_len=3, eval_fn=_add3_held_out)
