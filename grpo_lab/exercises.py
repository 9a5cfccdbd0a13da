"""Checks for learners' implementations, with hints (the workshop's exercises).

Each ``check_*(fn)`` runs the learner's function on hand-picked cases (the edge cases a
teacher would ask about) and on seeded random cases, compares it with the library's own
implementation, prints a short verdict and returns True or False, so a cell can assert it:

    check_advantages(fn)            fn(rewards (N,), group_ids (N,)) -> advantages (N,)
                                    against advantages.grpo_advantages
    check_grpo_loss(fn)             fn(logp, old_logp, ref_logp (N, T), advantages (N,),
                                       mask (N, T), eps=0.2, beta=0.04) -> loss ()
                                    against loss.grpo_loss (seq_mean_token_mean)
    check_grouper(fn, strategy)     fn(batch: PromptBatch, k, seed=0) -> ids (B,)
                                    against grouping.GROUPERS[strategy]
    check_topk_error_feedback(fn)   fn(grad (n,), residual (n,), k) -> (indices (k,),
                                       values (k,), new_residual (n,))
                                    against distributed.compression.sparsify
    check_gspo_ratio(fn)            fn(logp, old_logp, mask (N, T)) -> s (N,)
                                    against loss.sequence_ratio (GSPO)
    check_kl_estimators(fn)         fn(logp, ref_logp) -> (k1, k2, k3), each logp's shape
                                    against loss.KL_ESTIMATORS

A failed check names the case, shows expected against got, and gives a hint. Each call of the
learner's function has a time limit (``TIME_LIMIT_S``): an infinite loop fails the check
with a hint instead of hanging the cell. The hint comes
from matching the learner's output with the usual mistakes (population std, clip on the wrong
side, KL sign, no error feedback, ...), each computed here as a variant of the reference.
Only the first failing case is shown: one thing to fix at a time.
"""
from __future__ import annotations

import contextlib
import math
import signal
import threading
import weakref
from typing import Callable, NamedTuple

import numpy as np
import torch

from grpo_lab.advantages import EPS, dr_grpo_advantages, grpo_advantages
from grpo_lab.distributed.compression import sparsify
from grpo_lab.grouping import GROUPERS, PromptBatch, cluster_diagnostics
from grpo_lab.loss import KL_ESTIMATORS, grpo_loss, sequence_ratio
from grpo_lab.registry import lookup

NOT_WRITTEN = "not written yet: replace `raise NotImplementedError()` with your code"


class Failure(NamedTuple):
    case: str          # which case, with its inputs
    expected: str
    got: str
    hint: str


def _fmt(x, n: int = 8) -> str:
    """A short, rounded rendering of a tensor, array, list or number."""
    if torch.is_tensor(x):
        x = x.detach().cpu().tolist()
    elif isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        items = [_fmt(v) for v in x[:n]]
        return "[" + ", ".join(items) + (", ..." if len(x) > n else "") + "]"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.4g}"
    return repr(x)


def _report(name: str, failure: Failure | None, n_cases: int, reference: str) -> bool:
    if failure is None:
        print(f"PASS {name}: your function agrees with {reference} on all {n_cases} cases.")
        return True
    print(f"FAIL {name}: case {failure.case}\n   expected {failure.expected}\n"
          f"   got      {failure.got}\n   hint: {failure.hint}")
    return False


def _require_function(name: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{name} needs your function (a callable), got "
                        f"{type(fn).__name__} {fn!r}")


TIME_LIMIT_S = 10.0
"""Longest one call of a learner's function may run (the cases are small: the library's
own functions take milliseconds); past it the check fails with a hint instead of hanging."""


class _TooSlow(Exception):
    pass


