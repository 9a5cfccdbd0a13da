"""A prototyper's real-model plugin, written outside the package: an instruct task, an answer
format, a reward and a grouper, registered when the module is imported.

    grpo-lab train --preset smollm_cpu --plugin notebooks/plugins/instruct_lab.py \
        --task times --grouping by_size --group.k 2 \
        --reward_weights accuracy=1,format=0.25,shows_work=0.1

  * task ``times``: "what is 7 times 8?" -> "56", written in words (``alphabet=None``: no toy
    form, any tokenizer that reads lower-case letters, SmolLM2 and data/hf_tiny both), with
    its own held-out set (``eval_fn``: 100 seeded products, never drawn for training) and its
    own answer checker (``TIMES``: the number after the last "=", else the last number).
    Each example carries its operands in ``Example.fields``.
  * answer format ``plain``: "reply with the number." (lower case, so data/hf_tiny's tokenizer
    reads it too; the shipped formats' capitals and braces it would drop).
  * reward ``shows_work``: 1 when the completion restates both operands.
  * grouper ``by_size``: k groups of prompts by the size of the product, read from
    ``batch.fields`` (the task's own values), not from ``batch.prompts`` (the rendered text).
"""
import random
import re

import numpy as np

from grpo_lab.algorithm.grouping import register_grouper
from grpo_lab.tasks import Example, distinct_examples, register_task
from grpo_lab.tasks.rewards import register_reward
from grpo_lab.tasks.answers import (AnswerFormat, AnswerKind, last_number, register_format,
                                    same_number)


def make_times(rng: random.Random) -> Example:
    """what is a times b? for a, b in 2..12"""
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return Example(f"what is {a} times {b}?", str(a * b), "times", fields={"a": a, "b": b})


def held_out_times() -> list[Example]:
    """100 distinct seeded products: the same list on every call."""
    return distinct_examples(make_times, 100, random.Random("times-eval"))


def after_equals(text: str) -> str | None:
    """The number after the last "=" ("7 x 8 = 56" -> "56"), else the last number."""
    tail = text.rsplit("=", 1)[-1] if "=" in text else text
    return last_number(tail) or last_number(text)


TIMES = AnswerKind("times", after_equals, same_number)
register_task("times", make_times, "0123456789", 3, eval_fn=held_out_times,
              alphabet=None, answer_kind=TIMES)


def _follows_plain(text: str) -> bool:
    return re.fullmatch(r"\s*-?\d+\.?\s*", text) is not None


register_format(AnswerFormat("plain", "reply with the number.", _follows_plain,
                             counts_truncated=False, description="the number alone, asked "
                             "in lower case"))


@register_reward("shows_work")
def shows_work(completions, examples, stopped):
    """1 when the completion restates both operands of the question."""
    out = []
    for c, e in zip(completions, examples):
        nums = re.findall(r"\d+", c)
        want = [str(e.fields[k]) for k in ("a", "b")] if e.fields else []
        out.append(float(bool(want) and all(w in nums for w in want)))
    return out


@register_grouper("by_size", takes_k=True)
def by_size(batch, k, seed=0):
    """k equal-size groups of prompts by the size of the product (the task's own fields)."""
    size = np.array([f["a"] * f["b"] if f else 0 for f in batch.fields])   # (B,)
    order = np.argsort(size, kind="stable")
    ids = np.empty(len(size), dtype=np.int64)
    ids[order] = np.arange(len(size)) * k // len(size)                     # (B,) in 0..k-1
    return ids
