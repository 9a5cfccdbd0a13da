"""The multi-rank bookkeeping of one step, kept out of the algorithm's way (step.collect).

Every rank draws the same B prompts (seeded by (seed, step, draw)) and samples only its
contiguous slice of them (``Group.slice``). The grouper and the advantages need the *global*
batch, so after sampling the ranks share what those need: each rank's kept prompts' places in
the global batch, their rewards (and per-token rewards for process supervision), lengths and
stop flags (``gather_rows``); each rank then keeps the advantages of the rows it sampled
(``share_rows``). On one process every collective is the identity, and this is a re-ordering
that changes nothing.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from grpo_lab.distributed.group import Group
from grpo_lab.algorithm.rollout import Scored, cat_scored, take_scored
from grpo_lab.tasks.rewards import step_rewards


class Gathered(NamedTuple):
    """Every rank's rows put together in global prompt order (N = B*G rows, G per prompt)."""
    rewards: torch.Tensor         # (N,)
    parts: dict                   # reward function name -> (N,)
    lengths: torch.Tensor         # (N,) completion tokens
    stopped: torch.Tensor         # (N,) bool
    step_rewards: list | None     # (N,) lists of per-token rewards (process supervision)


def my_rows(kept, draws, mine: range) -> tuple[Scored, list[int]]:
    """This rank's kept rows (it sampled them) and their prompts' places in the global batch."""
    parts = []
    for d, (_, s) in enumerate(draws):
        local = [i - mine.start for dd, i in kept if dd == d and i in mine]
        if local:
            parts.append(take_scored(s, torch.isin(s.rollout.prompt_index, torch.tensor(local))))
    places = [p for p, (d, i) in enumerate(kept) if i in mine]            # ascending
    empty = take_scored(draws[0][1], torch.zeros(len(draws[0][1].rewards), dtype=torch.bool))
    return (cat_scored(parts) if parts else empty), places


def gather_rows(group: Group, places: list[int], s: Scored, G: int, process: bool) -> Gathered:
    """All ranks' (places, rewards, ...) -> the global batch's rows, in prompt order."""
    r = s.rollout
    steps = (step_rewards(s.texts, [s.examples[i] for i in r.prompt_index.tolist()],
                          r.stopped.tolist()) if process else None)
    shared = group.gather((places, s.rewards, s.parts, r.completion_mask.sum(1), r.stopped, steps))
    order = [p for pl, *_ in shared for p in pl]                          # place of each block
    by_place = sorted(range(len(order)), key=order.__getitem__)           # blocks in place order

    def rows(tensors):                                                    # (N, ...) in place order
        t = torch.cat(tensors)
        return t.view(len(order), G, *t.shape[1:])[by_place].reshape(-1, *t.shape[1:])
    parts = {k: rows([x[2][k] for x in shared]) for k in shared[0][2]}
    steps_all = None
    if process:
        flat = [row for x in shared for row in x[5]]
        steps_all = [flat[i] for b in by_place for i in range(b * G, (b + 1) * G)]
    return Gathered(rows([x[1] for x in shared]), parts, rows([x[3] for x in shared]),
                    rows([x[4] for x in shared]), steps_all)


class Shared(NamedTuple):
    """This rank's part of the global batch, and the global batch's rows."""
    scored: Scored                # this rank's kept rows (N_r = B_r * G)
    rows: torch.Tensor            # (N_r,) long: their places among the global batch's N rows
    glob: Gathered                # every rank's rows, in global prompt order (N = B * G)


def share_rows(group: Group, kept, draws, B: int, G: int, process: bool) -> Shared:
    """The kept (draw, prompt) pairs of every rank -> this rank's rows and the global batch."""
    scored, places = my_rows(kept, draws, group.slice(B))
    glob = gather_rows(group, places, scored, G, process)
    rows = torch.tensor([p * G + j for p in places for j in range(G)], dtype=torch.long)
    return Shared(scored, rows, glob)