_SLOW = weakref.WeakSet()        # functions that ran past the limit once (a redefinition is new)


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise ``_TooSlow`` inside the block after ``seconds`` (SIGALRM; the main thread only,
    which is where a notebook cell runs; elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def alarm(signum, frame):
        raise _TooSlow()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _call(fn, *args, **kwargs):
    """-> (result, None) or (None, hint) when the learner's function raised or ran past
    ``TIME_LIMIT_S``."""
    slow = (f"your function did not return within {TIME_LIMIT_S:g} s on a small case: an "
            f"infinite loop? (a while loop whose condition never changes)")
    if fn in _SLOW:                                 # once is enough: the other cases fail fast
        return None, slow
    try:
        with _time_limit(TIME_LIMIT_S):
            return fn(*args, **kwargs), None
    except NotImplementedError:
        return None, NOT_WRITTEN
    except _TooSlow:
        _SLOW.add(fn)
        return None, slow
    except Exception as e:                                    # the learner's bug, shown as a hint
        return None, f"your function raised {type(e).__name__}: {e}"


def _as_tensor(x):
    try:
        return torch.as_tensor(np.asarray(x.detach() if torch.is_tensor(x) else x),
                               dtype=torch.float64)
    except Exception:
        return None


def _close(a, b, tol: float = 1e-3) -> bool:
    a, b = _as_tensor(a), _as_tensor(b)
    return a is not None and b is not None and a.shape == b.shape and bool(
        torch.allclose(a, b.double(), rtol=tol, atol=tol))


def _best_mistake(mistakes, matches) -> str | None:
    """The hint of the mistake that explains the learner's output: among those matching the
    failing case, the first that matches every case (cases tell mistakes apart), else the first."""
    fitting = [(kind, hint) for kind, hint in mistakes if matches(kind, failing_only=True)]
    for kind, hint in fitting:
        if matches(kind, failing_only=False):
            return hint
    return fitting[0][1] if fitting else None


# ---------------------------------------------------------------- advantages
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
             ("'a group of one'", t(1, 0, 1, 0.3), ids(0, 0, 0, 1))]
    gen = torch.Generator().manual_seed(0)
    for i in range(n_random):
        n = int(torch.randint(4, 25, (1,), generator=gen))
        k = int(torch.randint(1, 5, (1,), generator=gen))
        g = torch.randint(0, k, (n,), generator=gen) * 5 + 2                # ids 2, 7, 12, ...
        r = (torch.rand(n, generator=gen) < 0.5).float() if i % 2 else torch.rand(n, generator=gen)
        cases.append((f"random #{i + 1}", r, g))
    return cases


def _advantage_hint(r, g, got, outputs) -> str:
    got_t = _as_tensor(got)
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

    def matches(variant, failing_only):
        pairs = [((r, g), got)] if failing_only else outputs
        return all(_close(o, variant(*a)) for a, o in pairs)
    hint = _best_mistake(ADVANTAGE_MISTAKES, matches)
    if hint:
        return hint
    if len(torch.unique(g)) > 1:
        return ("samples with the same group id form a group, whatever the id's value and "
                "position: compute each group's mean and std over its own samples")
    bad = int((got_t - grpo_advantages(r, g).double()).abs().argmax())
    return f"sample {bad} differs most: A_i = (r_i - mean(group)) / (std(group) + eps)"


def check_advantages(fn: Callable) -> bool:
    """Your GRPO advantages ``fn(rewards (N,), group_ids (N,)) -> (N,)`` against the library's."""
    _require_function("check_advantages", fn)
    cases = _advantage_cases()
    failure = None
    outputs = [((r, g), _call(fn, r.clone(), g.clone())) for _, r, g in cases]
    ok_outputs = [(a, got) for a, (got, err) in outputs if err is None]
    for (name, r, g), (_, (got, err)) in zip(cases, outputs):
        if err is None and _close(got, grpo_advantages(r, g)):
            continue
        if err is not None and "group ids 7" in name and "index" in err.lower():
            err += " (group ids can be any integers: map them to 0..K-1 with " \
                   "torch.unique(group_ids, return_inverse=True))"
        failure = Failure(f"{name}: rewards {_fmt(r)}, group ids {_fmt(g)}",
                          _fmt(grpo_advantages(r, g)), "an error" if err else _fmt(got),
                          err or _advantage_hint(r, g, got, ok_outputs))
        break
    return _report("check_advantages", failure, len(cases), "grpo_lab.advantages.grpo_advantages")


