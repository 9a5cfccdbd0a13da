"""Each check passes the library's own function and fails planted mistakes with their hint."""
import math

import numpy as np
import pytest
import torch

from grpo_lab.teaching import exercises as ex
from grpo_lab.algorithm.advantages import EPS, grpo_advantages
from grpo_lab.distributed.compression import sparsify
from grpo_lab.algorithm.embeddings import tfidf_embed
from grpo_lab.teaching.exercise_loss import _loss_variant
from grpo_lab.algorithm.grouping import GROUPERS
from grpo_lab.algorithm.loss import KL, Clip, grpo_loss


def verdict(check, fn, capsys, *args):
    ok = check(fn, *args)
    return ok, capsys.readouterr().out


# ---------------------------------------------------------------- advantages
def adv_population_std(r, g):
    out = torch.zeros_like(r)
    for k in torch.unique(g):
        m = g == k
        out[m] = (r[m] - r[m].mean()) / (r[m].std(unbiased=False) + 1e-4)
    return out


def adv_no_eps(r, g):                       # all-equal group -> 0/0 = NaN
    out = torch.zeros_like(r)
    for k in torch.unique(g):
        m = g == k
        out[m] = (r[m] - r[m].mean()) / r[m].std()
    return out


def adv_no_guard_for_one(r, g):             # eps, but std of a single sample is NaN
    out = torch.zeros_like(r)
    for k in torch.unique(g):
        m = g == k
        out[m] = (r[m] - r[m].mean()) / (r[m].std() + EPS)
    return out


def adv_whole_batch(r, g):
    return (r - r.mean()) / (r.std() + EPS)


def adv_no_std(r, g):
    out = torch.zeros_like(r)
    for k in torch.unique(g):
        m = g == k
        out[m] = r[m] - r[m].mean()
    return out


def adv_ids_as_index(r, g):                 # assumes ids are 0..K-1
    K = int(g.max()) + 1
    mean = torch.zeros(K).index_add_(0, g, r) / torch.zeros(K).index_add_(0, g, torch.ones_like(r))
    return (r - mean[g]) / 1.0


ADV_CASES = [
    (adv_population_std, "population std: GRPO uses the sample std"),
    (adv_no_eps, "all equal must get advantage 0, not NaN"),
    (adv_no_guard_for_one, "a group of one has no spread"),
    (adv_whole_batch, "normalised over the whole batch"),
    (adv_no_std, "did not divide by the group's std"),
]


def test_check_advantages_passes_the_library(capsys):
    ok, out = verdict(ex.check_advantages, grpo_advantages, capsys)
    assert ok and "PASS" in out, out


@pytest.mark.parametrize("fn, hint", ADV_CASES, ids=[f.__name__ for f, _ in ADV_CASES])
def test_check_advantages_fails_mistakes_with_hint(fn, hint, capsys):
    ok, out = verdict(ex.check_advantages, fn, capsys)
    assert not ok and "FAIL" in out and hint in out, out
    assert "expected" in out and "got" in out


def test_check_advantages_names_the_stub_and_errors(capsys):
    def stub(r, g):
        raise NotImplementedError()
    ok, out = verdict(ex.check_advantages, stub, capsys)
    assert not ok and "not written yet" in out
    ok, out = verdict(ex.check_advantages, lambda r, g: r.view(2, -1), capsys)
    assert not ok and "shape (N,)" in out


# ---------------------------------------------------------------- loss
def make_loss(surr_fn=None, kl_sign=1.0, kl_dir=1.0, agg="seq", low=True, ratios_first=False):
    def loss(logp, old_logp, ref_logp, A, mask, eps=0.2, beta=0.04):
        ratio = torch.exp(logp - old_logp)
        clipped = ratio.clamp(1 - eps if low else None, 1 + eps)
        un, cl = ratio * A[:, None], clipped * A[:, None]
        surr = (surr_fn or torch.min)(un, cl)
        if ratios_first:                    # min(ratio, clip(ratio)) * A
            surr = torch.min(ratio, clipped) * A[:, None]
        d = kl_dir * (ref_logp - logp)
        per_tok = -surr + kl_sign * beta * (torch.exp(d) - d - 1)
        if agg == "token":
            return (per_tok * mask).sum() / mask.sum()
        return ((per_tok * mask).sum(1) / mask.sum(1)).mean()
    return loss


LOSS_CASES = [
    (make_loss(torch.max), "the clip must not raise the objective when A < 0"),
    (make_loss(lambda un, cl: cl), "the clip must not raise the objective when A < 0"),
    (make_loss(lambda un, cl: un), "clip the ratio to [1 - eps, 1 + eps]"),
    (make_loss(kl_sign=-1.0), "the KL term is a penalty"),
    (make_loss(kl_dir=-1.0), "you used logp - ref_logp"),
    (make_loss(agg="token"), "you averaged over all tokens at once"),
    (lambda *a, **k: torch.tensor(float(make_loss()(*a, **k))), "does not carry the gradient"),
    (lambda *a, **k: -make_loss()(*a, **k), "you returned the objective J"),
    (make_loss(low=False), "you clipped only the upper side"),
    (make_loss(ratios_first=True), "not of the two ratios before multiplying by A"),
]


