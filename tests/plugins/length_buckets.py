"""A user's grouper with a setting, in one file outside the package: prompts grouped by their
length in characters, ``width`` characters per bucket, its own settings block
(``cfg.by_length.width``, ``--by_length.width 3``, ``{"by_length": {"width": 3}}``) that checks
itself and reaches the grouper as ``settings``."""
from dataclasses import dataclass

import numpy as np

from grpo_lab.algorithm.grouping import register_grouper


@dataclass
class LengthBuckets:
    """Prompts of lengths within one bucket share a baseline."""
    width: int = 1
    """Characters per bucket (1: one group per prompt length)."""

    def check(self, cfg):
        if self.width < 1:
            raise ValueError(f"by_length.width must be >= 1, got {self.width}")


def by_length(batch, seed=0, settings=LengthBuckets()):
    """Group id: the rank of len(raw prompt) // width among the batch's buckets."""
    buckets = np.array([len(p) for p in batch.raw_prompts]) // settings.width   # (B,)
    return np.unique(buckets, return_inverse=True)[1].astype(np.int64)           # (B,)


register_grouper("by_length", by_length, settings=LengthBuckets)
