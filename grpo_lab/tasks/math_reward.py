"""An optional symbolic accuracy reward: Hugging Face's math-verify reads the completion's and
the reference's answers (LaTeX, \\boxed{}, fractions, plain expressions) into sympy and compares
them as math, so 1/2, 0.5 and \\frac{1}{2} agree.

    pip install -e ".[math]"                       # math-verify and sympy
    grpo-lab train --plugins grpo_lab.tasks.math_reward --reward_weights math_verify=1,format=0.2

Never imported on the default path: a plugin (``cfg.plugins``) that registers the reward
``math_verify`` (same signature as rewards.REWARDS: (completions, examples, stopped) ->
floats in {0, 1}). A completion that did not stop (no <eos>) earns 0, as ``accuracy``.
Deviation from math-verify's defaults: its own signal-based timeouts are off
(``parsing_timeout=None``, ``timeout_seconds=None``); grpo_lab's ``user_code_timeout_s``
bounds the whole reward call instead (signal.alarm works only on the main thread and would
clash with that bound). grpo_lab's own readers (answers.py) stay the default ``accuracy``:
they are linear in the text and need nothing installed.
"""
from __future__ import annotations

from typing import Sequence

from grpo_lab.tasks import Example
from grpo_lab.tasks.rewards import check_batch, register_reward


def _math_verify():
    """-> (parse, verify), imported at the first call (the module imports without it)."""
    try:
        from math_verify import parse, verify
    except ImportError as e:
        raise ImportError("the math_verify reward needs math-verify: pip install -e \".[math]\" "
                          f"({e})") from None
    return parse, verify


def math_verify_reward(completions: Sequence[str], examples: Sequence[Example],
                       stopped: Sequence[bool]) -> list[float]:
    check_batch(completions, examples, stopped)
    parse, verify = _math_verify()
    out = []
    for c, ex, s in zip(completions, examples, stopped):
        if not s:
            out.append(0.0)
            continue
        gold = parse(ex.answer, parsing_timeout=None)
        pred = parse(c, parsing_timeout=None)
        out.append(float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)))
    return out


register_reward("math_verify", math_verify_reward)