# ---------------------------------------------------------------- the GRPO loss
def _reference_loss(logp, old_logp, ref_logp, A, mask, eps=0.2, beta=0.04):
    return grpo_loss(logp, old_logp, ref_logp, A, mask, eps_low=eps, eps_high=eps, beta=beta)[0]


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
    got_t = _as_tensor(got)
    if got_t is None or got_t.numel() != 1:
        return ("return one number (a 0-d tensor): average over tokens and completions; got "
                f"shape {None if got_t is None else tuple(got_t.shape)}")

    def matches(kind, failing_only):
        pairs = [(args, got)] if failing_only else outputs
        return all(_close(_as_tensor(o).reshape(()), _loss_variant(kind, *a), 1e-6)
                   for a, o in pairs if _as_tensor(o) is not None and _as_tensor(o).numel() == 1)
    return _best_mistake(LOSS_MISTAKES, matches) or (
        "per token: -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) + beta * k3; then "
        "mean over each completion's tokens, then over completions")


def check_grpo_loss(fn: Callable) -> bool:
    """Your ``fn(logp, old_logp, ref_logp, advantages, mask, eps=0.2, beta=0.04) -> loss``
    against ``loss.grpo_loss`` (eps_low = eps_high = eps, seq_mean_token_mean)."""
    _require_function("check_grpo_loss", fn)
    cases = _loss_cases()
    failure = None
    outputs = [(args, _call(fn, *[a.clone() for a in args[:5]], eps=args[5], beta=args[6]))
               for _, args in cases]
    ok_outputs = [(a, got) for a, (got, err) in outputs if err is None]
    for (name, args), (_, (got, err)) in zip(cases, outputs):
        expected = _reference_loss(*args)
        if err is None and _close(got, expected, 1e-6):
            continue
        what = f"{name}: ratio {_fmt(torch.exp(args[0] - args[1]).flatten())}, A {_fmt(args[3])}"
        failure = Failure(what, _fmt(float(expected)), "an error" if err else
                          _fmt(float(got) if _as_tensor(got) is not None and
                               _as_tensor(got).numel() == 1 else got),
                          err or _loss_hint(args, got, ok_outputs))
        break
    if failure is None:                                   # the gradient, through autograd
        name, args = cases[-1]
        logp = args[0].clone().requires_grad_(True)
        _reference_loss(logp, *args[1:]).backward()
        expected_grad, logp = logp.grad, args[0].clone().requires_grad_(True)
        got, err = _call(fn, logp, *[a.clone() for a in args[1:5]], eps=args[5], beta=args[6])
        if err is None and torch.is_tensor(got) and got.requires_grad:
            got.backward()
        if err is None and (logp.grad is None or not _close(logp.grad, expected_grad, 1e-6)):
            err = ("your loss does not carry the gradient to logp (no .item(), .detach(), "
                   "float() or torch.tensor(...) on the way: keep it a torch expression)")
        if err:
            failure = Failure(f"{name}: d loss / d logp", _fmt(expected_grad.flatten()),
                              _fmt(logp.grad.flatten()) if logp.grad is not None else "none",
                              err)
    return _report("check_grpo_loss", failure, len(cases) + 1, "grpo_lab.loss.grpo_loss")


# ---------------------------------------------------------------- groupers
def _same_partition(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.all((a[:, None] == a[None, :]) == (b[:, None] == b[None, :])))


def _grouper_batches(strategy: str):
    from grpo_lab.task_data import load_mixture
    mix = load_mixture()
    rng = np.random.default_rng(0)
    out = []
    for n, k in ((14, 7), (28, 4), (70, 7), (140, 7)) if strategy != "random" else \
            ((10, 3), (13, 4), (28, 7), (3, 3)):
        ex = [mix[i] for i in sorted(rng.choice(len(mix), n, replace=False))]
        prompts, tasks = [e.prompt for e in ex], [e.task for e in ex]
        if strategy == "kmeans_semantic" and n < 70:
            continue                                          # purity is noisy on tiny batches
        out.append((f"{n} mixture prompts, k={k}", PromptBatch(prompts, tasks), k))
    return out


