"""Step variants: each a record of hooks that the GRPO step (training/step.py) calls at fixed
points, so the step reads as the algorithm and the loss stays the paper's objective
(``loss.surrogate_loss``). A variant that needs data in several phases of a step keeps all of
it in its one record; adding a variant is adding a record (``register_variant``).

    collect (no grad), this rank's rows, in the order of ``VARIANTS``:
        rows(policy, cfg, rollout, ctx) -> {name: (N_r, Tc)}   per-row tensors it needs later
                                           (the reference's log-probs, the trainer's)
        shape_rewards(cfg, scored, rows, max_len) -> scored    before the ranks gather rewards
        advantages(cfg, gathered, cluster_ids, prompt_index, group_ids)
                                        -> (advantages (N,) or (N, T), their real values)
                                           replaces the estimator (one variant at most)
        keep(cfg, stopped (N,)) -> (keep (N,) bool, counts_dropped)   the rows in the loss
        reject(cfg, rows, rollout) -> (N_r,) bool   this rank's rows that leave the loss and
                                           its normaliser (verl's rollout rejection); called
                                           again by the objective on its rows
    objective (with grad):
        weight(cfg, t: Tokens) -> (N_r, Tc)   multiplies the policy-gradient term (detached;
                                           the weights of the active variants multiply)
        term(cfg, t: Tokens, logp, old, real) -> ((N, T) added to the per-token loss, {stat: value})
                                           a term of ``loss.surrogate_loss``: t's rows in the
                                           loss, logp and old with padding 0, real their tokens
        stats(cfg, t: Tokens, weight) -> {stat: value}   after the loss, over the kept tokens
        stat_keys(cfg) -> (names,)         the statistics it shares (the same on every rank)

``loss_rows`` names the ``rows`` entries the loss reads (the batch keeps those); ``step_rewards``
asks the ranks to gather per-token rewards (process supervision). A hook left None is not
called. The records below, in the order the step calls them (the order is the arithmetic's:
the overlong penalty is added to the reward before beta * KL is subtracted, and the weights
multiply as truncated IS x off-policy mask x entropy mask):

    overlong        DAPO sec. 3.4 (overlong.py): a soft length penalty, or truncated rows
                    dropped from the loss (filter) or masked (mask)
    kl_reward       beta * the completion's KL estimate subtracted from its reward (kl.placement)
    kl_loss         beta * KL_t added to each token's loss (DeepSeekMath eq. 3, 4)
    tis             truncated IS of the trainer against the sampler (tis.cap, token_weights.py)
    off_policy_mask DeepSeek-V3.2 eq. 9 (off_policy_mask.delta)
    top_entropy     the 80/20 high-entropy token mask (top_entropy.quantile)
    entropy_bonus   - entropy_bonus.coef * H_t added to each token's loss
    process         process supervision: per-token advantages from step rewards (DeepSeekMath
                    4.1.3, advantages.process_advantages)
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import Callable, NamedTuple

import torch
from torch.nn.utils.rnn import pad_sequence

from grpo_lab.algorithm.advantages import process_advantages
from grpo_lab.algorithm.loss import (KL, KL_PLACEMENTS, EntropyBonus, entropy_term, grpo_only,
                                     kl_term, sequence_kl)
from grpo_lab.algorithm.overlong import OVERLONG
from grpo_lab.algorithm.rollout import add_time, completion_logprobs, now
from grpo_lab.policies.engine import UPDATE_FORWARDS
from grpo_lab.algorithm.token_weights import (IS_LEVELS, high_entropy_mask, is_weight,
                                              off_policy_sequence_mask, rejected_rows)
from grpo_lab.registry import check_new, check_number, lookup, register_settings


class Tokens(NamedTuple):
    """What the objective's hooks read. ``weight`` hooks see all this rank's rows; ``term``
    hooks the rows in the loss (and the padded logp, old, real that surrogate_loss gives its
    terms); ``stats`` hooks all rows with ``mask`` = the tokens kept in the loss."""
    logp: torch.Tensor            # (N, T) policy log-probs, with their graph
    old: torch.Tensor             # (N, T) pi_old: the trainer's (tis) or the sampler's
    sampler: torch.Tensor         # (N, T) the sampler's log-probs
    entropy: torch.Tensor | None  # (N, T) policy entropy (with its graph if entropy_bonus.coef)
    mask: torch.Tensor            # (N, T) bool
    advantages: torch.Tensor      # (N,) or (N, T)
    rows: dict                    # name -> (N, T): the batch's per-row tensors (``rows``)


@dataclass(frozen=True)
class StepVariant:
    """One variant of the GRPO step: when it is on, and its hooks (see the module docstring)."""
    name: str
    active: Callable              # (cfg) -> bool
    rows: Callable | None = None
    shape_rewards: Callable | None = None
    advantages: Callable | None = None
    keep: Callable | None = None
    reject: Callable | None = None
    weight: Callable | None = None
    term: Callable | None = None
    stats: Callable | None = None
    stat_keys: Callable | None = None
    loss_rows: tuple = ()         # the ``rows`` entries the loss reads
    step_rewards: bool = False    # the ranks gather per-token rewards (process supervision)
    description: str = ""
    settings: type | None = None  # its settings block's dataclass (cfg.<block>)
    block: str = ""               # that block's name in the config (default: the variant's)


VARIANTS: dict[str, StepVariant] = {}


def register_variant(name: str, active: Callable, settings: type | None = None,
                     block: str = "", **hooks) -> StepVariant:
    """Add a step variant ``(active(cfg) -> bool, hooks...)`` -> its record; called by the step
    after the ones registered before it. The registry's naming rule (registry.check_new).
    ``settings``: a dataclass of its settings, every field with a default (off), and
    optionally a ``check(self, cfg)`` method raising ValueError; the config then holds one
    under ``block`` (default ``name``): ``cfg.<block>.<field>``, ``--<block>.<field>``, and
    ``active`` reads whether the variant is on from it."""
    check_new(VARIANTS, "step variant", name, active, lambda v: v.active)
    if hooks.get("term") is not None:
        _check_term(name, hooks["term"])
    if settings is not None:
        register_settings(block or name, settings)
    VARIANTS[name] = StepVariant(name, active, **hooks, settings=settings,
                                 block=(block or name) if settings is not None else "")
    return VARIANTS[name]


def _check_term(name: str, term: Callable) -> None:
    """A ``term`` hook takes (cfg, t, logp, old, real): an error naming the variant, at
    registration, for one that cannot (a hook written for the older ``term(cfg, t)``)."""
    try:
        inspect.signature(term).bind(None, None, None, None, None)
    except TypeError:
        raise TypeError(f"step variant {name!r}: its term hook must take (cfg, t, logp, old, "
                        f"real) (the padded log-probs, the old ones and the real-token mask "
                        f"after t), got {term.__name__}{inspect.signature(term)}") from None
    except ValueError:                       # no signature to read (a builtin): let it run
        pass


def active_variants(cfg) -> list[StepVariant]:
    """The variants ``cfg`` turns on, in registration order (the same on every rank)."""
    return [v for v in VARIANTS.values() if v.active(cfg)]


# ---- overlong (DAPO sec. 3.4)

@dataclass
class Overlong:
    """Truncated completions (DAPO sec. 3.4, overlong.py): ``--overlong.rule soft``."""
    rule: str = "none"
    """One of overlong.OVERLONG: "none"; "filter" (dropped from the loss: per-row normalisers
    count the kept rows); "mask" (TRL's mask_truncated_completions: their tokens masked,
    per-row normalisers count all rows); "soft" (a length penalty ramping from 0 at
    max_new_tokens - buffer to -penalty at max_new_tokens, added to the reward)."""
    buffer: int = 1
    """rule="soft": L_cache, the tokens before the limit over which the penalty ramps (1: only
    a truncated completion is penalised, the toy's longest right answer is limit - 1 tokens;
    DAPO used a fifth of the limit for long reasoning)."""
    penalty: float = 1.0
    """rule="soft": the penalty at the limit (DAPO: 1)."""

    def check(self, cfg):
        lookup(OVERLONG, self.rule, "overlong.rule")
        check_number("overlong.penalty", self.penalty)
        if OVERLONG[self.rule].penalty is not None and not (
                isinstance(self.buffer, int) and self.buffer >= 1):
            raise ValueError(f"overlong.buffer must be an int >= 1, got {self.buffer!r}")
        if OVERLONG[self.rule].filters and cfg.exchange.kind.shards_parameters:
            raise ValueError(f"overlong.rule={self.rule!r} can leave a rank with no row in the "
                             f"loss and so no training forward, while exchange "
                             f"{cfg.exchange.name!r} gathers weights in every rank's forward "
                             f"(the others would wait for it): use overlong.rule='none' or "
                             f"'soft'")


def _overlong_penalty(cfg, s, rows, max_len):
    o = cfg.overlong
    pen = o.penalty * OVERLONG[o.rule].penalty(
        s.rollout.completion_mask.sum(1), max_len, o.buffer)                # (N_r,)
    return s._replace(rewards=s.rewards + pen, parts={**s.parts, "overlong": pen})


def _overlong_keep(cfg, stopped):
    rule = OVERLONG[cfg.overlong.rule]
    return rule.keep(stopped), rule.counts_dropped                         # (N,) rows in the loss


register_variant("overlong", lambda cfg: cfg.overlong.rule != "none", settings=Overlong,
                 shape_rewards=lambda cfg, s, rows, max_len: (
                     _overlong_penalty(cfg, s, rows, max_len)
                     if OVERLONG[cfg.overlong.rule].penalty is not None else s),
                 keep=_overlong_keep,
                 description="DAPO's overlong rules: a soft length penalty, or truncated "
                             "rows out of the loss")


# ---- the KL term: in the reward or in the loss (loss.KL_PLACEMENTS)

def _ref_rows(policy, cfg, r, ctx) -> dict:
    """The frozen reference's log-probs of this rank's completion tokens (time/ref_s)."""
    if not len(r.completion_ids):
        return {}
    t = now()
    ref = completion_logprobs(ctx.ref, r, cfg.temperature,
                              forward=UPDATE_FORWARDS[cfg.speed.update_forward])
    add_time(ctx.clock, "time/ref_s", now() - t)
    return {"ref": ref}                                                    # (N_r, Tc)


def _kl_reward(cfg, s, rows, max_len):
    r, kl_ = s.rollout, cfg.kl
    kl = (torch.zeros(0) if "ref" not in rows else                        # a rank with no rows
          sequence_kl(r.logprobs, rows["ref"], r.completion_mask, kl_.estimator))  # (N_r,)
    return s._replace(rewards=s.rewards - kl_.beta * kl,
                      parts={**s.parts, f"kl_{kl_.estimator}": kl})


register_variant("kl_reward",
                 lambda cfg: bool(cfg.kl.beta) and KL_PLACEMENTS[cfg.kl.placement].in_reward,
                 settings=KL, block="kl", rows=_ref_rows, shape_rewards=_kl_reward,
                 description="InstructGPT-style: beta * the completion's KL estimate off its "
                             "reward (kl.placement='reward')")
register_variant("kl_loss", lambda cfg: cfg.kl.in_loss(), settings=KL, block="kl", rows=_ref_rows,
                 term=lambda cfg, t, logp, old, real: kl_term(logp, old, t.rows["ref"], real, cfg.kl,
                                                              cfg.clip.log_ratio_clamp),
                 loss_rows=("ref",),
                 stat_keys=lambda cfg: ("loss/kl", f"loss/kl_{cfg.kl.estimator}"),
                 description="DeepSeekMath: beta * KL_t in each token's loss "
                             "(kl.placement='loss')")


# ---- weights on the policy-gradient term (token_weights.py)

@dataclass
class TIS:
    """Truncated importance sampling of the trainer against the sampler (Yao et al. 2025;
    token_weights.py): ``--tis.cap 2``."""
    cap: float = 0.0
    """The trainer recomputes the old log-probs and weights each token's policy-gradient term
    by min(pi_trainer / pi_sampler, cap), for a sampler whose log-probs differ from the
    trainer's (bf16 sampling); the gap is logged as sample/logprob_gap (0 = off, no extra
    forward)."""
    level: str = "token"
    """What cap = C bounds (one of token_weights.IS_LEVELS), each named as its reference:
    verl's "token" (min(w_t, C)), "sequence" (min(prod_t w_t, C) on the whole completion),
    "seq_mean_k1" (a completion whose geometric-mean w is outside [1/C, C] is rejected: it
    leaves the loss and its normaliser); TRL's "token_truncate", "sequence_truncate"
    (clamp to [floor, C]), "token_mask", "sequence_mask" (the token's w, or the completion's
    product W, kept where it lies in [floor, C], else 0; the normaliser unchanged)."""
    floor: float = 0.0
    """TRL's vllm_importance_sampling_clip_min for its four modes (token_truncate,
    sequence_truncate: the lower clamp; token_mask, sequence_mask: a ratio below it gets
    weight 0); 0 = none (TRL's None). verl's modes do not read it."""

    def check(self, cfg):
        check_number("tis.cap", self.cap, lambda x: x == 0 or x >= 1,
                     "0 (off) or >= 1 (a cap below 1 would shrink on-policy tokens too)")
        check_number("tis.floor", self.floor, lambda x: 0 <= x < max(self.cap, 1),
                     f"0 (none) or a bound below tis.cap = {self.cap}")
        lookup(IS_LEVELS, self.level, "tis.level")
        if self.level != "token" and not self.cap:
            raise ValueError(f"tis.level={self.level!r} says what tis.cap bounds; set tis.cap "
                             f"(> 0) or leave tis.level='token'")
        if self.floor and not self.cap:
            raise ValueError(f"tis.floor={self.floor} bounds the weights of tis.cap's modes; "
                             f"set tis.cap (> 0) or leave tis.floor at 0")
        if self.floor and not IS_LEVELS[self.level].reads_floor:
            raise ValueError(f"tis.floor={self.floor} is TRL's clip_min, read by its modes "
                             f"({', '.join(n for n, m in IS_LEVELS.items() if m.reads_floor)}); "
                             f"tis.level={self.level!r} ({IS_LEVELS[self.level].reference}) "
                             f"does not read it")
        grpo_only(cfg, "tis", self, "level", "floor")


def _trainer_rows(policy, cfg, r, ctx) -> dict:
    """The trainer's own log-probs of the sampled tokens: pi_old for truncated IS."""
    if not len(r.completion_ids):
        return {}
    forward = UPDATE_FORWARDS[cfg.speed.update_forward]
    return {"old": completion_logprobs(policy, r, cfg.temperature, forward=forward)}  # (N_r, Tc)


def _tis_stats(cfg, t: Tokens, w):
    n = max(int(t.mask.sum()), 1)
    return {"sample/logprob_gap": float((t.old - t.sampler).abs()[t.mask].sum()) / n,
            "sample/tis_capped_frac": float((w[t.mask] >= cfg.tis.cap).sum()) / n}


register_variant("tis", lambda cfg: bool(cfg.tis.cap), settings=TIS, rows=_trainer_rows,
                 loss_rows=("old",),
                 weight=lambda cfg, t: is_weight(cfg.tis.level, t.old, t.sampler, t.mask,
                                                 cfg.tis.cap, cfg.tis.floor),  # token: min(w, C)
                 reject=lambda cfg, rows, r: rejected_rows(cfg.tis.level, rows["old"],
                                                           r.logprobs, r.policy_mask, cfg.tis.cap),
                 stats=_tis_stats,
                 stat_keys=lambda cfg: ("sample/logprob_gap", "sample/tis_capped_frac"),
                 description="truncated IS of the trainer's pi_old against the sampler's")


@dataclass
class OffPolicyMask:
    """DeepSeek-V3.2's off-policy sequence mask (eq. 9; TRL's off_policy_mask_threshold)."""
    delta: float = 0.0
    """A completion with A < 0 whose mean log(pi_sampler / pi) exceeds this delta leaves the
    policy gradient (TRL's example 0.5; 0 = off). Outcome supervision only."""

    def check(self, cfg):
        check_number("off_policy_mask.delta", self.delta)
        if self.delta and cfg.supervision != "outcome":
            raise ValueError("off_policy_mask reads one advantage per completion: it needs "
                             f"supervision='outcome', got {cfg.supervision!r}")
        grpo_only(cfg, "off_policy_mask", self, "delta")


register_variant("off_policy_mask", lambda cfg: bool(cfg.off_policy_mask.delta),
                 settings=OffPolicyMask,
                 weight=lambda cfg, t: off_policy_sequence_mask(
                     t.logp, t.sampler, t.advantages, t.mask, cfg.off_policy_mask.delta),
                 description="DeepSeek-V3.2: A < 0 completions far off-policy leave the gradient")


@dataclass
class TopEntropy:
    """The 80/20 mask (Wang et al. 2025; TRL's top_entropy_quantile)."""
    quantile: float = 1.0
    """Only the tokens in the top this fraction by entropy keep their policy gradient (the
    paper: 0.2; 1.0 = off)."""

    def check(self, cfg):
        check_number("top_entropy.quantile", self.quantile, lambda q: 0 < q <= 1,
                     "in (0, 1] (1 = off)")
        grpo_only(cfg, "top_entropy", self, "quantile")


register_variant("top_entropy", lambda cfg: cfg.top_entropy.quantile < 1, settings=TopEntropy,
                 weight=lambda cfg, t: high_entropy_mask(t.entropy, t.mask,
                                                         cfg.top_entropy.quantile),
                 description="Wang et al. 2025: only the high-entropy tokens keep their gradient")


# ---- the entropy bonus (loss.EntropyBonus)

register_variant("entropy_bonus", lambda cfg: cfg.entropy_bonus.coef != 0, settings=EntropyBonus,
                 term=lambda cfg, t, logp, old, real: entropy_term(t.entropy, real,
                                                                   cfg.entropy_bonus),
                 description="entropy_bonus.coef * H_t subtracted from each token's loss")


# ---- process supervision (DeepSeekMath 4.1.3)

def _process_advantages(cfg, g, cluster_ids, prompt_index, group_ids):
    sr = pad_sequence([torch.tensor(row) for row in g.step_rewards], batch_first=True)  # (N, T)
    mask = torch.arange(sr.shape[1])[None] < g.lengths[:, None]           # (N, T)
    adv = process_advantages(sr, mask, group_ids)                         # (N, T)
    return adv, adv[mask]


register_variant("process", lambda cfg: cfg.supervision == "process",
                 advantages=_process_advantages, step_rewards=True,
                 description="a reward per answer character, per-token advantages")
