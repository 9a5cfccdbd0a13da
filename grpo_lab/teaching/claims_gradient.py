"""Measurements of the GRPO gradient for the claims table (claims 11, 20, 29, 30, 32, 33): which
samples receive a gradient and how fast (backward_rows, backward_time), the gradient of a reward
made of group statistics (relative_reward_gradient), the gradient's spread with and without a
group baseline (BASELINES, baseline_variance: Williams 1992; DeepSeekMath, Shao et al. 2024,
eq. 3), what an optimizer receives (optimizer_inputs), the group-mean policy gradient against
its formula (group_mean_gradient) and the clipped surrogate against its formula
(clipped_surrogate; PPO, Schulman et al. 2017, eq. 7). claims_live.py has the arithmetic."""
from __future__ import annotations

import inspect
import math
import random
import time
from typing import Callable

import torch

from grpo_lab.algorithm.advantages import ADVANTAGES, group_stats
from grpo_lab.algorithm.loss import Clip, grpo_loss
from grpo_lab.policies.model import GPT, GPTConfig


def relative_reward_gradient(rewards=(1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.0, 1.0),
                             group_ids=(0, 0, 0, 0, 1, 1, 1, 1), T: int = 3, seed: int = 0) -> dict:
    """Claim 20: R = sigma_g - mu_g for every member of group g, then every estimator's advantage
    of R and the gradient of ``grpo_loss`` (beta 0) w.r.t. the log-probs. Returns
    {"R" (N,), "advantages" {estimator: (N,)}, "grad" (N, T), "grad_grpo" (N, T): the same loss
    with GRPO's own advantage of the rewards, for contrast}."""
    r, g = torch.tensor(rewards, dtype=torch.float64), torch.tensor(group_ids)
    inv, _, mean, std = group_stats(r, g)                                  # per group (K,)
    R = (std - mean)[inv]                                                  # (N,) one value per group
    adv = {name: fn(R, g) for name, fn in ADVANTAGES.items()}              # each (N,)
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(len(r), T, generator=gen, dtype=torch.float64)       # (N, T) log-probs
    mask = torch.ones(len(r), T, dtype=torch.bool)                         # (N, T)
    grads = {}
    for key, a in (("grad", adv["grpo"]), ("grad_grpo", ADVANTAGES["grpo"](r, g))):
        logp = old.clone().requires_grad_(True)                            # (N, T) at pi = pi_old
        grpo_loss(logp, old, a, mask)[0].backward()
        grads[key] = logp.grad                                             # (N, T)
    return {"R": R, "advantages": adv, **grads}