def test_check_grpo_loss_passes_the_library(capsys):
    def lib(logp, old_logp, ref_logp, A, mask, eps=0.2, beta=0.04):
        return grpo_loss(logp, old_logp, A, mask, Clip(eps, eps), KL(beta), ref_logp=ref_logp)[0]
    ok, out = verdict(ex.check_grpo_loss, lib, capsys)
    assert ok, out
    ok, out = verdict(ex.check_grpo_loss, make_loss(), capsys)      # written out by hand
    assert ok, out


@pytest.mark.parametrize("i", range(len(LOSS_CASES)))
def test_check_grpo_loss_fails_mistakes_with_hint(i, capsys):
    fn, hint = LOSS_CASES[i]
    ok, out = verdict(ex.check_grpo_loss, fn, capsys)
    assert not ok and hint in out, out
    others = [h for _, h in ex.LOSS_MISTAKES if hint not in h]
    assert not any(h in out for h in others), out          # exactly its own hint


def test_the_two_classic_clip_mistakes_fail_on_the_a_below_zero_cases(capsys):
    """Both are right whenever A > 0 (min(r, clip r) * A = min(r A, clip(r) A) for A > 0, and the
    lower clip never binds there), so the check must catch them on an A < 0 case: worked out by
    hand for A = -1, ratio 0.5, eps 0.2: -min(-0.5, -0.8) = 0.8 is right, both mistakes give 0.5."""
    args = (torch.tensor([[math.log(0.5)]], dtype=torch.float64),
            torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64),
            torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64))
    assert float(make_loss()(*args, beta=0.0)) == pytest.approx(0.8)
    for kind in ("clip_upper_only", "min_of_ratios"):
        assert float(_loss_variant(kind, *args, beta=0.0)) == pytest.approx(0.5)
        assert float(_loss_variant(kind, args[0], args[1], args[2], -args[3], args[4],
                                      beta=0.0)) == pytest.approx(-0.5)   # A > 0: right


# ---------------------------------------------------------------- groupers
def km_per_row(batch, k, seed=0):            # ids per completion (G=4), not per prompt
    return np.repeat(GROUPERS["kmeans_semantic"](batch, k, seed), 4)


def km_one_based(batch, k, seed=0):
    return GROUPERS["kmeans_semantic"](batch, k, seed) + 1


def km_unseeded(batch, k, seed=0):
    return GROUPERS["kmeans_semantic"](batch, k, int(np.random.randint(1 << 30)))


def km_random_groups(batch, k, seed=0):      # groups without meaning
    return GROUPERS["random"](batch, k, seed)


def km_float_ids(batch, k, seed=0):
    return GROUPERS["kmeans_semantic"](batch, k, seed).astype(float)


def km_by_hand(batch, k, seed=0):            # what a learner writes
    from sklearn.cluster import KMeans
    return KMeans(k, n_init=4, random_state=seed).fit(tfidf_embed(batch.prompts)).labels_


GROUPER_CASES = [
    (km_per_row, "kmeans_semantic", "one id per prompt"),
    (km_one_based, "kmeans_semantic", "ids must lie in 0..k-1"),
    (km_random_groups, "kmeans_semantic", "recover the task families less well"),
    (km_float_ids, "kmeans_semantic", "ids must be integers"),
    (lambda b, k, seed=0: np.arange(len(b.prompts)), "by_task", "that is by_prompt"),
    (lambda b, k, seed=0: np.arange(len(b.prompts)) % k, "random", "a different seed"),
    (lambda b, k, seed=0: np.random.default_rng(seed).integers(0, k, len(b.prompts)), "random",
     "balanced"),
]


@pytest.mark.parametrize("strategy", ["by_task", "random", "kmeans_semantic"])
def test_check_grouper_passes_the_library(strategy, capsys):
    ok, out = verdict(ex.check_grouper, GROUPERS[strategy], capsys, strategy)
    assert ok, out


def test_check_grouper_passes_a_hand_written_kmeans_and_by_task(capsys):
    assert verdict(ex.check_grouper, km_by_hand, capsys, "kmeans_semantic")[0]
    def by_task(batch, k=None, seed=0):
        names = {t: i for i, t in enumerate(dict.fromkeys(batch.tasks))}
        return np.array([names[t] for t in batch.tasks])
    assert verdict(ex.check_grouper, by_task, capsys, "by_task")[0]


