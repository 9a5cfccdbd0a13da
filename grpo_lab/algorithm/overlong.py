"""What to do with completions cut off at max_new_tokens (DAPO, Yu et al. 2025, sec. 3.4).

A completion that hits the length limit before <eos> is truncated: its reward says nothing
about whether its reasoning was right, only that it was long. DAPO gives two remedies, here
three sibling rules in ``OVERLONG`` (``cfg.overlong.rule``, variants.Overlong):

  * "none": truncated completions are scored and trained on like any other (GRPO).
  * "filter" (DAPO's overlong filtering): truncated completions are dropped from the loss.
    They still count in their group's reward statistics (their advantages are computed as
    usual), they just contribute no gradient, no tokens and no rows to the normaliser: a
    per-row aggregation (seq_mean_token_mean, dr_grpo) divides by the N_kept kept rows.
  * "mask" (TRL's ``mask_truncated_completions``): the same rows leave the gradient, but only
    their tokens are masked; a per-row aggregation still divides by all N rows, so its loss
    and gradient are N_kept / N times "filter"'s. token_mean is the same under both (it
    counts kept tokens). DAPO aggregates per token, so the two agree on its method.
  * "soft" (DAPO's soft overlong punishment, eq. 13): a length penalty added to the reward,

        R_length(y) = 0                                  |y| <= L_max - L_cache
                      ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
                      -1                                 |y| > L_max

    with L_max = max_new_tokens and L_cache = ``overlong.buffer``, scaled by
    ``overlong.penalty`` (DAPO: 1).

Deviations: the sampler stops at L_max, so |y| > L_max never happens; a truncated completion
has |y| = L_max and gets ((L_max - L_cache) - L_max) / L_cache = -1, DAPO's value for it.
|y| counts completion tokens, <eos> included. DAPO used L_max = 20480 and L_cache = 4096; the
toy's answers are a few tokens, so the buffer is tokens, not thousands. The penalty is added
to this rank's rows before the ranks gather their rewards, so the advantages see it
(reward/mean is the shaped reward; reward/<function> stay the raw rewards).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def soft_penalty(lengths, max_len: int, buffer: int) -> torch.Tensor:
    """DAPO eq. 13: 0 up to max_len - buffer, then a linear ramp down to -1 at max_len."""
    if not 0 < buffer <= max_len:
        raise ValueError(f"overlong.buffer must be in [1, max_new_tokens={max_len}], got {buffer}")
    start = max_len - buffer                                               # L_max - L_cache
    ramp = (start - lengths.float()) / buffer                              # (N,) <= 0 past start
    return torch.where(lengths > max_len, -1.0, ramp.clamp(max=0.0))       # (N,)


@dataclass(frozen=True)
class OverlongRule:
    """One treatment of truncated completions: a reward penalty and which rows the loss keeps."""
    name: str
    penalty: Callable | None      # (lengths (N,), max_len, buffer) -> (N,) added to the reward
    filters: bool                 # True: truncated rows (stopped False) are dropped from the loss
    counts_dropped: bool = False  # True: per-row normalisers still count the dropped rows

    def keep(self, stopped: torch.Tensor) -> torch.Tensor:
        """(N,) bool stopped -> (N,) bool rows the loss keeps."""
        return stopped.bool() if self.filters else torch.ones_like(stopped, dtype=torch.bool)


OVERLONG = {r.name: r for r in (OverlongRule("none", None, filters=False),
                                OverlongRule("filter", None, filters=True),
                                OverlongRule("mask", None, filters=True, counts_dropped=True),
                                OverlongRule("soft", soft_penalty, filters=False))}
