"""The toy policy's char tokenizer: one id per character of ``ALPHABET``, plus <pad> and <eos>.

The built-in tasks (tasks.py) write prompts and answers in this alphabet, the toy GPT
(model.py) has one embedding row per id, and the sampler (rollout.py) pads with ``PAD``.
A Hugging Face policy brings its own tokenizer (hf.py); tasks stay text in, text out.
"""
from __future__ import annotations

from typing import Sequence

PAD, EOS = 0, 1
ALPHABET = " 0123456789+-*=<>:,.?abcdefghijklmnopqrstuvwxyz"
ITOS = ["<pad>", "<eos>"] + list(ALPHABET)
STOI = {c: i for i, c in enumerate(ITOS) if i >= 2}
VOCAB_SIZE = len(ITOS)


def encode(text: str) -> list[int]:
    """Characters to token ids; raises on a character outside ``ALPHABET``."""
    bad = sorted({c for c in text if c not in STOI})
    if bad:
        raise ValueError(f"text {text!r} has characters outside the tokenizer's alphabet: {bad}")
    return [STOI[c] for c in text]


def unknown_chars(text: str) -> list[str]:
    """The characters of ``text`` outside ``ALPHABET`` (sorted, each once): what the toy
    policy cannot read or write."""
    return sorted({c for c in text if c not in STOI})


def decode(ids: Sequence[int]) -> str:
    """Token ids to text, stopping at the first <eos> and skipping <pad>."""
    ids = [int(i) for i in ids] + [EOS]                                   # an <eos> to stop at
    return "".join(ITOS[i] for i in ids[:ids.index(EOS)] if i != PAD)
