"""Group-relative advantages: each sample's reward judged against its group.

GRPO (DeepSeekMath sec. 4.1.2, outcome supervision) sets every token's advantage to the
sample's normalised reward A_i = (r_i - mean(r_group)) / std(r_group): the group is the
baseline, so no value network is needed. Siblings with one signature
``(rewards (N,), group_ids (N,)) -> advantages (N,)``, collected in ``ADVANTAGES``:

  * ``grpo``:      (r - mean) / (std + eps), std with Bessel's correction (as TRL).
  * ``dr_grpo``:   r - mean (Dr. GRPO, Liu et al. 2025: dividing by std biases towards
                   questions that are too easy or too hard).
  * ``rloo``:      r_i - mean of the *other* members (Ahmadian et al. 2024),
                   equal to n/(n-1) * (r - mean).
  * ``rank``:      rank-based, robust to the reward's scale and outliers. Within a group
                   of n, rank_i = 1 + #{r_j < r_i} + (#{r_j == r_i} - 1) / 2 (ties get
                   their average rank), then A_i = 2 (rank_i - 1) / (n - 1) - 1 in [-1, 1].
                   Average ranks sum to n (n + 1) / 2, so A is centred per group. Pairwise
                   (N, N) comparison: plain, O(N^2) memory, fine for the few thousand rows
                   of a step.
  * ``batch_std``: subtract the group mean, divide by the std (Bessel) of those centred
                   rewards over the whole batch, one value per completion, so a group of
                   near-equal rewards is not blown up as by a per-group std. It is neither
                   REINFORCE++-baseline (below: verl whitens per *token*, and subtracts the
                   token-weighted mean again) nor TRL's ``scale_rewards="batch"`` / Lite PPO
                   (Liu et al. 2025), which divide by the batch std of the *raw* rewards;
                   with per-prompt groups those differ by the between-group part.
  * ``mean_centred``: r - mean, the advantage of Dr. GRPO alone (the same function as
                   ``dr_grpo``). Dr. GRPO is that advantage *and* the constant normaliser of
                   the dr_grpo aggregation: ``method="dr_grpo"`` sets both; the config refuses
                   advantage="dr_grpo" with another aggregation (half the method).
  * ``reinforce_pp_baseline``: REINFORCE++-baseline (Hu et al. 2025, as verl's
                   ``compute_reinforce_plus_plus_baseline_outcome_advantage``): c_i = r_i -
                   mean of its group, put on each of the completion's L_i tokens, then
                   whitened over all the batch's tokens (verl's ``masked_whiten``):
                       mu = sum_i L_i c_i / sum_i L_i,
                       var = sum_i L_i (c_i - mu)^2 / (sum_i L_i - 1),
                       A_i = (c_i - mu) / sqrt(var + 1e-8)
                   so long completions weigh more in the statistics and A is not exactly
                   group-centred. It reads the lengths (``needs_lengths``: the trainer passes
                   them); called as ``(rewards, group_ids)`` alone every completion counts as
                   one token. Deviations: with fewer than 2 tokens in the batch (no variance)
                   A = 0, where verl raises; a group of one has c = 0 (as in every estimator
                   here), where verl takes that group's mean as 0 (c = r).

``group_ids`` are any integers; samples sharing an id form a group, of any size, so the
same functions serve canonical per-prompt groups and the grouping strategies of
``grouping.py``. A group whose rewards are all equal, or a group of one, gets advantage
0, never NaN.

Inputs are coerced once (``as_rewards``): tensors, lists and numpy arrays are accepted;
integer or bool rewards become the default float dtype (float32), float rewards keep
their dtype. Every estimator computes in float64 and returns the rewards' float dtype;
a non-finite reward is an error naming its sample, and so is an advantage that does not
fit the output dtype (rloo of rewards -3e38 and 3e38 is -/+6e38, past float32's 3.4e38).

A prompt-level cluster (``grouping.py``) meets the G completions of each of its prompts in
one of two ways, siblings with one signature in ``COMBINE``, called by ``grouped_advantages``:

  * ``cluster``:   group id per completion = its prompt's cluster id; any estimator of
                   ``ADVANTAGES`` runs on it (baseline = mean over the whole cluster).
  * ``within_prompt_pooled_std``: baseline = the prompt's own mean, scale = the
                   within-prompt std pooled over the cluster, A = (r - mean_prompt) /
                   (pooled_std + eps). With one prompt per cluster this is exactly ``grpo``.

Then the diagnostics of one step's groups and advantages, as dicts of metric names
(docs/reference/metrics.md defines each): ``group/within_var`` (mean over groups of the
unbiased reward variance, 0 for a group of one), ``group/zero_std_frac`` (share of groups
whose rewards are all equal: no signal), ``group/size_*`` (rows per group), ``adv/var``
(population variance) and ``adv/between_prompt_frac`` (the share of it between prompts,
var(per-prompt mean, per row) / var, 0 without variance: by-prompt GRPO centres every
prompt, so 0; a cluster baseline pushes all completions of an easy prompt up, of a hard one
down, whichever was better); and the filter of dynamic sampling
(DAPO, Yu et al. 2025, sec. 3.2): ``informative_groups`` keeps groups whose rewards differ
(step.dynamic_draws applies it to per-prompt groups). Deviation: it accepts any group ids,
not only prompts.
"""
from __future__ import annotations