def _grouper_contract(ids, batch: PromptBatch, k: int, takes_k: bool) -> str | None:
    B = len(batch.prompts)
    try:
        arr = np.asarray(ids.detach() if torch.is_tensor(ids) else ids)
    except Exception:
        return f"return an array of integer group ids, one per prompt; got {type(ids).__name__}"
    if arr.shape != (B,):
        return (f"a grouper returns one id per prompt: shape (B,) = ({B},), got {arr.shape} "
                f"(ids per completion come later, from prompt_index)")
    if not np.issubdtype(arr.dtype, np.integer):
        return f"ids must be integers (np.int64), got dtype {arr.dtype}"
    if takes_k and (arr.min() < 0 or arr.max() > k - 1):
        return f"ids must lie in 0..k-1 = 0..{k - 1}, got ids from {arr.min()} to {arr.max()}"
    if takes_k and len(np.unique(arr)) != k:
        return f"use exactly k = {k} groups, got {len(np.unique(arr))}"
    return None


def check_grouper(fn: Callable, strategy: str = "kmeans_semantic") -> bool:
    """Your grouper ``fn(batch: PromptBatch, k, seed=0) -> ids (B,)`` against
    ``grouping.GROUPERS[strategy]``; strategy is "by_task", "random" or "kmeans_semantic".

    by_task must give the library's partition exactly (ids may differ by a relabelling);
    random must be balanced (sizes differ by <= 1), seeded and use all k groups;
    kmeans_semantic must recover the task families as well as the library (purity within
    0.05) and be seeded.
    """
    _require_function("check_grouper", fn)
    lookup(("by_task", "random", "kmeans_semantic"), strategy, "check_grouper strategy")
    ref = GROUPERS[strategy]
    takes_k = ref.takes_k
    batches, failure = _grouper_batches(strategy), None
    for name, batch, k in batches:
        expected = ref(batch, k, 0)
        got, err = _call(fn, batch, k, seed=0)
        hint = err or _grouper_contract(got, batch, k, takes_k)
        if hint is None:                    # first: a result that changes is judged by chance
            again, err = _call(fn, batch, k, seed=0)
            if err or not _same_partition(got, again):
                hint = err or ("the same seed must give the same groups: pass seed to your "
                               "random generator (np.random.default_rng(seed), "
                               "KMeans(random_state=seed))")
        if hint is None and strategy == "by_task" and not _same_partition(got, expected):
            hint = ("prompts with the same task label must share one group, and different labels "
                    "different groups" + (": you made one group per prompt (that is by_prompt)"
                                          if len(set(np.asarray(got).tolist())) == len(got) else ""))
        if hint is None and strategy == "random":
            sizes = np.bincount(np.asarray(got), minlength=k)
            if sizes.max() - sizes.min() > 1:
                hint = (f"random groups must be balanced (sizes differ by at most 1), got sizes "
                        f"{sizes.tolist()}: deal a random permutation round-robin")
            elif len(batch.prompts) > k and _same_partition(got, _call(fn, batch, k, seed=1)[0]):
                hint = "a different seed must give different groups: use the seed argument"
        if hint is None and strategy == "kmeans_semantic":
            mine = cluster_diagnostics(batch.prompts, got, batch.tasks)["group/purity"]
            theirs = cluster_diagnostics(batch.prompts, expected, batch.tasks)["group/purity"]
            if mine < theirs - 0.05:
                hint = (f"your clusters recover the task families less well than the library's "
                        f"(purity {mine:.2f} vs {theirs:.2f}): embed the prompts with "
                        f"grpo_lab.embeddings.tfidf_embed and run K-means on those vectors")
        if hint is not None:
            failure = Failure(name, f"{_fmt(expected, 14)} (or any relabelling)",
                              "an error" if err else _fmt(got, 14), hint)
            break
    return _report(f"check_grouper ({strategy})", failure, len(batches),
                   f"grpo_lab.grouping.GROUPERS[{strategy!r}]")


