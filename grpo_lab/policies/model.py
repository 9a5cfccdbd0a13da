"""A char-level GPT policy with a KV cache (after nanoGPT's model.py, Karpathy 2022).

Deviations from nanoGPT, all for RL sampling:
  * ``forward`` takes explicit positions and a key mask, so a batch can hold prompts of
    different lengths (left-padded) and completions that stopped at different steps.
  * ``forward`` takes and returns a KV cache (a list of per-layer (k, v) tensors), so
    sampling a new token costs one position, not the whole sequence. The full forward and
    the cached path compute the same numbers (tests/test_model.py checks allclose).
  * No dropout by default: RL needs the sampling policy and the trained policy to agree.
  * Two memory levers act on a training forward only (``self.training`` and grad enabled), so
    sampling, the reference and evaluation never see them; ``policy.load_for`` sets both
    from ``TrainConfig``:
    ``checkpoint_every = k``: block i runs under ``torch.utils.checkpoint`` when i % k == 0
    (transformers' ``every_n_layers`` rule, so k means the same for policy="hf"): it keeps
    only its input and recomputes its activations in backward (Chen et al. 2016); the cache
    returned then holds None for it (a training forward's keys and values are not needed,
    and keeping them would cost two inputs' worth per block).
    ``autocast``: bf16 autocast (mixed precision; weights stay float32); the callers take
    log-probs in float32 (``logits.float()``).
Weights are saved and loaded with safetensors, never pickle.
"""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from grpo_lab.checkpoint import (CKPT_TAG, CheckpointError, atomic_save_tensors,
                                 load_state_strict, meta_field, policy_tensors,
                                 read_tensors)
from grpo_lab.policies.engine import Engine
from grpo_lab.tokenizer import EOS, PAD, VOCAB_SIZE, decode, encode, unknown_chars

FORMAT_TAG = "grpo_lab.policy.v1"
KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: k, v each (B, nh, T, hs)


@dataclass
class GPTConfig:
    vocab_size: int = VOCAB_SIZE
    """Number of token ids (the char tokenizer's size)."""
    block_size: int = 32
    """Longest sequence (prompt + completion) the position table covers."""
    n_layer: int = 3
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block."""
    n_embd: int = 80
    """Width of the residual stream."""

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be positive, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, mask, past):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.qkv(x).split(C, dim=2))                   # (B, nh, T, hs) each
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, nh, Tk, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)        # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)                             # (B, T, C)
        return self.proj(y), (k, v)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x, mask, past):
        a, kv = self.attn(self.ln1(x), mask, past)
        x = x + a
        return x + self.mlp(self.ln2(x)), kv


class GPT(Engine):
    """The toy policy: an engine.Engine with the char tokenizer of tasks.py."""
    pad_id, eos_id = PAD, EOS
    encode = staticmethod(encode)
    decode = staticmethod(decode)
    unknown_chars = staticmethod(unknown_chars)
    checkpoint_every = 0          # training forward: checkpoint block i if i % k == 0 (0: off)
    autocast = False              # training forward: bf16 autocast

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying (Press & Wolf 2017), as nanoGPT
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2 scaled init of residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    @staticmethod
    def repeat_cache(cache: KVCache, G: int) -> KVCache:
        """Each row's (k, v) repeated G times in place order: (B, ...) -> (B*G, ...)."""
        return [(k.repeat_interleave(G, 0), v.repeat_interleave(G, 0)) for k, v in cache]

    @staticmethod
    def select_cache(cache: KVCache, rows: torch.Tensor) -> KVCache:
        """Keep the cache's rows ``rows`` (n,) long: (N, ...) -> (n, ...)."""
        return [(k[rows], v[rows]) for k, v in cache]

    @property
    def checkpointing(self) -> bool:
        """The training forward recomputes activations (and keeps no KV cache)."""
        return bool(self.checkpoint_every)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, pos: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None, cache: KVCache | None = None,
                return_hidden: bool = False, logits_to_keep: int = 0,
                use_cache: bool | None = None):
        """The Engine forward (engine's module docstring): logits for ``idx`` (B, T) ->
        ((B, T|k, V), the cache extended); ``return_hidden`` adds the last hidden states
        (B, T, C). Defaults: ``pos`` 0..T-1 after the cache, every key real. A (B, T, Tk)
        ``key_mask`` replaces the causal rule (engine.packed_logits). ``use_cache`` is for the
        interface: this model always returns its cache."""
        B, T = idx.shape
        past_len = 0 if cache is None else cache[0][0].shape[2]
        qi = torch.arange(past_len, past_len + T, device=idx.device)[:, None]  # (T, 1) absolute
        pos = qi[:, 0].expand(B, T) if pos is None else pos                # (B, T)
        if int(pos.max()) >= self.cfg.block_size:
            raise ValueError(f"position {int(pos.max())} is past block_size={self.cfg.block_size}")
        # query i sees key j if j <= i and key j is real; a query always sees itself, so a
        # padding row is never all -inf (no NaN).
        kj = torch.arange(past_len + T, device=idx.device)[None, :]        # (1, Tk)
        mask = (kj <= qi)[None]                                            # (1, T, Tk)
        if key_mask is not None:                        # (B, Tk) real keys, or (B, T, Tk) whole
            see = key_mask if key_mask.dim() == 3 else mask & key_mask[:, None, :]
            mask = see | (kj == qi)[None]                                  # (B, T, Tk)
        mask = mask[:, None]                                               # (B|1, 1, T, Tk)
        train = self.training and torch.is_grad_enabled()
        every = self.checkpoint_every if train and cache is None else 0
        with torch.autocast(idx.device.type, torch.bfloat16, enabled=self.autocast and train):
            x = self.wte(idx) + self.wpe(pos)                              # (B, T, C)
            new_cache = []
            for i, block in enumerate(self.blocks):
                if every and i % every == 0:           # keeps x only, recomputes in backward
                    x, kv = checkpoint(block, x, mask, None, use_reentrant=False)[0], None
                else:
                    x, kv = block(x, mask, None if cache is None else cache[i])
                new_cache.append(kv)
            h = self.ln_f(x)                                               # (B, T, C)
            logits = self.lm_head(h[:, -logits_to_keep:] if logits_to_keep else h)  # (B, T|k, V)
        return (logits, new_cache, h) if return_hidden else (logits, new_cache)


