"""The loss exercises: ``check_grpo_loss`` (the clipped surrogate with the k3 KL penalty,
Shao et al. 2024 eq. 3, against ``loss.grpo_loss`` with seq_mean_token_mean),
``check_gspo_ratio`` (GSPO's length-normalised sequence ratio, Zheng et al. 2025, against
``loss.sequence_ratio``) and ``check_kl_estimators`` (Schulman 2020's k1, k2, k3, against
``loss.KL_ESTIMATORS``). Each usual mistake is a variant of the reference (``*_MISTAKES``:
which variant, which hint); the hint shown is the one whose variant explains the outputs."""
from __future__ import annotations

import math
from typing import Callable

import torch

from grpo_lab.teaching.exercise_harness import (Failure, as_tensor, best_mistake, call, check_against,
                                                close, fmt, report, require_function)
from grpo_lab.algorithm.loss import KL, KL_ESTIMATORS, Clip, grpo_loss, sequence_ratio


# ---------------------------------------------------------------- the GRPO loss
def _reference_loss(logp, old_logp, ref_logp, A, mask, eps=0.2, beta=0.04):
    return grpo_loss(logp, old_logp, A, mask, Clip(eps, eps), KL(beta), ref_logp=ref_logp)[0]


def _loss_variant(kind: str, logp, old_logp, ref_logp, A, mask, eps=0.2, beta=0.04):
    """One usual mistake in the GRPO loss (``kind``), else the correct loss, written out."""
    ratio, A = torch.exp(logp - old_logp), A[:, None]                     # (N, T), (N, 1)
    unclipped, clipped = ratio * A, ratio.clamp(1 - eps, 1 + eps) * A     # (N, T) each
    surr = {"max": torch.max(unclipped, clipped), "clip_only": clipped,
            "no_clip": unclipped,
            "clip_upper_only": torch.min(unclipped, ratio.clamp(max=1 + eps) * A),
            "min_of_ratios": torch.min(ratio, ratio.clamp(1 - eps, 1 + eps)) * A,
            }.get(kind, torch.min(unclipped, clipped))                    # (N, T)
    d = logp - ref_logp if kind == "kl_direction" else ref_logp - logp    # (N, T)
    kl = -d if kind == "kl_k1" else torch.exp(d) - d - 1                  # (N, T)
    per_tok = -surr + (-beta if kind == "kl_sign" else beta) * kl         # (N, T)
    if kind == "objective":
        per_tok = -per_tok
    m = torch.ones_like(mask) if kind == "no_mask" else mask
    if kind == "token_mean":
        return (per_tok * m).sum() / m.sum()
    length = torch.full_like(m[:, 0], m.shape[1]) if kind == "divide_by_T" else m.sum(1)
    return ((per_tok * m).sum(1) / length.clamp(min=1)).mean()


LOSS_MISTAKES = [
    ("max", "the clip must not raise the objective when A < 0: take torch.min of the unclipped "
     "and clipped terms, not torch.max"),
    ("clip_only", "the clip must not raise the objective when A < 0: with a ratio above 1 + eps "
     "the unclipped term is lower and must win; take the min of ratio * A and clip(ratio) * A"),
    ("no_clip", "clip the ratio to [1 - eps, 1 + eps]: once the ratio is past 1 + eps with A > 0, "
     "the objective must stop rising"),
    ("clip_upper_only", "clip both sides, ratio.clamp(1 - eps, 1 + eps): you clipped only the "
     "upper side (1 + eps), so with A < 0 a ratio below 1 - eps keeps pushing it down"),
    ("min_of_ratios", "take the min of the two products, ratio * A and clip(ratio) * A, not of "
     "the two ratios before multiplying by A: with A < 0 the product flips the order"),
    ("kl_sign", "the KL term is a penalty: add + beta * KL to the loss (you subtracted it)"),
    ("kl_direction", "k3 is exp(d) - d - 1 with d = ref_logp - logp = log(pi_ref / pi_theta); "
     "you used logp - ref_logp"),
    ("kl_k1", "use the k3 estimator exp(d) - d - 1 (d = ref_logp - logp), not d alone: k3 is "
     "never negative"),
    ("objective", "return the loss to minimise, -J: you returned the objective J"),
    ("token_mean", "average each completion over its own tokens first (1/|o_i|), then over the "
     "completions: you averaged over all tokens at once"),
    ("no_mask", "padding tokens (mask 0) must not count: multiply by the mask"),
    ("divide_by_T", "divide each completion's sum by its own length mask.sum(1), not by T"),
]