import numpy as np
import torch

from grpo_lab.registry import check_new, lookup
from grpo_lab.timelimit import guard

EPS = 1e-4


def as_rewards(rewards, group_ids, eps=EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (rewards (N,) floating point, group_ids (N,) integer), or a ValueError naming what is
    wrong: shapes, N = 0, complex rewards, group ids not integers, a non-finite reward, eps not > 0."""
    rewards, group_ids = torch.as_tensor(rewards), torch.as_tensor(group_ids)
    if not rewards.is_floating_point() and not rewards.is_complex():
        rewards = rewards.to(torch.get_default_dtype())                    # ints, bools -> float
    d = group_ids.dtype
    if not (rewards.is_floating_point() and rewards.dim() == 1 and rewards.shape == group_ids.shape
            and len(rewards) and not (d.is_floating_point or d.is_complex or d == torch.bool)
            and bool(torch.isfinite(rewards).all()) and 0 < eps < np.inf):   # NaN: False
        _refuse_rewards(rewards, group_ids, eps)
    return rewards, group_ids


def _refuse_rewards(rewards: torch.Tensor, group_ids: torch.Tensor, eps=EPS):
    """The error ``as_rewards`` raises, naming the first thing wrong."""
    if not 0 < eps < np.inf:         # 0 or NaN: an all-equal group is 0 / 0; < 0: wrong scale
        raise ValueError(f"eps must be a finite number > 0, got {eps}")
    if rewards.is_complex():
        raise ValueError(f"rewards must be real numbers, got dtype {rewards.dtype}")
    if rewards.dim() != 1 or group_ids.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(f"rewards and group_ids must be 1-D of one length, got shapes "
                         f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}")
    if rewards.numel() == 0:
        raise ValueError("no rewards (empty tensor)")
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be integers, got dtype {group_ids.dtype}")
    bad = (~torch.isfinite(rewards)).nonzero().flatten()
    i = int(bad[0])
    raise ValueError(f"reward of sample {i} is {float(rewards[i])} "
                     f"({len(bad)} non-finite rewards in all)")


def _fit(adv: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """float64 advantages -> ``dtype``; an error, not inf, where a value does not fit."""
    if bool((adv.abs() > torch.finfo(dtype).max).any()):
        _refuse_fit(adv, dtype, name)
    return adv.to(dtype)


def _refuse_fit(adv: torch.Tensor, dtype: torch.dtype, name: str):
    top = torch.finfo(dtype).max
    i = int((adv.abs() > top).nonzero()[0])
    raise ValueError(f"{name} advantage of sample {i} is {float(adv[i]):.4g}, beyond "
                     f"{dtype}'s range (+-{top:.4g}); rescale the rewards or pass float64")


def group_stats(rewards, group_ids):
    """-> (inverse (N,), count (K,), mean (K,), unbiased std (K,)) per group id, float64."""
    rewards, group_ids = as_rewards(rewards, group_ids)
    _, inv = torch.unique(group_ids, return_inverse=True)                 # (N,) in 0..K-1
    K = int(inv.max()) + 1
    r = rewards.double()
    count = torch.zeros(K, dtype=torch.float64).index_add_(0, inv, torch.ones_like(r))   # (K,)
    mean = torch.zeros(K, dtype=torch.float64).index_add_(0, inv, r) / count            # (K,)
    sq = torch.zeros(K, dtype=torch.float64).index_add_(0, inv, (r - mean[inv]) ** 2)  # (K,)
    std = (sq / (count - 1).clamp(min=1)).sqrt()                          # (K,), 0 for size 1
    return inv, count, mean, std


def grpo_advantages(rewards, group_ids, eps: float = EPS):
    rewards, group_ids = as_rewards(rewards, group_ids, eps)
    inv, _, mean, std = group_stats(rewards, group_ids)
    adv = (rewards.double() - mean[inv]) / (std[inv] + eps)                # (N,)
    return _fit(adv, rewards.dtype, "grpo")


def dr_grpo_advantages(rewards, group_ids):
    rewards, group_ids = as_rewards(rewards, group_ids)
    inv, _, mean, _ = group_stats(rewards, group_ids)
    return _fit(rewards.double() - mean[inv], rewards.dtype, "dr_grpo")   # (N,)


def rloo_advantages(rewards, group_ids):
    rewards, group_ids = as_rewards(rewards, group_ids)
    inv, count, mean, _ = group_stats(rewards, group_ids)
    n = count[inv]                                                         # (N,)
    scale = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    return _fit(scale * (rewards.double() - mean[inv]), rewards.dtype, "rloo")   # (N,)


def rank_advantages(rewards, group_ids):
    rewards, group_ids = as_rewards(rewards, group_ids)
    inv, count, _, _ = group_stats(rewards, group_ids)
    r = rewards.double()
    same = inv[:, None] == inv[None, :]                                    # (N, N)
    below = ((r[None, :] < r[:, None]) & same).sum(1)                      # (N,)
    ties = ((r[None, :] == r[:, None]) & same).sum(1)                      # (N,) self included
    rank = 1 + below + (ties - 1) / 2                                      # (N,) 1..n
    n = count[inv]                                                         # (N,)
    adv = torch.where(n > 1, 2 * (rank - 1) / (n - 1).clamp(min=1) - 1, torch.zeros_like(n))
    return adv.to(rewards.dtype)                                           # (N,) in [-1, 1]


def batch_std_advantages(rewards, group_ids, eps: float = EPS):
    rewards, group_ids = as_rewards(rewards, group_ids, eps)
    centred = dr_grpo_advantages(rewards, group_ids).double()              # (N,) r - mean_group
    std = centred.std() if centred.numel() > 1 else centred.new_zeros(())  # () over the batch
    return _fit(centred / (std + eps), rewards.dtype, "batch_std")        # (N,)


def reinforce_pp_baseline_advantages(rewards, group_ids, lengths=None):
    rewards, group_ids = as_rewards(rewards, group_ids)
    L = (torch.ones(len(rewards), dtype=torch.float64) if lengths is None else
         torch.as_tensor(lengths, dtype=torch.float64))                    # (N,) tokens per row
    if L.shape != rewards.shape or not bool(((L >= 0) & (L < torch.inf)).all()):  # NaN: False
        raise ValueError(f"lengths {tuple(L.shape)} must be (N,) = {tuple(rewards.shape)}, finite "
                         f"and >= 0, got {L.tolist()[:8]}")
    c = dr_grpo_advantages(rewards, group_ids).double()                    # (N,) r - mean_group
    n_tok = L.sum()                                                        # () real tokens
    if n_tok < 2:
        return torch.zeros_like(rewards)                                   # no variance
    mu = (L * c).sum() / n_tok                                             # () token-weighted
    var = (L * (c - mu) ** 2).sum() / (n_tok - 1)                          # () Bessel, per token
    return _fit((c - mu) / torch.sqrt(var + 1e-8), rewards.dtype, "reinforce_pp_baseline")


reinforce_pp_baseline_advantages.needs_lengths = True

ADVANTAGES = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "mean_centred": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "rank": rank_advantages,
    "batch_std": batch_std_advantages,
    "reinforce_pp_baseline": reinforce_pp_baseline_advantages,
}


def register_advantage(name: str, fn=None):
    """Add an estimator ``(rewards (N,), group_ids (N,)) -> advantages (N,)`` to ``ADVANTAGES``
    (``TrainConfig(advantage=name)``); as a decorator, ``@register_advantage("mine")``.
    Its inputs arrive coerced (float tensors); its output is checked finite by the trainer's
    loss. Re-defining the same function replaces it; another function under a taken name
    is an error. A function defined outside grpo_lab runs under the user-code time limit."""
    if fn is None:
        return lambda f: (register_advantage(name, f), f)[1]
    check_new(ADVANTAGES, "advantage estimator", name, fn)
    ADVANTAGES[name] = guard(f"advantage estimator {name!r}", fn)
    return fn


def process_advantages(step_rewards, mask, group_ids, eps: float = EPS) -> torch.Tensor:
    """Process supervision (DeepSeekMath sec. 4.1.3): a reward per step, not per sample.

    step_rewards, mask: (N, T), one step per completion token. Each step reward is
    normalised with the mean and std of *all* steps of its group; a token's advantage is
    the sum of the normalised rewards of its own and all later steps:
        A_it = sum_{j >= t} (r_ij - mean(R_g)) / (std(R_g) + eps)
    Returns (N, T), 0 on padding (whatever padding holds, even NaN, is never read).
    Inputs coerced as ``as_rewards``. Not in ``ADVANTAGES``: it needs per-step rewards.
    """
    step_rewards, mask = torch.as_tensor(step_rewards), torch.as_tensor(mask)
    group_ids = torch.as_tensor(group_ids)
    if not step_rewards.is_floating_point():
        step_rewards = step_rewards.to(torch.get_default_dtype())         # ints, bools -> float
    if step_rewards.shape != mask.shape or step_rewards.dim() != 2:
        raise ValueError(f"step_rewards {tuple(step_rewards.shape)} and mask "
                         f"{tuple(mask.shape)} must be one (N, T) shape")
    if group_ids.shape != step_rewards.shape[:1]:
        raise ValueError(f"group_ids {tuple(group_ids.shape)} must be (N,) = "
                         f"({step_rewards.shape[0]},)")
    m = mask.bool()                                                        # (N, T)
    bad = (m & ~torch.isfinite(step_rewards)).nonzero()                    # (n_bad, 2)
    if len(bad):
        i, t = bad[0].tolist()
        raise ValueError(f"step reward of sample {i}, token {t} is {float(step_rewards[i, t])} "
                         f"({len(bad)} non-finite step rewards in all)")
    flat_ids = group_ids[:, None].expand_as(step_rewards)[m]               # (S,) real steps
    inv, _, mean, std = group_stats(*as_rewards(step_rewards[m], flat_ids, eps))  # per group
    norm = torch.zeros_like(step_rewards, dtype=torch.float64)             # (N, T)
    norm[m] = (step_rewards[m].double() - mean[inv]) / (std[inv] + eps)
    adv = norm.flip(1).cumsum(1).flip(1)                                   # (N, T) sum_{j>=t}
    return _fit(adv.masked_fill(~m, 0.0), step_rewards.dtype, "process")


# ---------------------------------------------------------------- prompt clusters -> rows
def cluster_baseline(rewards, prompt_index, cluster_of_row, estimator="grpo", lengths=None):
    fn = ADVANTAGES[estimator]
    extra = {"lengths": lengths} if getattr(fn, "needs_lengths", False) else {}  # per token
    return fn(rewards.clone(), cluster_of_row, **extra)  # (N,) copied: fn may centre it


def within_prompt_pooled_std(rewards, prompt_index, cluster_of_row, estimator="grpo",
                             lengths=None):
    # pooled variance of cluster c: sum_p (n_p - 1) s_p^2 / sum_p (n_p - 1), p in c
    rewards, prompt_index = as_rewards(rewards, prompt_index)              # ints -> float
    p_inv, n_p, mean_p, std_p = group_stats(rewards, prompt_index)          # (N,), (P,) each
    cluster_p = torch.zeros_like(n_p, dtype=torch.long).scatter_(0, p_inv, cluster_of_row)  # (P,)
    _, c_inv = torch.unique(cluster_p, return_inverse=True)                # (P,) in 0..K-1
    K = int(c_inv.max()) + 1
    dof = torch.zeros(K, dtype=torch.float64).index_add_(0, c_inv, n_p - 1)               # (K,)
    ss = torch.zeros(K, dtype=torch.float64).index_add_(0, c_inv, (n_p - 1) * std_p ** 2)  # (K,)
    pooled = (ss / dof.clamp(min=1)).sqrt()                                # (K,)
    centred = rewards.double() - mean_p[p_inv]                             # (N,) r - mean_prompt
    return (centred / (pooled[c_inv[p_inv]] + EPS)).to(rewards.dtype)      # (N,)


COMBINE = {"cluster": cluster_baseline, "within_prompt_pooled_std": within_prompt_pooled_std}
INDEX_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)   # prompt_index


def grouped_advantages(cluster_ids, prompt_index: torch.Tensor, rewards: torch.Tensor,
                       combine: str = "cluster", estimator: str = "grpo",
                       lengths=None) -> torch.Tensor:
    """Cluster id per prompt (B,), prompt of each row (N,), rewards (N,) -> advantages (N,),
    checked finite, one per reward; ``estimator`` serves ``combine="cluster"`` alone."""
    if combine not in COMBINE or estimator not in ADVANTAGES:              # lookup's message
        lookup(COMBINE, combine, "combine option")
        lookup(ADVANTAGES, estimator, "estimator")
    cluster_ids = torch.as_tensor(np.asarray(cluster_ids), dtype=torch.long)  # (B,)
    prompt_index = torch.as_tensor(prompt_index)                           # (N,) lists, numpy
    if prompt_index.dtype not in INDEX_DTYPES or not bool(                 # ints, then 0..B-1
            ((prompt_index >= 0) & (prompt_index < len(cluster_ids))).all()):
        _refuse_prompt_index(prompt_index, len(cluster_ids))
    adv = COMBINE[combine](rewards, prompt_index, cluster_ids[prompt_index], estimator,
                           lengths)                                        # (N,)
    if not (torch.is_tensor(adv) and adv.shape == rewards.shape and adv.is_floating_point()
            and bool(torch.isfinite(adv).all())):
        _refuse_advantages(adv, rewards, combine, estimator)
    return adv


def _refuse_prompt_index(prompt_index: torch.Tensor, B: int):
    """The error ``grouped_advantages`` raises: prompt_index not integers, or one outside 0..B-1."""
    if prompt_index.dtype not in INDEX_DTYPES:
        raise ValueError(f"prompt_index must be integers (the prompt of each row), got dtype "
                         f"{prompt_index.dtype}: {prompt_index.flatten().tolist()[:8]}")
    outside = (prompt_index < 0) | (prompt_index >= B)
    raise ValueError(f"prompt_index holds {int(prompt_index[outside][0])} but only "
                     f"{B} prompts have a cluster id")


def _refuse_advantages(adv, rewards: torch.Tensor, combine: str, estimator: str):
    name = f"advantage estimator {estimator!r} (combine {combine!r})"
    if not torch.is_tensor(adv) or adv.shape != rewards.shape:
        got = tuple(adv.shape) if torch.is_tensor(adv) else type(adv).__name__
        raise ValueError(f"{name} returned {got} for {tuple(rewards.shape)} rewards: it must "
                         f"return one advantage per reward, a tensor shaped like them")
    if not adv.is_floating_point():           # the loss's mean of an integer tensor fails
        raise ValueError(f"{name} returned a {adv.dtype} tensor: advantages must be floating "
                         f"point, as the rewards ({rewards.dtype}) are")
    bad = (~torch.isfinite(adv)).nonzero().flatten()     # the rewards were checked finite
    raise FloatingPointError(f"{name} returned {float(adv[bad[0]])} for sample {int(bad[0])} "
                             f"({len(bad)} non-finite in all) from finite rewards")


# ---------------------------------------------------------------- one step's diagnostics
def reward_group_diagnostics(rewards: torch.Tensor, group_ids) -> dict:
    """Row-level groups -> group/within_var, /zero_std_frac, /size_mean|min|max."""
    _, count, _, std = group_stats(rewards, group_ids)                     # (K,) each
    return {"group/within_var": float((std ** 2).mean()),
            "group/zero_std_frac": float((std == 0).double().mean()),
            "group/size_mean": float(count.mean()),
            "group/size_min": int(count.min()),
            "group/size_max": int(count.max())}


def advantage_diagnostics(advantages: torch.Tensor, prompt_index=None) -> dict:
    """Advantages (N,) -> adv/var; given the prompt of each row (N,), adv/between_prompt_frac."""
    a = advantages.double()                                                # (N,)
    total = float(a.var(unbiased=False))
    if prompt_index is None:
        return {"adv/var": total}
    inv, _, mean_p, _ = group_stats(a, prompt_index)                       # (N,), (P,)
    between = float(((mean_p[inv] - a.mean()) ** 2).mean())
    return {"adv/var": total,
            "adv/between_prompt_frac": between / total if total > 1e-12 else 0.0}


# ---------------------------------------------------------------- dynamic sampling (DAPO)
def informative_groups(rewards: torch.Tensor, group_ids, tol: float = 1e-8):
    """-> (group ids (K,), mask (K,)): True where the group's rewards are not all equal
    (std > tol). DAPO's filter 0 < |{correct}| < G, for any reward and any grouping."""
    _, _, _, std = group_stats(rewards, group_ids)                         # (K,)
    return torch.unique(torch.as_tensor(group_ids)), std > tol


def informative_rows(rewards: torch.Tensor, group_ids, tol: float = 1e-8):
    """-> (N,) bool, True on rows whose group is informative."""
    ids, keep = informative_groups(rewards, group_ids, tol)
    return torch.isin(torch.as_tensor(group_ids), ids[keep])
