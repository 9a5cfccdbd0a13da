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
    kl_reward       beta * the completion's KL estimate subtracted from its reward (kl_in)
    kl_loss         beta * KL_t added to each token's loss (DeepSeekMath eq. 3, 4)
    tis             truncated IS of the trainer against the sampler (tis_cap, token_weights.py)
    off_policy_mask DeepSeek-V3.2 eq. 9 (off_policy_mask)
    top_entropy     the 80/20 high-entropy token mask (top_entropy_quantile)
    entropy_bonus   - entropy_coef * H_t added to each token's loss
    process         process supervision: per-token advantages from step rewards (DeepSeekMath
                    4.1.3, advantages.process_advantages)
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from grpo_lab.algorithm.advantages import process_advantages
from grpo_lab.algorithm.loss import KL_PLACEMENTS, kl_term, sequence_kl
from grpo_lab.algorithm.overlong import OVERLONG
from grpo_lab.algorithm.rollout import completion_logprobs
from grpo_lab.machine import add_time, now
from grpo_lab.algorithm.token_weights import (high_entropy_mask, is_weight,
                                              off_policy_sequence_mask)
from grpo_lab.registry import check_new


class Tokens(NamedTuple):
    """What the objective's hooks read. ``weight`` hooks see all this rank's rows; ``term``
    hooks the rows in the loss (and the padded logp, old, real that surrogate_loss gives its
    terms); ``stats`` hooks all rows with ``mask`` = the tokens kept in the loss."""
    logp: torch.Tensor            # (N, T) policy log-probs, with their graph
    old: torch.Tensor             # (N, T) pi_old: the trainer's (tis) or the sampler's
    sampler: torch.Tensor         # (N, T) the sampler's log-probs
    entropy: torch.Tensor | None  # (N, T) policy entropy (with its graph if entropy_coef)
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
    weight: Callable | None = None
    term: Callable | None = None
    stats: Callable | None = None
    stat_keys: Callable | None = None
    loss_rows: tuple = ()         # the ``rows`` entries the loss reads
    step_rewards: bool = False    # the ranks gather per-token rewards (process supervision)
    description: str = ""


VARIANTS: dict[str, StepVariant] = {}


def register_variant(name: str, active: Callable, **hooks) -> StepVariant:
    """Add a step variant ``(active(cfg) -> bool, hooks...)`` -> its record; called by the step
    after the ones registered before it. The registry's naming rule (registry.check_new)."""
    check_new(VARIANTS, "step variant", name, active, lambda v: v.active)
    if hooks.get("term") is not None:
        _check_term(name, hooks["term"])
    VARIANTS[name] = StepVariant(name, active, **hooks)
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


def step_variant(name: str, **hooks):
    """The decorator form: ``@step_variant("x", shape_rewards=...)`` over ``active(cfg)``."""
    return lambda active: register_variant(name, active, **hooks)


def active_variants(cfg) -> list[StepVariant]:
    """The variants ``cfg`` turns on, in registration order (the same on every rank)."""
    return [v for v in VARIANTS.values() if v.active(cfg)]


# ---- overlong (DAPO sec. 3.4)

def _overlong_penalty(cfg, s, rows, max_len):
    pen = cfg.overlong_penalty * OVERLONG[cfg.overlong].penalty(
        s.rollout.completion_mask.sum(1), max_len, cfg.overlong_buffer)    # (N_r,)
    return s._replace(rewards=s.rewards + pen, parts={**s.parts, "overlong": pen})


def _overlong_keep(cfg, stopped):
    rule = OVERLONG[cfg.overlong]
    return rule.keep(stopped), rule.counts_dropped                         # (N,) rows in the loss


register_variant("overlong", lambda cfg: cfg.overlong != "none",
                 shape_rewards=lambda cfg, s, rows, max_len: (
                     _overlong_penalty(cfg, s, rows, max_len)
                     if OVERLONG[cfg.overlong].penalty is not None else s),
                 keep=_overlong_keep,
                 description="DAPO's overlong rules: a soft length penalty, or truncated "
                             "rows out of the loss")


# ---- the KL term: in the reward or in the loss (loss.KL_PLACEMENTS)

def _ref_rows(policy, cfg, r, ctx) -> dict:
    """The frozen reference's log-probs of this rank's completion tokens (time/ref_s)."""
    if not len(r.completion_ids):
        return {}
    t = now()
    ref = completion_logprobs(ctx.ref, r, cfg.temperature, forward=cfg.update_forward)
    add_time(ctx.clock, "time/ref_s", now() - t)
    return {"ref": ref}                                                    # (N_r, Tc)