def _loss_cases(n_random: int = 4):
    def one(logp, old, ref, A, mask=None, eps=0.2, beta=0.0):
        logp, old, ref = (torch.tensor(x, dtype=torch.float64) for x in (logp, old, ref))
        mask = torch.ones_like(logp) if mask is None else torch.tensor(mask, dtype=torch.float64)
        return logp, old, ref, torch.tensor(A, dtype=torch.float64), mask, eps, beta
    l15, l05 = math.log(1.5), math.log(0.5)
    cases = [
        ("'on-policy (ratio 1), A > 0'", one([[-1.0, -2.0]], [[-1.0, -2.0]], [[-1.0, -2.0]], [1.0])),
        ("'A > 0, ratio 1.5 > 1 + eps: clipped'", one([[l15]], [[0.0]], [[0.0]], [1.0])),
        ("'A < 0, ratio 0.5 < 1 - eps: clipped'", one([[l05]], [[0.0]], [[0.0]], [-1.0])),
        ("'A < 0, ratio 1.5 > 1 + eps: not clipped'", one([[l15]], [[0.0]], [[0.0]], [-1.0])),
        ("'A > 0, ratio 0.5: not clipped'", one([[l05]], [[0.0]], [[0.0]], [1.0])),
        ("'eps 0.1: A > 0, ratio 1.15 clipped at 1.1'", one([[math.log(1.15)]], [[0.0]], [[0.0]],
                                                          [1.0], eps=0.1)),
        ("'KL penalty (beta 0.1), A = 0'", one([[-1.0, -0.5]], [[-1.0, -0.5]], [[-2.0, -0.2]],
                                               [0.0], beta=0.1)),
        ("'lengths 4 and 2, padding holds junk'",
         one([[-1.0, -1.2, -0.3, -2.0], [-0.5, -0.7, 9.0, 9.0]],
             [[-1.1, -1.0, -0.3, -2.2], [-0.4, -0.9, 0.0, 0.0]],
             [[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -5.0, -5.0]], [1.0, -0.5],
             [[1, 1, 1, 1], [1, 1, 0, 0]], beta=0.04)),
    ]
    gen = torch.Generator().manual_seed(0)
    for i in range(n_random):
        N, T = 2 + i, 3 + 2 * i
        old = -torch.rand(N, T, generator=gen, dtype=torch.float64) * 3
        logp = old + torch.randn(N, T, generator=gen, dtype=torch.float64) * 0.4
        ref = old + torch.randn(N, T, generator=gen, dtype=torch.float64) * 0.3
        lengths = torch.randint(1, T + 1, (N,), generator=gen)
        mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
        A = torch.randn(N, generator=gen, dtype=torch.float64)
        cases.append((f"random #{i + 1} (N={N}, T={T})", (logp, old, ref, A, mask, 0.2, 0.04)))
    return cases


def _loss_hint(args, got, outputs) -> str:
    got_t = as_tensor(got)
    if got_t is None or got_t.numel() != 1:
        return ("return one number (a 0-d tensor): average over tokens and completions; got "
                f"shape {None if got_t is None else tuple(got_t.shape)}")

    def explains(kind, a, o):                     # another case's non-scalar output: no say
        o = as_tensor(o)
        return o is None or o.numel() != 1 or close(o.reshape(()), _loss_variant(kind, *a), 1e-6)
    return best_mistake(LOSS_MISTAKES, (args, got), outputs, explains) or (
        "per token: -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) + beta * k3; then "
        "mean over each completion's tokens, then over completions")


