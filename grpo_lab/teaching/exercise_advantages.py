"""The advantages exercise: ``check_advantages(fn)``, your GRPO advantages against
``advantages.grpo_advantages`` (Shao et al. 2024, DeepSeekMath sec. 4.1.2: A_i = (r_i -
mean(group)) / (std(group) + eps), the sample std), with hints for the usual mistakes
(population std, no division (Dr. GRPO), one batch-wide group, the sign)."""
from __future__ import annotations

from typing import Callable

import torch

from grpo_lab.algorithm.advantages import EPS, dr_grpo_advantages, grpo_advantages
from grpo_lab.teaching.exercise_harness import (Failure, as_tensor, best_mistake, call, close, fmt,
                                                report, require_function)


def _population_std_advantages(rewards, group_ids):
    out = torch.zeros_like(rewards, dtype=torch.float64)
    for g in torch.unique(group_ids):
        m = group_ids == g
        r = rewards[m].double()
        out[m] = (r - r.mean()) / (r.std(unbiased=False) + EPS)
    return out


def _batch_advantages(rewards, group_ids):
    r = rewards.double()
    return (r - r.mean()) / (r.std() + EPS)


ADVANTAGE_MISTAKES = [   # (variant, hint), tried in order on a failing case
    (_population_std_advantages, "you divided by the population std: GRPO uses the sample std "
     "(Bessel's correction, n - 1: torch's default `std()`)"),
    (dr_grpo_advantages, "you subtracted the group mean but did not divide by the group's std "
     "(that is Dr. GRPO; GRPO divides by std + eps)"),
    (_batch_advantages, "you normalised over the whole batch: each sample is compared only with "
     "the samples that share its group id"),
    (lambda r, g: -grpo_advantages(r, g), "the sign is flipped: a reward above its group's mean "
     "must get a positive advantage"),
]


def _advantage_cases(n_random: int = 6):
    t = lambda *v: torch.tensor(v, dtype=torch.float32)
    ids = lambda *v: torch.tensor(v, dtype=torch.long)
    cases = [("'two right, two wrong'", t(1, 0, 0, 1), ids(0, 0, 0, 0)),
             ("'all rewards equal'", t(0.7, 0.7, 0.7, 0.7), ids(0, 0, 0, 0)),
             ("'two groups'", t(1, 0, 0.5, 0.2, 0.9, 0.4), ids(0, 0, 0, 1, 1, 1)),
             ("'group ids 7 and 3, interleaved'", t(1, 0, 0, 0.5, 0.5, 1), ids(7, 3, 7, 3, 7, 3)),
             ("'a group of one'", t(1, 0, 1, 0.3), ids(0, 0, 0, 1)),
             ("'a spread of 1e-3: where eps = 1e-4 shows'", t(0, 0, 0, 1e-3), ids(0, 0, 0, 0))]
    gen = torch.Generator().manual_seed(0)
    for i in range(n_random):
        n = int(torch.randint(4, 25, (1,), generator=gen))
        k = int(torch.randint(1, 5, (1,), generator=gen))
        g = torch.randint(0, k, (n,), generator=gen) * 5 + 2                # ids 2, 7, 12, ...
        r = (torch.rand(n, generator=gen) < 0.5).float() if i % 2 else torch.rand(n, generator=gen)
        cases.append((f"random #{i + 1}", r, g))
    return cases


def _advantage_hint(r, g, got, outputs) -> str:
    got_t = as_tensor(got)
    if got_t is None or got_t.shape != r.shape:
        shape = "?" if got_t is None else tuple(got_t.shape)
        return f"return one advantage per sample: shape (N,) = {tuple(r.shape)}, got {shape}"
    if torch.isnan(got_t).any():
        sizes = torch.unique(g, return_counts=True)[1]
        if (sizes == 1).any():
            return ("a group of one has no spread (n - 1 = 0): its advantage must be 0, not NaN; "
                    "clamp n - 1 to at least 1")
        return ("a group whose rewards are all equal must get advantage 0, not NaN: divide by "
                "std + eps (eps = 1e-4)")
    hint = best_mistake(ADVANTAGE_MISTAKES, ((r, g), got), outputs,
                        lambda variant, a, o: close(o, variant(*a)))
    if hint:
        return hint
    if len(torch.unique(g)) > 1:
        return ("samples with the same group id form a group, whatever the id's value and "
                "position: compute each group's mean and std over its own samples")
    bad = int((got_t - grpo_advantages(r, g).double()).abs().argmax())
    return f"sample {bad} differs most: A_i = (r_i - mean(group)) / (std(group) + eps)"


def check_advantages(fn: Callable) -> bool:
    """Your GRPO advantages ``fn(rewards (N,), group_ids (N,)) -> (N,)`` against the library's."""
    require_function("check_advantages", fn)
    cases = _advantage_cases()
    failure = None
    outputs = [((r, g), call(fn, r.clone(), g.clone())) for _, r, g in cases]
    ok_outputs = [(a, got) for a, (got, err) in outputs if err is None]
    for (name, r, g), (_, (got, err)) in zip(cases, outputs):
        if err is None and close(got, grpo_advantages(r, g)):
            continue
        if err is not None and "group ids 7" in name and "index" in err.lower():
            err += " (group ids can be any integers: map them to 0..K-1 with " \
                   "torch.unique(group_ids, return_inverse=True))"
        failure = Failure(f"{name}: rewards {fmt(r)}, group ids {fmt(g)}",
                          fmt(grpo_advantages(r, g)), "an error" if err else fmt(got),
                          err or _advantage_hint(r, g, got, ok_outputs))
        break
    return report("check_advantages", failure, len(cases), "grpo_lab.algorithm.advantages.grpo_advantages")
