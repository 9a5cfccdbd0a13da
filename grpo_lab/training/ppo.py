"""PPO (Schulman et al. 2017; for language models Ouyang et al. 2022) as an objective of the one
trainer: ``objective="ppo"`` = ``collect_ppo`` (sample as GRPO does, rewards on the last token,
the critic's values, GAE(lambda), whitened advantages) and ``ppo_objective`` (the clipped
surrogate of loss.py on per-token advantages + vf_coef * the clipped value loss).

The critic itself (GAE, the value loss) is critic.py, its networks (``ValueHead``,
``ValueNetwork``) model.py. The critic (``cfg.ppo.critic``, ``CRITICS``) is attached by ``attach_critic`` as
``policy.value_head``, so the one optimizer trains it (its own lr: ``cfg.ppo.vf_lr``) and
checkpoints hold it; ``PPOConfig`` (``TrainConfig.ppo``) holds PPO's settings. One process,
the toy policy, outcome rewards (config.py checks).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from grpo_lab.algorithm.critic import (explained_variance, gae, logprobs_and_values,
                                       outcome_rewards, value_loss, whiten)
from grpo_lab.agents.environments import refuse_environment_tasks
from grpo_lab.policies.model import ValueHead, ValueNetwork
from grpo_lab.algorithm.loss import grpo_loss
from grpo_lab.training.ppo_config import PPOConfig  # noqa: F401 (TrainConfig.ppo)
from grpo_lab.algorithm.rollout import completion_logprobs
from grpo_lab.training.step import logged_stats, max_new_tokens, register_objective, score_draw


PPO_STATS = ("loss/total", "loss/kl", "clip/low_frac", "clip/high_frac", "clip/ratio_mean",
             "policy/entropy", "ppo/value_loss", "ppo/explained_variance")


class PPOBatch(NamedTuple):
    """One PPO step's data (one process): completions and the critic's view of them."""
    scored: object                # rollout.Scored: N = B*G rows
    advantages: torch.Tensor      # (N, Tc) GAE, whitened over the batch's real tokens
    returns: torch.Tensor         # (N, Tc) the critic's targets
    old_values: torch.Tensor      # (N, Tc) the critic's values at sampling time
    ref_logprobs: torch.Tensor | None  # (N, Tc), None when beta == 0
    n_rows: int
    n_tokens: int
    metrics: dict


@torch.no_grad()
def collect_ppo(policy, cfg, step: int, ctx) -> PPOBatch:
    """B prompts, G completions each (as GRPO samples them) -> rewards on the last token ->
    the critic's values -> GAE -> whitened advantages."""
    if ctx.group.world > 1:
        raise ValueError(f"objective='ppo' runs on one process for now, not {ctx.group.world}")
    if not hasattr(policy, "value_head"):
        raise ValueError("objective='ppo' needs policy.value_head (the trainer attaches one)")
    scored = score_draw(cfg, ctx, step, policy, 0)[1]   # no dynamic sampling (config.py)
    r = scored.rollout
    mask = r.completion_mask                                               # (N, Tc)
    _, _, values = logprobs_and_values(policy, r, cfg.temperature)
    values = values.cpu()
    adv, ret = gae(outcome_rewards(scored.rewards, mask), values, mask, cfg.ppo.gamma,
                   cfg.ppo.gae_lambda)
    ref_logp = completion_logprobs(ctx.ref, r, cfg.temperature).cpu() if cfg.kl.beta else None
    lengths = mask.sum(1)
    metrics = {
        "reward/mean": float(scored.rewards.mean()),
        "reward/std": float(scored.rewards.std()) if len(scored.rewards) > 1 else 0.0,
        **{f"reward/{k}": float(v.mean()) for k, v in scored.parts.items()},
        "adv/abs_mean": float(adv[mask].abs().mean()),
        "completion/mean_len": float(lengths.float().mean()),
        "completion/stopped_frac": float(r.stopped.float().mean()),
    }
    return PPOBatch(scored, whiten(adv, mask), ret, values, ref_logp, len(lengths),
                    int(lengths.sum()), metrics)


def ppo_objective(policy, batch: PPOBatch, cfg, world: int = 1):
    """Clipped surrogate on the GAE advantages (loss.grpo_loss, (N, T) advantages, optional
    beta KL as GRPO) + vf_coef * the clipped value loss -> (loss, shares)."""
    r = batch.scored.rollout
    logp, entropy, values = logprobs_and_values(policy, r, cfg.temperature)
    dev = logp.device
    m = r.completion_mask.to(dev)
    pg_loss, stats = grpo_loss(logp, r.logprobs.to(dev), batch.advantages.to(dev), m, cfg.clip,
                               cfg.kl, aggregation=cfg.loss.aggregation, max_len=max_new_tokens(cfg),
                               ref_logp=batch.ref_logprobs)
    returns = batch.returns.to(dev)
    vf_loss = value_loss(values, batch.old_values.to(dev), returns, m, cfg.ppo.vf_clip)
    loss = pg_loss + cfg.ppo.vf_coef * vf_loss
    n_tok = int(m.sum())
    stats.update({"loss/total": float(loss.detach()),
                  "policy/entropy": float(entropy.detach()[m].sum()) / max(n_tok, 1),
                  "ppo/value_loss": float(vf_loss.detach()),
                  "ppo/explained_variance": explained_variance(values.detach(), returns, m)})
    return loss * world, {k: stats[k] for k in logged_stats(PPO_STATS, cfg)}  # shares = values


# the critics a PPO run can train: (policy, load) -> the module attached as policy.value_head
CRITICS = {"head": lambda policy, load: ValueHead(policy.cfg.n_embd),
           "network": lambda policy, load: ValueNetwork(load())}


def attach_critic(policy, cfg, load) -> None:
    """The critic as ``policy.value_head``, trained by the one optimizer: a ``ValueHead`` on
    the policy's hidden states ("head"), or a ``ValueNetwork`` on a second copy of the base
    (``load()``, "network")."""
    policy.value_head = CRITICS[cfg.ppo.critic](policy, load)


def check_ppo(cfg) -> None:
    """What PPO here does not support (yet): the critic, not a group, gives the baseline."""
    refuse_environment_tasks(cfg)                  # episodes are objective='agent''s
    for name, value, runs in (("dynamic.sampling", cfg.dynamic.sampling, False),
                              ("grouping", cfg.grouping, "by_prompt"),
                              ("supervision", cfg.supervision, "outcome"),
                              ("policy", cfg.policy, "toy")):
        if value != runs:
            raise ValueError(f"objective='ppo' does not support {name}="
                             f"{value!r} (yet): the critic, not a group, gives "
                             f"the baseline; PPO runs the toy policy, outcome rewards, "
                             f"grouping='by_prompt', no dynamic sampling")
    if cfg.kl.beta and not cfg.kl.in_loss():        # collect_ppo shapes no reward
        raise ValueError(f"objective='ppo' puts beta * KL in the loss, not kl.placement={cfg.kl.placement!r}")


register_objective("ppo", collect_ppo, ppo_objective, needs_group=False, splits=False,
                   critic=True, prepare=attach_critic, check=check_ppo,
                   description="PPO with a learned critic: GAE advantages, value loss")