def backward_rows(N: int = 32, group_sizes=(2, 4, 8, 16), T: int = 4, seed: int = 0) -> dict:
    """Claim 11: for N samples split into N/G groups, how many samples' log-probs receive a
    gradient from ``grpo_loss`` (distinct rewards, GRPO advantages): {G: rows}. Always N."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randperm(N, generator=gen).double()                         # (N,) distinct rewards
    out = {}
    for G in group_sizes:
        adv = ADVANTAGES["grpo"](r, torch.arange(N) // G)                  # (N,)
        logp = torch.zeros(N, T, dtype=torch.float64, requires_grad=True)  # (N, T)
        grpo_loss(logp, logp.detach(), adv, torch.ones(N, T, dtype=torch.bool))[0].backward()
        out[G] = int((logp.grad.abs().sum(1) > 0).sum())
    return out


def backward_time(sizes=((64, 2), (64, 8), (64, 32), (16, 8), (32, 8)), T: int = 10,
                  repeats: int = 5, seed: int = 0) -> dict:
    """Claim 11, timed: forward + backward of the toy policy and ``grpo_loss`` on N sequences of
    T tokens in groups of G (N/G groups), for each (N, G) of ``sizes`` -> {(N, G): median
    seconds over ``repeats``}, interleaved so machine load hits every size alike."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig())
    ids = torch.randint(1, model.cfg.vocab_size, (max(N for N, _ in sizes), T))  # (N_max, T)
    r = torch.rand(len(ids))                                               # (N_max,)
    times = {s: [] for s in sizes}
    model(ids)[0].sum().backward()                                         # warm-up, not timed
    model.zero_grad(set_to_none=True)
    for _ in range(repeats):
        for N, G in sizes:
            adv = ADVANTAGES["grpo"](r[:N], torch.arange(N) // G)         # (N,)
            t0 = time.perf_counter()
            logits, _ = model(ids[:N])                                     # (N, T, V)
            logp = torch.log_softmax(logits, -1).gather(2, ids[:N, :, None]).squeeze(2)  # (N, T)
            grpo_loss(logp, logp.detach(), adv, torch.ones(N, T, dtype=torch.bool))[0].backward()
            times[(N, G)].append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
    return {s: sorted(ts)[len(ts) // 2] for s, ts in times.items()}


def _grad_moments(sums: torch.Tensor, sq: float, draws: int) -> dict:
    mean = sums / draws                                                    # (P,)
    var = (sq - draws * float(mean @ mean)) / (draws - 1)                  # trace of the covariance
    return {"var": var, "mean_sq": float(mean @ mean), "noise_to_signal": var / float(mean @ mean)}


def minus_group_mean(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """r_i - mean of r_i's group: (N,) -> (N,), the baseline without GRPO's division by std."""
    inv, _, mean, _ = group_stats(rewards, group_ids)                     # (N,), (K,)
    return rewards.double() - mean[inv]                                    # (N,)


BASELINES: dict[str, Callable] = {   # claim 29: advantage from (rewards (N,), group ids (N,))
    "none": lambda r, g: r.double(),                                       # REINFORCE, no baseline
    "group mean": minus_group_mean,
    "grpo": ADVANTAGES["grpo"],                                            # (r - mean) / std
}


def baseline_variance(seed: int = 0, prompts: int = 8, G: int = 8, draws: int = 16,
                      task: str = "addition", aggregation: str = "dr_grpo") -> dict:
    """Claim 29: the spread of the policy-gradient estimate with and without a group baseline.

    The base toy policy, ``prompts`` fixed prompts of ``task``; ``draws`` times: sample G
    completions per prompt, score them (the defaults' reward weights), and take the gradient of
    ``grpo_loss`` (beta 0, at pi = pi_old: the plain policy gradient) once per advantage of
    ``BASELINES`` on the same samples. -> {name: {"var": trace of the gradient's covariance over
    draws, "mean_sq": ||mean gradient||^2, "noise_to_signal": var / mean_sq, "scale_vs_none":
    the mean gradient projected on no-baseline's, over its norm^2}}. The GRPO row is divided by
    the group's std, so compare it by noise_to_signal, not var. ``aggregation`` "dr_grpo" sums
    tokens over a constant (DeepSeekMath's 1/|o_i| would make the baseline term depend on the
    sample's length, and so not vanish in expectation). About 0.2 s a draw of 64 samples."""
    from grpo_lab.training.config import preset
    from grpo_lab.policies.policy import load_for
    from grpo_lab.algorithm.rollout import completion_logprobs, sample_and_score
    from grpo_lab.training.step import max_new_tokens
    from grpo_lab.tasks import get_task
    from grpo_lab.tasks.rewards import resolve_rewards
    if draws < 2:
        raise ValueError(f"draws must be >= 2 to estimate a variance, got {draws}")
    cfg = preset("defaults", task=task)
    torch.manual_seed(seed)
    policy = load_for(cfg)
    params = [p for p in policy.parameters() if p.requires_grad]
    rng = random.Random(seed)
    examples = [get_task(task).draw(rng) for _ in range(prompts)]
    gen = torch.Generator().manual_seed(seed)
    sums = {b: torch.zeros(sum(p.numel() for p in params), dtype=torch.float64) for b in BASELINES}
    sq, rewards = {b: 0.0 for b in BASELINES}, resolve_rewards(cfg.reward_weights)
    for _ in range(draws):
        s = sample_and_score(policy, examples, G, max_new_tokens(cfg), rewards,
                             temperature=cfg.temperature, generator=gen)
        logp = completion_logprobs(policy, s.rollout, cfg.temperature)    # (N, Tc)
        mask = s.rollout.completion_mask                                   # (N, Tc)
        for b, fn in BASELINES.items():
            adv = fn(s.rewards, s.rollout.prompt_index).float()            # (N,)
            loss = grpo_loss(logp, logp.detach(), adv, mask, aggregation=aggregation,
                             max_len=max_new_tokens(cfg))[0]
            flat = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params, retain_graph=True)])
            sums[b] += flat.double()                                       # (P,)
            sq[b] += float(flat.double() @ flat.double())
    out = {b: _grad_moments(sums[b], sq[b], draws) for b in BASELINES}
    for b in BASELINES:     # the mean gradient along no-baseline's: 1 unbiased, (G-1)/G group mean
        out[b]["scale_vs_none"] = float(sums[b] @ sums["none"] / (sums["none"] @ sums["none"]))
    return out


def optimizer_inputs() -> dict:
    """Claim 30: what ``torch.optim.Optimizer.step`` receives (besides the parameters and their
    .grad it already holds) against what the GRPO objective needs."""
    step = [p for p in inspect.signature(torch.optim.Optimizer.step).parameters if p != "self"]
    loss = [p for p, v in inspect.signature(grpo_loss).parameters.items() if v.default is inspect._empty]
    return {"optimizer_step": step, "grpo_loss": loss}


def group_mean_gradient(rewards=(1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0), T: int = 4, V: int = 5,
                        seed: int = 0) -> dict:
    """Claim 32: the group-mean policy gradient, (1/G) sum_i (r_i - mean r) grad log pi(o_i), on a
    policy of free logits theta (T, V) with G sampled T-token completions, against the gradient
    of ``grpo_loss`` (dr_grpo advantages r - mean r, its aggregation over the constant G T, at
    ratio 1). The loss divides by T too, so -T grad(loss) is the formula. -> {"max_diff": the
    largest |difference| over theta, "loss": the loss's value (0: the advantages sum to 0),
    "grad_norm": ||grad(loss)||}."""
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(T, V, generator=gen, dtype=torch.float64, requires_grad=True)   # (T, V)
    r = torch.tensor(rewards, dtype=torch.float64)                         # (G,)
    G = len(r)
    o = torch.multinomial(torch.softmax(theta.detach(), -1), G, replacement=True, generator=gen).T  # (G, T)
    logp = torch.log_softmax(theta, -1).gather(1, o.T).T                   # (G, T) log pi(o_it)
    A = ADVANTAGES["dr_grpo"](r, torch.zeros(G, dtype=torch.long))         # (G,) r_i - mean r
    loss = grpo_loss(logp, logp.detach(), A, torch.ones(G, T, dtype=torch.bool),
                     aggregation="dr_grpo", max_len=T)[0]
    (g_loss,) = torch.autograd.grad(loss, theta, retain_graph=True)       # (T, V)
    formula = sum(A[i] * torch.autograd.grad(logp[i].sum(), theta, retain_graph=True)[0]
                  for i in range(G)) / G                                   # (T, V)
    return {"max_diff": float((-T * g_loss - formula).abs().max()), "loss": float(loss.detach()),
            "grad_norm": float(g_loss.norm()), "G": G, "T": T}


def clipped_surrogate(ratios=tuple(0.55 + 0.1 * i for i in range(11)), eps: float = 0.2) -> dict:
    """Claim 33: ``grpo_loss`` on one token at each ratio, with A = +1 and -1, against the clipped
    surrogate -min(ratio A, clip(ratio, 1 - eps, 1 + eps) A) computed by hand; and where its
    gradient is 0: exactly where the clip is active (ratio > 1 + eps with A > 0, ratio < 1 - eps
    with A < 0). -> {"cases", "max_diff", "zero_grad_where_clipped": bool}."""
    diffs, zero_ok = [], True
    for rho in ratios:
        for a in (1.0, -1.0):
            logp = torch.tensor([[math.log(rho)]], dtype=torch.float64, requires_grad=True)  # (1, 1)
            old = torch.zeros(1, 1, dtype=torch.float64)                   # (1, 1): ratio = rho
            loss = grpo_loss(logp, old, torch.tensor([a]), torch.ones(1, 1, dtype=torch.bool),
                             Clip(eps, eps))[0]
            (g,) = torch.autograd.grad(loss, logp)                         # ratios stay off 1 +- eps
            diffs.append(abs(float(loss.detach()) + min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a)))
            clipped = (rho > 1 + eps and a > 0) or (rho < 1 - eps and a < 0)
            zero_ok &= (float(g) == 0.0) == clipped
    return {"cases": len(diffs), "max_diff": max(diffs), "zero_grad_where_clipped": zero_ok}