# ---------------------------------------------------------------- top-k with error feedback
def _unpack_topk(out, n: int, k: int):
    """-> (indices sorted (k,), values in that order (k,), residual (n,)) or a hint."""
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        return "return three things: (indices, values, new_residual)"
    idx, val, res = (_as_tensor(x) for x in out)
    if idx is None or val is None or res is None:
        return "indices, values and new_residual must be tensors (or arrays)"
    if idx.shape != (k,) or val.shape != (k,):
        return f"send exactly k = {k} entries: indices and values of shape ({k},), got " \
               f"{tuple(idx.shape)} and {tuple(val.shape)}"
    if res.shape != (n,):
        return f"the new residual has one entry per gradient element: shape ({n},), got " \
               f"{tuple(res.shape)}"
    order = idx.argsort()
    return idx[order].long(), val[order], res


def _topk_hint(grad, residual, k, idx, val, res) -> str:
    acc = residual + grad                                                  # (n,)
    by_mag = lambda x: set(torch.topk(x.abs(), k).indices.tolist())
    chosen = set(idx.tolist())
    if chosen == by_mag(grad) and chosen != by_mag(acc):
        return ("add the residual to the gradient before choosing the top-k (acc = residual + "
                "grad): that is the error feedback")
    if chosen == set(torch.topk(acc, k).indices.tolist()) and chosen != by_mag(acc):
        return "choose the k largest |acc| (magnitude): a large negative entry matters as much"
    if chosen != by_mag(acc):
        return "send the positions of the k largest |residual + grad|"
    if _close(val, grad[idx]) and not _close(val, acc[idx]):
        return "send acc[idx] = residual + grad at the chosen positions, not the gradient alone"
    if not _close(val, acc[idx]):
        return "the values sent are acc[idx], acc = residual + grad"
    if _close(res, acc):
        return ("zero the residual where you sent: those entries are delivered (else they are "
                "sent again next step)")
    dropped_old = grad.clone()
    dropped_old[idx] = 0
    if _close(res, dropped_old):
        return ("the new residual is the whole accumulator (old residual + grad) with the sent "
                "entries zeroed: you dropped the old residual")
    if _close(res, torch.zeros_like(res)):
        return "keep what you did not send in the new residual: error feedback sends it later"
    return "new_residual = acc with acc[idx] set to 0"


