"""Arithmetic word problems from templates: GSM8K-like, one to three operations, no download.

GSM8K (Cobbe et al. 2021) is grade-school arithmetic told as a story, graded on the final
number. This family makes such stories from a few sentence templates, so the data is
procedural, seeded and offline, with a held-out set of its own:

    "Mia has 12 marbles. She buys 7 more. She gives 5 to a friend. How many marbles does
     Mia have now?" -> "14"

A story is a start (``has x``: no operation; ``buys a packs of b``: a product), zero to two
changes (buys more: +; gives away: -, never below zero) and a question (how many now; or
shared equally among k friends: a division, drawn only when it is exact), with one to three
operations in all. Numbers stay small (at most 3 digits) so a 135M-parameter model has a
chance; difficulty is the number of steps, not the size of the numbers.

Deviations from GSM8K: templates, not human-written problems; integer answers only; the
story never asks for an intermediate quantity.
"""
from __future__ import annotations

import random

from grpo_lab.tasks import Example, distinct_examples, register_task

NAMES = [("Mia", "She"), ("Tom", "He"), ("Ava", "She"), ("Leo", "He"), ("Zoe", "She"),
         ("Sam", "He"), ("Ivy", "She"), ("Max", "He")]
ITEMS = ["marbles", "apples", "stickers", "pencils", "cards", "cookies", "stamps", "shells"]


def make(rng: random.Random) -> Example:
    """One story with 1-3 operations (seeded by ``rng``) -> Example(story, answer)."""
    name, pron = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    ops = rng.randint(1, 3)
    if rng.random() < 0.4:                             # a product as the start: one operation
        a, b = rng.randint(2, 9), rng.randint(2, 12)
        x, used = a * b, 1
        text = [f"{name} buys {a} packs of {item} with {b} in each pack."]
    else:
        x, used = rng.randint(5, 60), 0
        text = [f"{name} has {x} {item}."]
    share = ops - used >= 1 and rng.random() < 0.3     # end with an exact division
    for _ in range(ops - used - share):
        if x > 2 and rng.random() < 0.5:
            n = rng.randint(1, x - 1)
            x -= n
            text.append(f"{pron} gives {n} to a friend.")
        else:
            n = rng.randint(2, 40)
            x += n
            text.append(f"{pron} buys {n} more.")
    if share:
        ks = [k for k in range(2, 10) if x % k == 0]
        if ks:
            k = rng.choice(ks)
            x //= k
            text.append(f"{pron} shares them equally among {k} friends. How many {item} does "
                        f"each friend get?")
            return Example(" ".join(text), str(x), "word_problems", fields={"operations": ops})
        n = rng.randint(2, 40)                         # x is prime or 1: add instead
        x += n
        text.append(f"{pron} buys {n} more.")
    text.append(f"How many {item} does {name} have now?")
    return Example(" ".join(text), str(x), "word_problems", fields={"operations": ops})


def operations(example: Example) -> int:
    """How many operations the story takes (for tests and per-difficulty plots)."""
    t = example.prompt
    return (t.count(" packs of ") + t.count(" more.") + t.count(" gives ")
            + t.count(" shares them"))


def eval_examples(n: int = 200, seed: int = 8765) -> list[Example]:
    """The held-out set: ``n`` distinct seeded stories (the same list on every call)."""
    return distinct_examples(make, n, random.Random(f"word-problems-eval-{seed}"))


register_task("word_problems", make, "0123456789", 4, eval_fn=eval_examples,
              description="GSM8K-like stories, 1-3 operations (instruct formats only)",
              alphabet=None, answer_kind="number")         # written in words, any tokenizer