def check_grpo_loss(fn: Callable) -> bool:
    """Your ``fn(logp, old_logp, ref_logp, advantages, mask, eps=0.2, beta=0.04) -> loss``
    against ``loss.grpo_loss`` (eps_low = eps_high = eps, seq_mean_token_mean)."""
    require_function("check_grpo_loss", fn)
    cases = _loss_cases()
    failure = None
    outputs = [(args, call(fn, *[a.clone() for a in args[:5]], eps=args[5], beta=args[6]))
               for _, args in cases]
    ok_outputs = [(a, got) for a, (got, err) in outputs if err is None]
    for (name, args), (_, (got, err)) in zip(cases, outputs):
        expected = _reference_loss(*args)
        if err is None and close(got, expected, 1e-6):
            continue
        what = f"{name}: ratio {fmt(torch.exp(args[0] - args[1]).flatten())}, A {fmt(args[3])}"
        failure = Failure(what, fmt(float(expected)), "an error" if err else
                          fmt(float(got) if as_tensor(got) is not None and
                               as_tensor(got).numel() == 1 else got),
                          err or _loss_hint(args, got, ok_outputs))
        break
    if failure is None:                                   # the gradient, through autograd
        name, args = cases[-1]
        logp = args[0].clone().requires_grad_(True)
        _reference_loss(logp, *args[1:]).backward()
        expected_grad, logp = logp.grad, args[0].clone().requires_grad_(True)
        got, err = call(fn, logp, *[a.clone() for a in args[1:5]], eps=args[5], beta=args[6])
        if err is None and torch.is_tensor(got) and got.requires_grad:
            got.backward()
        if err is None and (logp.grad is None or not close(logp.grad, expected_grad, 1e-6)):
            err = ("your loss does not carry the gradient to logp (no .item(), .detach(), "
                   "float() or torch.tensor(...) on the way: keep it a torch expression)")
        if err:
            failure = Failure(f"{name}: d loss / d logp", fmt(expected_grad.flatten()),
                              fmt(logp.grad.flatten()) if logp.grad is not None else "none",
                              err)
    return report("check_grpo_loss", failure, len(cases) + 1, "grpo_lab.algorithm.loss.grpo_loss")


# ---------------------------------------------------------------- GSPO's sequence ratio
def _gspo_variant(kind: str, logp, old_logp, mask):
    """One usual mistake in GSPO's sequence ratio (``kind``), else the correct ratio (N,)."""
    d = (logp - old_logp) * (1 if kind == "no_mask" else mask)             # (N, T)
    length = torch.full_like(mask[:, 0], mask.shape[1]) if kind == "divide_by_T" else mask.sum(1)
    if kind == "no_length_norm":
        return torch.exp(d.sum(1))
    if kind == "mean_of_token_ratios":
        return (torch.exp(logp - old_logp) * mask).sum(1) / length
    return torch.exp(d.sum(1) / length.clamp(min=1))


GSPO_MISTAKES = [
    ("no_length_norm", "GSPO normalises by length: exp of the MEAN log-ratio over the "
     "completion's tokens (1/|o_i|), not of the sum (the product of the token ratios)"),
    ("mean_of_token_ratios", "average the log-ratios, then exponentiate (a geometric mean of "
     "the token ratios), not the arithmetic mean of exp(logp - old_logp)"),
    ("divide_by_T", "divide by the completion's own length mask.sum(1), not by T"),
    ("no_mask", "padding tokens (mask 0) must not count: multiply the log-ratios by the mask"),
]


