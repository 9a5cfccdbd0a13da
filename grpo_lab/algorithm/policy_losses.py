"""The policy-gradient term of the loss: one surrogate per paper, one shared signature.

    surrogate(ratio (N, T), logp (N, T), A (N, 1) or (N, T), clip: ClipRange) -> loss (N, T)

each a record in ``POLICY_LOSSES`` (``cfg.policy_loss``), as verl's ``core_algos`` registers
its policy losses; the KL, the entropy bonus and the aggregation are added outside by
``loss.grpo_loss``. ``ratio`` is pi_theta / pi_old from ``loss.RATIO_LEVELS`` (per token,
or GSPO's per sequence) with its gradient. Padding is zeroed by the caller.

  * ``clip`` (PPO, Schulman et al. 2017; GRPO, DeepSeekMath eq. 3):
        -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
    with ``dual_clip`` = c > 1, dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in
    MOBA Games with Deep RL", AAAI 2020; verl's ``clip_ratio_c``): for A < 0 the loss is also
    capped at -c A, so a token whose ratio has exploded (r > c) gives a bounded loss and no
    gradient:
        A < 0:  min(-c A, -min(r A, clip(r) A))
    verl applies it always with c = 3; here it is off (``dual_clip = 0``) by default, so the
    runs recorded before it stay bit-identical, and at mu = 1 (the toy's default) r = 1 (up
    to float rounding) on every token and it can never act.
  * ``two_sided`` (INTELLECT-2, Prime Intellect 2025; TRL's ``delta``): the unclipped
    ratio is capped at ``delta`` before the min: -min(min(r, delta) A, clip(r) A). For A > 0
    the cap never binds (clip(r) <= 1 + eps_high < delta); for A < 0 it is value for value
    and gradient for gradient dual-clip with c = delta (tests/test_policy_losses.py shows
    both). INTELLECT-2 used delta = 4; no default here, the record needs delta > 1 + eps_high.
  * ``cispo`` (MiniMax-M1, MiniMax 2025): the clipped ratio becomes a stop-gradient weight
    of a REINFORCE term, so no token loses its gradient to clipping:
        -sg(min(r, 1 + eps_high)) A log pi_theta
    Deviations: the paper's IS weight has a lower bound 1 - eps_low^IS that it sets out of
    reach ("we did not impose a lower bound"); here there is none and eps_low is unused by
    this record (as TRL's implementation, which clamps only above). The loss's *value* is
    the paper's objective, -w A log pi, so loss/total is not comparable with ``clip``'s; its
    gradient is -w A grad log pi. The paper aggregates per token (token_mean):
    ``method="cispo"`` sets that. The GSPO ratio (ratio_level="sequence") is accepted: the
    weight is then the clipped sequence ratio on every token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from grpo_lab.registry import check_new


class ClipRange(NamedTuple):
    """The numbers a surrogate may read; 0 = off for dual_clip and delta."""
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float = 0.0        # c > 1: dual-clip PPO's bound on A < 0 tokens (verl: 3)
    delta: float = 0.0            # two_sided's cap on the unclipped ratio (INTELLECT-2: 4)


def clip_loss(ratio, logp, A, clip: ClipRange):
    clipped = ratio.clamp(1 - clip.eps_low, 1 + clip.eps_high)             # (N, T)
    loss = -torch.min(ratio * A, clipped * A)                              # (N, T) PPO eq. 7
    if clip.dual_clip:
        bound = -clip.dual_clip * A                                        # (N, 1) or (N, T)
        loss = torch.where(A < 0, torch.min(loss, bound), loss)            # Ye et al. 2020
    return loss


def two_sided_loss(ratio, logp, A, clip: ClipRange):
    capped = ratio.clamp(max=clip.delta)                                   # (N, T) min(r, delta)
    clipped = ratio.clamp(1 - clip.eps_low, 1 + clip.eps_high)             # (N, T)
    return -torch.min(capped * A, clipped * A)                             # (N, T) INTELLECT-2


def cispo_loss(ratio, logp, A, clip: ClipRange):
    w = ratio.clamp(max=1 + clip.eps_high).detach()                        # (N, T) sg(clip(r))
    return -w * A * logp                                                   # (N, T) MiniMax-M1


@dataclass(frozen=True)
class PolicyLoss:
    """One surrogate with what the config checks about it."""
    name: str
    fn: Callable                  # (ratio, logp, A, ClipRange) -> per-token loss (N, T)
    paper: str
    changes: str                  # one line: what it changes against GRPO's clip
    needs: tuple = ()             # ClipRange fields that must be set (> 0) for it

    def __call__(self, ratio, logp, A, clip: ClipRange):
        return self.fn(ratio, logp, A, clip)


POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str, fn: Callable, paper: str = "", changes: str = "",
                         needs: tuple = ()) -> PolicyLoss:
    """Add a surrogate ``(ratio, logp, A, ClipRange) -> (N, T)`` (``TrainConfig(policy_loss=)``)."""
    check_new(POLICY_LOSSES, "policy loss", name, fn, lambda p: p.fn)
    POLICY_LOSSES[name] = PolicyLoss(name, fn, paper, changes, tuple(needs))
    return POLICY_LOSSES[name]


register_policy_loss("clip", clip_loss, "PPO (Schulman et al. 2017); GRPO (Shao et al. 2024)",
                     "the clipped surrogate; dual_clip > 1 adds dual-clip PPO (Ye et al. 2020)")
register_policy_loss("two_sided", two_sided_loss, "INTELLECT-2 (Prime Intellect 2025)",
                     "caps the unclipped ratio at delta: bounds A < 0 tokens whose ratio exploded",
                     needs=("delta",))
register_policy_loss("cispo", cispo_loss, "MiniMax-M1 (MiniMax 2025)",
                     "sg(min(r, 1 + eps_high)) A log pi: a clipped IS weight, no token's "
                     "gradient clipped away")


def check_clip(name: str, clip: ClipRange) -> None:
    """Raise ValueError on a ClipRange the surrogate ``name`` cannot use, saying why."""
    if clip.dual_clip and not clip.dual_clip > 1:
        raise ValueError(f"dual_clip must be 0 (off) or > 1 (a bound c <= 1 would cap the "
                         f"loss of on-policy tokens, ratio 1, with A < 0), got {clip.dual_clip}")
    if clip.dual_clip and name != "clip":
        raise ValueError(f"dual_clip is a bound of the 'clip' surrogate; policy_loss={name!r} "
                         f"does not read it (two_sided's delta is the same bound)")
    if clip.delta and name != "two_sided":
        raise ValueError(f"delta is read only by policy_loss='two_sided', not {name!r}")
    if "delta" in POLICY_LOSSES[name].needs and not clip.delta > 1 + clip.eps_high:
        raise ValueError(f"policy_loss='two_sided' needs delta > 1 + eps_high = "
                         f"{1 + clip.eps_high} (below it the cap binds on A > 0 tokens too), "
                         f"got {clip.delta}")