def test_check_grouper_catches_an_unseeded_kmeans(capsys):
    ok, out = verdict(ex.check_grouper, km_unseeded, capsys, "kmeans_semantic")
    assert not ok and "the same seed must give the same groups" in out, out


@pytest.mark.parametrize("i", range(len(GROUPER_CASES)))
def test_check_grouper_fails_mistakes_with_hint(i, capsys):
    fn, strategy, hint = GROUPER_CASES[i]
    ok, out = verdict(ex.check_grouper, fn, capsys, strategy)
    assert not ok and hint in out, out


# ---------------------------------------------------------------- top-k + error feedback
def topk_library(grad, residual, k):
    idx, val, res, _ = sparsify(grad, residual, None, k)
    return idx, val, res


def topk_no_feedback(grad, residual, k):
    idx = torch.topk(grad.abs(), k).indices
    res = grad.clone()
    res[idx] = 0
    return idx, grad[idx], res


def topk_by_value(grad, residual, k):
    acc = residual + grad
    idx = torch.topk(acc, k).indices
    res = acc.clone()
    res[idx] = 0
    return idx, acc[idx], res


def topk_residual_not_zeroed(grad, residual, k):
    acc = residual + grad
    idx = torch.topk(acc.abs(), k).indices
    return idx, acc[idx], acc.clone()


def topk_sends_grad(grad, residual, k):
    acc = residual + grad
    idx = torch.topk(acc.abs(), k).indices
    res = acc.clone()
    res[idx] = 0
    return idx, grad[idx], res


def topk_drops_old_residual(grad, residual, k):
    acc = residual + grad
    idx = torch.topk(acc.abs(), k).indices
    res = grad.clone()
    res[idx] = 0
    return idx, acc[idx], res


TOPK_CASES = [
    (topk_no_feedback, "add the residual to the gradient before choosing"),
    (topk_by_value, "largest |acc| (magnitude)"),
    (topk_residual_not_zeroed, "zero the residual where you sent"),
    (topk_sends_grad, "not the gradient alone"),
    (topk_drops_old_residual, "you dropped the old residual"),
    (lambda g, r, k: (torch.arange(k + 1), g[:k + 1], r), "send exactly k = "),
]


def test_check_topk_passes_the_library(capsys):
    ok, out = verdict(ex.check_topk_error_feedback, topk_library, capsys)
    assert ok, out
    numpy_version = lambda g, r, k: (lambda a: (np.argsort(-np.abs(a))[:k],
                                                a[np.argsort(-np.abs(a))[:k]],
                                                np.where(np.isin(np.arange(len(a)),
                                                                 np.argsort(-np.abs(a))[:k]),
                                                         0, a)))((r + g).numpy())
    assert verdict(ex.check_topk_error_feedback, numpy_version, capsys)[0]


@pytest.mark.parametrize("i", range(len(TOPK_CASES)))
def test_check_topk_fails_mistakes_with_hint(i, capsys):
    fn, hint = TOPK_CASES[i]
    ok, out = verdict(ex.check_topk_error_feedback, fn, capsys)
    assert not ok and hint in out, out


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("check", list(ex.CHECKS.values()))
def test_checks_reject_a_non_function_naming_it(check):
    with pytest.raises(TypeError, match="got int 42"):
        check(42)


def test_check_grouper_rejects_an_unknown_strategy():
    with pytest.raises(ValueError, match="'mixed'"):
        ex.check_grouper(GROUPERS["mixed"], "mixed")


def test_exercises_keeps_its_public_names_after_the_split():
    public = {"NOT_WRITTEN", "Failure", "TIME_LIMIT_S", "ADVANTAGE_MISTAKES", "LOSS_MISTAKES",
              "GSPO_MISTAKES", "KL_MISTAKES", "CHECKS", "check_advantages", "check_grpo_loss",
              "check_grouper", "check_topk_error_feedback", "check_gspo_ratio",
              "check_kl_estimators", "AGENT_LOSS_MISTAKES", "check_environment",
              "check_agent_loss"}
    assert all(hasattr(ex, n) for n in public) and set(ex.__all__) == public
    assert set(ex.CHECKS.values()) == {getattr(ex, n) for n in public if n.startswith("check_")}


def test_the_time_limit_set_on_exercises_is_the_one_the_checks_read(monkeypatch):
    import time

    from grpo_lab.teaching import exercise_harness as H
    assert ex.TIME_LIMIT_S == H.TIME_LIMIT_S == 10.0
    with monkeypatch.context() as m:
        m.setattr(ex, "TIME_LIMIT_S", 0.2)
        assert H.TIME_LIMIT_S == 0.2
        got, hint = H.call(time.sleep, 2.0)
        assert got is None and "did not return within 0.2 s" in hint
    assert ex.TIME_LIMIT_S == H.TIME_LIMIT_S == 10.0                   # undone in both places