def check_gspo_ratio(fn: Callable) -> bool:
    """Your ``fn(logp, old_logp, mask) -> s (N,)``, GSPO's length-normalised sequence ratio
    s_i = exp(1/|o_i| sum_t (logp - old_logp)), against ``loss.sequence_ratio``."""
    require_function("check_gspo_ratio", fn)
    t = lambda x: torch.tensor(x, dtype=torch.float64)                    # noqa: E731
    cases = [("'one token: the token ratio'", (t([[0.3]]), t([[0.0]]), t([[1.0]]))),
             ("'3 tokens, log-ratios 0.1, 0.2, 0.3'", (t([[0.1, 0.2, 0.3]]), t([[0.0] * 3]),
                                                       t([[1.0] * 3]))),
             ("'lengths 3 and 1, padding holds junk'",
              (t([[-1.0, -0.5, -2.0], [-0.7, 9.0, 9.0]]), t([[-1.2, -0.4, -2.5], [-0.2, 0.0, 0.0]]),
               t([[1, 1, 1], [1, 0, 0]])))]
    gen = torch.Generator().manual_seed(0)
    for i in range(3):
        N, T = 2 + i, 3 + 2 * i
        old = -torch.rand(N, T, generator=gen, dtype=torch.float64) * 3
        logp = old + torch.randn(N, T, generator=gen, dtype=torch.float64) * 0.3
        mask = (torch.arange(T)[None] < torch.randint(1, T + 1, (N, 1), generator=gen)).double()
        cases.append((f"random #{i + 1} (N={N}, T={T})", (logp, old, mask)))
    return check_against(
        "check_gspo_ratio", fn, cases, lambda a: sequence_ratio(*a)[:, 0].detach(),
        GSPO_MISTAKES, _gspo_variant, "grpo_lab.algorithm.loss.sequence_ratio",
        "s_i = exp(((logp - old_logp) * mask).sum(1) / mask.sum(1))")


# ---------------------------------------------------------------- the KL estimators
def _kl_variant(kind: str, logp, ref_logp):
    """The three estimators with one usual mistake (``kind``) -> stacked (3, ...)."""
    d = logp - ref_logp if kind == "direction" else ref_logp - logp       # log pi_ref / pi
    k1 = d if kind == "k1_sign" else -d
    k2 = d ** 2 if kind == "k2_half" else 0.5 * d ** 2
    k3 = d - torch.exp(d) + 1 if kind == "k3_sign" else torch.exp(d) - d - 1
    return torch.stack([k1, k2, k3])


KL_MISTAKES = [
    ("direction", "r = pi_ref / pi: log r = ref_logp - logp (the tokens come from pi); you "
     "used logp - ref_logp"),
    ("k1_sign", "k1 = -log r = logp - ref_logp: it estimates E_pi[log pi / pi_ref]"),
    ("k2_half", "k2 = (log r)^2 / 2: you forgot the 1/2"),
    ("k3_sign", "k3 = (r - 1) - log r, which is never negative (log r <= r - 1)"),
]


def check_kl_estimators(fn: Callable) -> bool:
    """Your ``fn(logp, ref_logp) -> (k1, k2, k3)``, each of logp's shape: Schulman's three
    estimators of KL(pi || pi_ref) from tokens sampled from pi, against loss.KL_ESTIMATORS."""
    require_function("check_kl_estimators", fn)
    t = lambda x: torch.tensor(x, dtype=torch.float64)                    # noqa: E731
    cases = [("'pi = pi_ref: every estimate 0'", (t([-1.0, -2.0]), t([-1.0, -2.0]))),
             ("'pi_ref / pi = 2'", (t([math.log(0.25)]), t([math.log(0.5)]))),
             ("'pi_ref / pi = 1/2'", (t([math.log(0.5)]), t([math.log(0.25)])))]
    gen = torch.Generator().manual_seed(0)
    for i in range(3):
        logp = -torch.rand(2 + i, 3, generator=gen, dtype=torch.float64) * 3
        cases.append((f"random #{i + 1}", (logp, logp + torch.randn(2 + i, 3, generator=gen,
                                                                   dtype=torch.float64) * 0.5)))

    def reference(a):
        d = a[1] - a[0]
        return torch.stack([KL_ESTIMATORS[k](d) for k in ("k1", "k2", "k3")])
    return check_against("check_kl_estimators", fn, cases, reference, KL_MISTAKES, _kl_variant,
                          "grpo_lab.algorithm.loss.KL_ESTIMATORS",
                          "d = ref_logp - logp; k1 = -d, k2 = d^2 / 2, k3 = exp(d) - 1 - d",
                          pack=lambda out: torch.stack([as_tensor(x) for x in out]))
