"""The write-ups' own formulas and group recipes, computed, for the claims table (claims 38-40):
scores that add quantities of different units (mixed_unit_scores), how GRPO weights a token of a
long completion (length_weight; Dr. GRPO, Liu et al. 2025, section 3.1) and what an advantage
does when one group mixes two prompts (mixed_group). Each is a few lines of arithmetic on
numbers chosen to show the effect; claims_live.py prints them.
"""
from __future__ import annotations

import numpy as np
import torch

from grpo_lab.algorithm.advantages import ADVANTAGES
from grpo_lab.algorithm.loss import grpo_loss


def importance_000(history: np.ndarray, grad: np.ndarray) -> float:
    """The first write-up's gradient importance, as printed there: 0.7 * var(history, axis 0)
    averaged + 0.3 * ||grad||. The first term is in (gradient units)^2, the second in gradient
    units and grows with the tensor's size."""
    return 0.7 * float(np.var(history, axis=0).mean()) + 0.3 * float(np.linalg.norm(grad))


def mixed_unit_scores(scales=(1.0, 1024.0)) -> dict:
    """Claim 38. (a) Two gradients, the same loss multiplied by each of ``scales`` (1024: the
    fp16 loss scale): a small fluctuating tensor (100 entries, history +-1, so var 1, norm 10)
    and a large steady one (40,000 entries, history +-0.1: var 0.01, norm 20). (b) The third
    write-up's HPM = alpha FLOPS + beta bandwidth - gamma latency, alpha = beta = gamma = 1, for
    two nodes in SI units and in TFLOPS, GB/s, us; then each node's time on a compute-bound and
    a bandwidth-bound job (work / FLOP/s + bytes / bandwidth + latency)."""
    def tensor(n, a):                                   # history: two steps, +a and -a per entry
        return np.stack([np.full(n, a), np.full(n, -a)]), np.full(n, a)
    small, large = tensor(100, 1.0), tensor(40_000, 0.1)
    importance = {s: {"small": importance_000(small[0] * s, small[1] * s),
                      "large": importance_000(large[0] * s, large[1] * s)} for s in scales}
    nodes = {"A": {"flops": 100e12, "bw": 3000e9, "lat": 10e-6},
             "B": {"flops": 200e12, "bw": 1500e9, "lat": 10e-6}}
    hpm = {"SI": {k: v["flops"] + v["bw"] - v["lat"] for k, v in nodes.items()},
           "TFLOPS, GB/s, us": {k: v["flops"] / 1e12 + v["bw"] / 1e9 - v["lat"] * 1e6 for k, v in nodes.items()}}
    jobs = {"compute-bound": (1e12, 1e9), "bandwidth-bound": (1e10, 30e9)}     # (FLOPs, bytes)
    time_s = {j: {k: f / v["flops"] + b / v["bw"] + v["lat"] for k, v in nodes.items()}
              for j, (f, b) in jobs.items()}
    return {"importance": importance, "nodes": nodes, "hpm": hpm, "time_s": time_s}


def length_weight(lengths=(4, 16, 64), advantage: float = 1.0) -> dict:
    """Claim 39: the gradient of ``grpo_loss`` w.r.t. each token's log-prob, one completion of each
    length, every one with the same advantage (at pi = pi_old, no clip), under GRPO's
    aggregation (1/G sum_i 1/|o_i| sum_t) and Dr. GRPO's (a constant in place of |o_i|):
    {aggregation: {length: (per token, summed over the completion)}}."""
    N, T = len(lengths), max(lengths)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]          # (N, T)
    adv = torch.full((N,), advantage, dtype=torch.float64)                    # (N,)
    out = {}
    for agg in ("seq_mean_token_mean", "dr_grpo"):
        logp = torch.zeros(N, T, dtype=torch.float64, requires_grad=True)    # (N, T)
        grpo_loss(logp, logp.detach(), adv, mask, aggregation=agg, max_len=T)[0].backward()
        g = -logp.grad                                                         # (N, T) ascent weight
        out[agg] = {n: (float(g[i, 0]), float(g[i].sum())) for i, n in enumerate(lengths)}
    return out


def mixed_group(rewards=(0.9, 0.7, 0.3, 0.1), prompts=(0, 0, 1, 1)) -> dict:
    """Claim 40: GRPO's advantages of the same four completions grouped by prompt and in one
    group (prompt 0 easy, prompt 1 hard; graded rewards), the completions whose sign differs,
    and one prompt's group whose rewards are all equal."""
    r = torch.tensor(rewards, dtype=torch.float64)                            # (N,)
    by_prompt = ADVANTAGES["grpo"](r, torch.tensor(prompts))                   # (N,)
    one = ADVANTAGES["grpo"](r, torch.zeros(len(r), dtype=torch.long))         # (N,)
    flips = [i for i in range(len(r)) if (by_prompt[i] > 0) != (one[i] > 0)]
    equal = ADVANTAGES["grpo"](torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.long))
    return {"by_prompt": by_prompt.tolist(), "one_group": one.tolist(), "flips": flips,
            "equal": equal.tolist()}
