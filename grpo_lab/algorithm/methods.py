"""Named methods: one switch (``TrainConfig(method=...)``, ``--method``) per paper.

A method is a record of the config fields its paper sets; the config applies them before its
checks. A field the user set to a third value (neither the field's default nor the method's)
is an error naming both, never silently overridden. Each record below lists what it sets;
anything not listed stays as configured (the learning rate, G, beta unless the paper removes
the KL, ...).

  * ``grpo``   DeepSeekMath (Shao et al. 2024): symmetric clip 0.2, the per-sequence mean
               of token means, k3 in the loss. grpo_lab's field defaults differ from it in
               one place on purpose: eps_high 0.28 (clip-higher), so ``method="grpo"`` is
               the paper's symmetric clip.
  * ``dr_grpo`` Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): the
               advantage r - mean (no std) *and* the constant normaliser (no 1/|o_i|). Either
               half alone is not the method: the advantage alone is ``mean_centred``.
  * ``dapo``   DAPO (Yu et al. 2025): clip-higher (0.2 / 0.28), dynamic sampling, token-level
               aggregation, the soft overlong punishment, no KL term (beta 0).
  * ``gspo``   GSPO (Zheng et al. 2025): the sequence-level ratio with the paper's clip
               range 3e-4 / 4e-4.
  * ``cispo``  CISPO (MiniMax-M1, 2025): the clipped IS-weight loss of loss.POLICY_LOSSES with
               token-level aggregation. Its weight's bounds are ``clip.cispo_cap`` (the cap
               itself: TRL's epsilon_high for loss_type "cispo", default 5.0 as TRL's docs
               recommend; verl's 1 + clip_ratio_high) and ``clip.cispo_floor`` (verl's 1 -
               clip_ratio_low; 0 = none, as TRL); this record sets neither.
  * ``reinforce_pp_baseline`` REINFORCE++-baseline (Hu et al. 2025; verl's estimator of that
               name): group-mean baseline, per-token whitening over the batch, token-level
               aggregation (verl's default loss_agg_mode "token-mean").
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from grpo_lab.registry import lookup


@dataclass(frozen=True)
class Method:
    name: str
    fields: dict                  # config field ("kl.beta": a block's) -> the paper's value
    paper: str
    changes: str                  # one line: what it changes against GRPO


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("grpo", {"advantage": "grpo", "loss.aggregation": "seq_mean_token_mean",
                    "clip.eps_low": 0.2, "clip.eps_high": 0.2, "loss.ratio_level": "token",
                    "loss.policy": "clip", "kl.estimator": "k3", "kl.placement": "loss"},
           "DeepSeekMath (Shao et al. 2024)",
           "the baseline: (r - mean) / std, clip 0.2, k3 in the loss"),
    Method("dr_grpo", {"advantage": "dr_grpo", "loss.aggregation": "dr_grpo"},
           "Dr. GRPO (Liu et al. 2025)", "no std in the advantage, a constant normaliser"),
    Method("dapo", {"clip.eps_low": 0.2, "clip.eps_high": 0.28, "loss.aggregation": "token_mean",
                    "dynamic.sampling": True, "overlong.rule": "soft", "kl.beta": 0.0},
           "DAPO (Yu et al. 2025)",
           "clip-higher, dynamic sampling, token-mean, soft overlong, no KL"),
    Method("gspo", {"loss.ratio_level": "sequence", "clip.eps_low": 3e-4, "clip.eps_high": 4e-4},
           "GSPO (Zheng et al. 2025)", "one length-normalised ratio per completion, clipped"),
    Method("cispo", {"loss.policy": "cispo", "loss.aggregation": "token_mean"},
           "MiniMax-M1 (MiniMax 2025)", "sg(clipped IS weight) A log pi: no gradient clipped away"),
    Method("reinforce_pp_baseline", {"advantage": "reinforce_pp_baseline",
                                     "loss.aggregation": "token_mean"},
           "REINFORCE++ (Hu et al. 2025)",
           "group-mean baseline, whitened per token over the batch"),
)}


def apply_method(cfg) -> None:
    """Set ``cfg.method``'s fields on ``cfg`` (a dataclass); "" = none. Raise ValueError where
    the config holds a third value for one of them."""
    if not cfg.method:
        return
    method = lookup(METHODS, cfg.method, "method")
    for name, value in method.fields.items():
        *block, field = name.split(".")                 # "kl.beta": the kl block's beta
        owner = getattr(cfg, block[0]) if block else cfg
        default = {f.name: f.default for f in fields(owner)}[field]
        given = getattr(owner, field)
        if given != value and given != default:
            raise ValueError(f"method={cfg.method!r} sets {name}={value!r} ({method.paper}), "
                             f"but the config says {name}={given!r}: drop one of them")
        setattr(owner, field, value)