def check_topk_error_feedback(fn: Callable) -> bool:
    """Your ``fn(grad (n,), residual (n,), k) -> (indices, values, new_residual)`` against
    ``compression.sparsify``; then 10 chained steps: sent + residual == sum of gradients."""
    _require_function("check_topk_error_feedback", fn)
    t = lambda *v: torch.tensor(v, dtype=torch.float32)
    cases = [("'no residual yet; a big negative entry'", t(0.1, -3, 0.5, 2, -0.2), torch.zeros(5), 2),
             ("'the residual tips the choice'", t(1, 0.9, 0.1, 0), t(0, 0, 1.5, 0), 1),
             ("'residual and gradient cancel'", t(0.5, -2, 1, 0.3, 0), t(0.1, 2, 0, -0.1, 0.7), 2)]
    gen = torch.Generator().manual_seed(0)
    for i in range(3):
        n = 20 + 10 * i
        cases.append((f"random #{i + 1} (n={n})", torch.randn(n, generator=gen),
                      torch.randn(n, generator=gen) * 0.5, 3 + i))
    failure = None
    for name, grad, residual, k in cases:
        e_idx, e_val, e_res, _ = sparsify(grad, residual, None, k)
        out, err = _call(fn, grad.clone(), residual.clone(), k)
        parts = err or _unpack_topk(out, len(grad), k)
        if isinstance(parts, str):
            hint, got = parts, "an error" if err else _fmt(out)
        else:
            idx, val, res = parts
            if idx.tolist() == e_idx.tolist() and _close(val, e_val) and _close(res, e_res):
                continue
            hint = _topk_hint(grad.double(), residual.double(), k, idx, val, res)
            got = f"indices {_fmt(idx)}, values {_fmt(val)}, residual {_fmt(res)}"
        failure = Failure(f"{name}: grad {_fmt(grad)}, residual {_fmt(residual)}, k={k}",
                          f"indices {_fmt(e_idx)}, values {_fmt(e_val)}, residual {_fmt(e_res)}",
                          got, hint)
        break
    if failure is None:                                   # every gradient entry is sent eventually
        n, k, steps = 40, 4, 10
        residual, sent, total = torch.zeros(n), torch.zeros(n, dtype=torch.float64), \
            torch.zeros(n, dtype=torch.float64)
        for _ in range(steps):
            grad = torch.randn(n, generator=gen)
            total += grad.double()
            idx, val, residual = _unpack_topk(fn(grad, residual, k), n, k)
            sent[idx] += val
            residual = residual.float()
        if not _close(sent + residual.double(), total):
            failure = Failure(f"'{steps} chained steps' (n={n}, k={k})", "sent + residual == sum "
                              "of the gradients", f"off by {float((sent + residual - total).abs().max()):.3g}",
                              "nothing may be lost: whatever is not sent stays in the residual")
    return _report("check_topk_error_feedback", failure, len(cases) + 1,
                   "grpo_lab.distributed.compression.sparsify")


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
    _require_function("check_gspo_ratio", fn)
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
    return _check_against(
        "check_gspo_ratio", fn, cases, lambda a: sequence_ratio(*a)[:, 0].detach(),
        GSPO_MISTAKES, _gspo_variant, "grpo_lab.loss.sequence_ratio",
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
    _require_function("check_kl_estimators", fn)
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
    return _check_against("check_kl_estimators", fn, cases, reference, KL_MISTAKES, _kl_variant,
                          "grpo_lab.loss.KL_ESTIMATORS",
                          "d = ref_logp - logp; k1 = -d, k2 = d^2 / 2, k3 = exp(d) - 1 - d",
                          pack=lambda out: torch.stack([_as_tensor(x) for x in out]))


def _check_against(name, fn, cases, reference, mistakes, variant, ref_name, formula,
                   pack=_as_tensor) -> bool:
    """Run ``fn`` on every case, compare with ``reference``; on the first failure, name the
    mistake (from ``mistakes``) that explains all its outputs, or give the formula."""
    def packed(out):
        try:
            return pack(out)
        except Exception:
            return None
    outputs = [(args, _call(fn, *[a.clone() for a in args])) for _, args in cases]
    failure = None
    for (case, args), (_, (got, err)) in zip(cases, outputs):
        expected, got_t = reference(args), None if err else packed(got)
        if got_t is not None and _close(got_t, expected, 1e-6):
            continue
        if err is None and got_t is None:
            err = f"return what the docstring says; got {type(got).__name__}"
        hint = err
        if hint is None:
            ok = [(a, packed(g)) for a, (g, e) in outputs if e is None and packed(g) is not None]
            hint = _best_mistake(mistakes, lambda kind, failing_only: all(
                _close(o, variant(kind, *a), 1e-6)
                for a, o in ([(args, got_t)] if failing_only else ok))) or formula
        failure = Failure(case, _fmt(expected.flatten()), "an error" if err else
                          _fmt(got_t.flatten() if got_t is not None else got), hint)
        break
    return _report(name, failure, len(cases), ref_name)


CHECKS = {"advantages": check_advantages, "grpo_loss": check_grpo_loss,
          "grouper": check_grouper, "topk_error_feedback": check_topk_error_feedback,
          "gspo_ratio": check_gspo_ratio, "kl_estimators": check_kl_estimators}