def save_policy(model: GPT, path: str | Path, extra: dict | None = None) -> None:
    """Write the policy's weights and config to one safetensors file, atomically."""
    meta = {"format": FORMAT_TAG, "config": json.dumps(asdict(model.cfg))}
    meta.update({k: json.dumps(v) for k, v in (extra or {}).items()})
    tensors = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    atomic_save_tensors(tensors, path, meta)


def load_policy(path: str | Path) -> GPT:
    """Read a policy written by ``save_policy``; clear errors on foreign or broken files.

    A toy run's training checkpoint is accepted too, with a warning: its policy's weights
    only (no optimizer state, no PPO critic), so ``--base_checkpoint runs/x/checkpoint.safetensors``
    starts a new run from where that one stopped; ``--resume`` continues the run itself."""
    tensors, meta = read_tensors(path)
    if meta.get("format") == CKPT_TAG:
        if "path" in meta_field(meta, "model_config", path):
            raise ValueError(f"{path} is the training checkpoint of a transformers run: a toy "
                             f"policy cannot start from it; continue that run with "
                             f"--out_dir <its folder> --resume")
        warnings.warn(f"{path} is a training checkpoint (saved at step {meta.get('step')}): "
                      f"starting a new run from its policy's weights (not its optimizer state); to "
                      f"continue that run instead, use --out_dir <its folder> --resume",
                      stacklevel=2)
        weights = {k: v for k, v in policy_tensors(tensors).items()
                   if not k.startswith("value_head.")}           # a PPO run's critic: left out
        model = GPT(model_config(meta, path, "model_config"))
        load_state_strict(model, weights, path)
        return model
    return policy_from_tensors(tensors, meta, path)


def policy_from_tensors(tensors: dict, meta: dict, path) -> GPT:
    """The policy held by an already-read ``save_policy`` file (``path`` names it in errors).

    Strict: the config must parse, and every weight must be present with its shape and no
    other tensor in the file (``checkpoint.load_state_strict``), else a ``CheckpointError``.
    """
    if meta.get("format") != FORMAT_TAG:
        raise ValueError(f"{path} is not a grpo_lab policy file "
                         f"(format tag {meta.get('format')!r}, expected {FORMAT_TAG!r})")
    model = GPT(model_config(meta, path, "config"))
    load_state_strict(model, tensors, path)
    return model


def model_config(meta: dict, path, key: str = "config") -> GPTConfig:
    """The ``GPTConfig`` stored as JSON under ``meta[key]``; a ``CheckpointError`` naming the
    file if it is absent or not a valid config. Training checkpoints keep it under
    ``"model_config"``."""
    try:
        return GPTConfig(**json.loads(meta[key]))
    except (KeyError, TypeError, ValueError) as e:       # absent, unknown field, bad value
        raise CheckpointError(f"{path}: metadata {key!r} is not a policy config: "
                              f"{type(e).__name__}: {e}") from None


# ---- the critics PPO trains (algorithm/critic.py; a PPO run's checkpoint holds one)

class ValueHead(nn.Module):
    """A scalar value per position from the policy's hidden states (B, T, C) -> (B, T)."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden).squeeze(-1)                                      # (B, T)


class ValueNetwork(nn.Module):
    """A critic with a body of its own: (ids, pos, key mask) (B, T) -> values (B, T)."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body                            # a toy GPT, e.g. a copy of the base policy
        self.head = ValueHead(body.cfg.n_embd)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        _, _, h = self.body(ids, pos, mask, return_hidden=True)               # (B, T, C)
        return self.head(h.float())                                           # (B, T)