def _kl_reward(cfg, s, rows, max_len):
    r = s.rollout
    kl = (torch.zeros(0) if "ref" not in rows else                        # a rank with no rows
          sequence_kl(r.logprobs, rows["ref"], r.completion_mask, cfg.kl_estimator))  # (N_r,)
    return s._replace(rewards=s.rewards - cfg.beta * kl,
                      parts={**s.parts, f"kl_{cfg.kl_estimator}": kl})


def _kl_term(cfg, t: Tokens, logp, old, real):
    """beta * KL_it in each token's loss and loss/kl, loss/kl_<estimator> (loss.kl_term)."""
    return kl_term(logp, old, t.rows["ref"], real, cfg.beta, cfg.kl_estimator,
                   cfg.log_ratio_clamp, cfg.kl_clamp, cfg.kl_bias_correction)


register_variant("kl_reward", lambda cfg: bool(cfg.beta) and KL_PLACEMENTS[cfg.kl_in].in_reward,
                 rows=_ref_rows, shape_rewards=_kl_reward,
                 description="InstructGPT-style: beta * the completion's KL estimate off its "
                             "reward (kl_in='reward')")
register_variant("kl_loss", lambda cfg: bool(cfg.beta) and KL_PLACEMENTS[cfg.kl_in].in_loss,
                 rows=_ref_rows, term=_kl_term, loss_rows=("ref",),
                 stat_keys=lambda cfg: ("loss/kl", f"loss/kl_{cfg.kl_estimator}"),
                 description="DeepSeekMath: beta * KL_t in each token's loss (kl_in='loss')")


# ---- weights on the policy-gradient term (token_weights.py)

def _trainer_rows(policy, cfg, r, ctx) -> dict:
    """The trainer's own log-probs of the sampled tokens: pi_old for truncated IS."""
    if not len(r.completion_ids):
        return {}
    return {"old": completion_logprobs(policy, r, cfg.temperature,
                                       forward=cfg.update_forward)}        # (N_r, Tc)


def _tis_stats(cfg, t: Tokens, w):
    n = max(int(t.mask.sum()), 1)
    return {"sample/logprob_gap": float((t.old - t.sampler).abs()[t.mask].sum()) / n,
            "sample/tis_capped_frac": float((w[t.mask] >= cfg.tis_cap).sum()) / n}


register_variant("tis", lambda cfg: bool(cfg.tis_cap), rows=_trainer_rows, loss_rows=("old",),
                 weight=lambda cfg, t: is_weight(cfg.tis_level, t.old, t.sampler, t.mask,
                                                 cfg.tis_cap),  # Yao et al. 2025: min(w, C)
                 stats=_tis_stats,
                 stat_keys=lambda cfg: ("sample/logprob_gap", "sample/tis_capped_frac"),
                 description="truncated IS of the trainer's pi_old against the sampler's")
register_variant("off_policy_mask", lambda cfg: bool(cfg.off_policy_mask),
                 weight=lambda cfg, t: off_policy_sequence_mask(
                     t.logp, t.sampler, t.advantages, t.mask, cfg.off_policy_mask),  # eq. 9
                 description="DeepSeek-V3.2: A < 0 completions far off-policy leave the gradient")
register_variant("top_entropy", lambda cfg: cfg.top_entropy_quantile < 1,
                 weight=lambda cfg, t: high_entropy_mask(t.entropy, t.mask,
                                                         cfg.top_entropy_quantile),
                 description="Wang et al. 2025: only the high-entropy tokens keep their gradient")


# ---- the entropy bonus

register_variant("entropy_bonus", lambda cfg: cfg.entropy_coef != 0,
                 term=lambda cfg, t, logp, old, real: (
                     -cfg.entropy_coef * torch.where(real, t.entropy, 0.0), {}),
                 description="entropy_coef * H_t subtracted from each token's loss")


# ---- process supervision (DeepSeekMath 4.1.3)

def _process_advantages(cfg, g, cluster_ids, prompt_index, group_ids):
    T = max(len(x) for x in g.step_rewards)
    sr = torch.zeros(len(g.step_rewards), T)                              # (N, T)
    mask = torch.arange(T)[None] < g.lengths[:, None]                     # (N, T)
    for i, row in enumerate(g.step_rewards):
        sr[i, :len(row)] = torch.tensor(row)
    adv = process_advantages(sr, mask, group_ids)                         # (N, T)
    return adv, adv[mask]


register_variant("process", lambda cfg: cfg.supervision == "process",
                 advantages=_process_advantages, step_rewards=True,
                 description="a reward per answer character, per-token advantages")
