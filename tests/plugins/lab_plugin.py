"""A user's plugin, written outside the package: a grouper, a task with its own held-out
file and a reward, registered when the module is imported (TrainConfig(plugins=...) or
``grpo-lab train --plugin tests/plugins/lab_plugin.py``)."""
import random
from pathlib import Path

import numpy as np

from grpo_lab.algorithm.grouping import register_grouper
from grpo_lab.tasks import Example, register_task
from grpo_lab.tasks.rewards import register_reward

HERE = Path(__file__).resolve().parent


@register_grouper("by_difficulty", takes_k=True, needs_reward_stats=True)
def by_difficulty(batch, k, seed=0):
    """k buckets of prompts by the policy's current success rate (mean reward)."""
    m = np.asarray(batch.reward_mean)                                      # (B,)
    order = np.argsort(m, kind="stable")
    ids = np.empty(len(m), dtype=np.int64)
    ids[order] = np.arange(len(m)) * k // len(m)                           # equal-size buckets
    return ids


def _double(rng: random.Random) -> Example:
    a = rng.randrange(500)
    return Example(f"dbl:{a}=", str(2 * a), "double")


register_task("double", _double, "0123456789", 3, eval_file=str(HERE / "eval_double.jsonl"),
              description="dbl:21= -> 42")


@register_reward("short")
def short(completions, examples, stopped):
    """1 if the completion is no longer than the answer."""
    return [float(len(c) <= len(e.answer)) for c, e in zip(completions, examples)]
