"""The bookkeeping of a step that spans several ranks or draws, kept out of the algorithm's way
(step.collect).

Every rank draws the same B prompts (seeded by (seed, step, draw)) and samples only its
contiguous slice of them (``Group.slice``). With dynamic sampling (several draws) a rank's
kept rows are picked out of its draws (``my_rows``). The grouper and the advantages need the
*global* batch, so on N ranks the ranks share what those need: each rank's kept prompts'
places in the global batch, their rewards (and per-token rewards for process supervision),
lengths and stop flags (``gather_rows``); each rank then keeps the advantages of the rows it
sampled. With one draw a rank's rows are all it sampled, and on one process the gather is the
identity with the places already in order: both return their input there.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from grpo_lab.distributed.group import Group
from grpo_lab.algorithm.rollout import Scored, cat_scored, take_scored


class Gathered(NamedTuple):
    """What the grouper and the advantages read of a batch's N = B*G rows, G per prompt: this
    rank's (step.collect), or every rank's put together in global prompt order (gather_rows)."""
    rewards: torch.Tensor         # (N,)
    parts: dict                   # reward function name -> (N,)
    lengths: torch.Tensor         # (N,) completion tokens
    stopped: torch.Tensor         # (N,) bool
    step_rewards: list | None     # (N,) lists of per-token rewards (process supervision)


def my_rows(kept, draws, mine: range) -> tuple[Scored, list[int]]:
    """This rank's kept rows (it sampled them) and their prompts' places in the global batch.
    One draw whose B prompts are all kept: every row the rank sampled, as sampled."""
    if len(draws) == 1 and len(kept) == len(draws[0][0]):
        return draws[0][1], list(mine)
    parts = []
    for d, (_, s) in enumerate(draws):
        local = [i - mine.start for dd, i in kept if dd == d and i in mine]
        if local:
            parts.append(take_scored(s, torch.isin(s.rollout.prompt_index, torch.tensor(local))))
    places = [p for p, (d, i) in enumerate(kept) if i in mine]            # ascending
    empty = take_scored(draws[0][1], torch.zeros(len(draws[0][1].rewards), dtype=torch.bool))
    return (cat_scored(parts) if parts else empty), places


def gather_rows(group: Group, places: list[int], mine: Gathered, G: int) -> Gathered:
    """All ranks' (places, rows) -> the global batch's rows, in prompt order (one process:
    ``mine``, its places already in order)."""
    if group.world == 1:
        return mine
    shared = group.gather((places, *mine))
    order = [p for pl, *_ in shared for p in pl]                          # place of each block
    by_place = sorted(range(len(order)), key=order.__getitem__)           # blocks in place order

    def rows(tensors):                                                    # (N, ...) in place order
        t = torch.cat(tensors)
        return t.view(len(order), G, *t.shape[1:])[by_place].reshape(-1, *t.shape[1:])
    parts = {k: rows([x[2][k] for x in shared]) for k in shared[0][2]}
    steps_all = None
    if mine.step_rewards is not None:
        flat = [row for x in shared for row in x[5]]
        steps_all = [flat[i] for b in by_place for i in range(b * G, (b + 1) * G)]
    return Gathered(rows([x[1] for x in shared]), parts, rows([x[3] for x in shared]),
                    rows([x[4] for x in shared]), steps_all)
