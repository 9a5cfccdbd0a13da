"""Lean decode steps for Llama-family transformers models: the sampler's one-token forwards
without transformers' per-call machinery.

A decode step of SmolLM2-135M through ``model(...)`` with a ``DynamicCache`` costs 113 ms for
8 rows and 232 ms for 32 on one core of this machine, of which the 211 linear layers' GEMMs
are 62 and 144 ms: the rest is transformers' work around them (the 4-D mask built from the
key mask every call, the cache's per-layer concatenation, module dispatch, sdpa's checks).
``LlamaDecoder`` runs the same arithmetic as ``LlamaForCausalLM``'s forward for one new
token per row, written out:

  * q, k and v projections as one GEMM (the three weights stacked: 15% less time than three
    at 8 rows; gate and up stacked were slower than apart, so they stay apart);
  * the KV cache a preallocated buffer per layer (``StaticCache``) that each step writes one
    column of, so nothing is concatenated or reallocated;
  * the key mask turned into an additive bias once per step, not once per layer;
  * the output head in column blocks of 2,048 vocabulary rows (MKL's GEMM at 8-32 rows and
    49,152 columns runs 10-25% faster in blocks that stay in cache);
  * at up to 8 rows and one torch thread every GEMM (head included) is ``small_gemm``'s
    streaming kernel instead of MKL's: 52 vs 84 ms for SmolLM2's layers at 8 rows;
  * bf16 weights, where oneDNN runs bf16 natively (``PACK_BF16``), are packed into oneDNN's
    layout once per update instead of on every GEMM call (the same products).

What it computes is the model's own: RMSNorm as ``LlamaRMSNorm`` (float32 variance, weight
times the normalised input), RoPE from the model's own ``rotary_emb`` module (so every rope
type transformers implements is honoured), grouped-query attention with the module's
``scaling``, SiLU-gated MLP, tied or untied head. Stacking weights changes how the GEMM
blocks its sums, and the fp32 attention is a matmul + softmax instead of sdpa (bf16's is
sdpa, which keeps scores and probabilities in float32: a bf16 matmul + softmax moved a tiny
model's logits 2.5x further from fp32 than transformers' bf16 forward): the logits equal
transformers' within the weights' rounding (tests/test_decoder.py), not bit for bit; tokens
are sampled from them as from any logits, so 1 and N processes still sample the same tokens.

It runs float32 weights (the master model) or bfloat16 ones (``hf.sample_dtype`` "bfloat16":
the sampling copy), everything in the weights' dtype as transformers' bf16 forward does. With
bf16 weights a SmolLM2 decode step of 32 rows took 106 CPU ms against transformers' 136 and
the fp32 decoder's 193 (2 threads, an AMX Xeon; BENCHMARKS section 33).

Scope (``DECODERS``: the architectures it knows, by ``config.model_type``): Llama-style
models without biases (Llama, SmolLM, Mistral without sliding window), bare or with ``peft``
LoRA adapters (each adapted layer's base GEMM, then scale * (x A^T) B^T added as peft's
forward does: no merged copy of the weights, which would cost LoRA the memory it saves).
Anything else, and fp32 sampling under autocast, uses transformers' forward
(``HFPolicy.lean_decoder`` returns None). The stacked q/k/v weights are the one copy: stacked
again at a rollout's start when one of them changed (tensor version counters), i.e. after an
optimizer step of full fine-tuning: ~40 ms for SmolLM2 against seconds of decoding.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from grpo_lab.policies import small_gemm

HEAD_BLOCK = 2048
"""Vocabulary rows per block of the output head's GEMM."""
DTYPES = (torch.float32, torch.bfloat16)
"""The weights' dtypes it runs: the master model (float32) or a bf16 sampling copy."""


def _onednn_bf16() -> bool:
    """Whether this torch's oneDNN runs bf16 natively on this CPU and has the packing ops
    (private ones, what inductor uses: a torch without them packs nothing)."""
    try:
        return bool(torch.backends.mkldnn.is_available()
                    and torch.ops.mkldnn._is_mkldnn_bf16_supported()
                    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                    and hasattr(torch.ops.mkldnn, "_linear_pointwise"))
    except (AttributeError, RuntimeError):
        return False


PACK_BF16 = _onednn_bf16()
"""bf16 weights are packed once per update into oneDNN's blocked layout (what inductor's CPU
freezing does) where oneDNN runs bf16 natively: the same products as ``F.linear``'s (which
reorders the weight on every call), bit for bit on the CPU measured, 1.65x faster for
SmolLM2's MLP weights at 32 rows streamed from memory (an AMX Xeon; BENCHMARKS section 34)."""


def _packed_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (n, K) @ W^T for a weight packed by ``torch.ops.mkldnn._reorder_linear_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def _base(linear: nn.Module) -> torch.Tensor:
    """The weight (N, K) of a linear layer, or of a ``peft`` LoRA layer's base layer."""
    return getattr(linear, "base_layer", linear).weight


def _adapters(linear: nn.Module, lo: int = 0) -> list:
    """A ``peft`` LoRA layer's active adapters as (A (r, K), B (N, r), scale, lo, lo + N): what
    its forward adds to output columns [lo, lo + N) (dropout 0); [] for a plain layer or with
    the adapters disabled or merged."""
    if (not hasattr(linear, "lora_A") or getattr(linear, "disable_adapters", False)
            or getattr(linear, "merged", False)):
        return []
    n = _base(linear).shape[0]
    return [(linear.lora_A[a].weight, linear.lora_B[a].weight, float(linear.scaling[a]), lo,
             lo + n) for a in linear.active_adapters if a in linear.lora_A]


def _with_adapters(y: torch.Tensor, x: torch.Tensor, adapters: list) -> torch.Tensor:
    """y (n, N) += scale * (x A^T) B^T in each adapter's columns (peft's order: A first)."""
    for A, B, scale, lo, hi in adapters:
        y[:, lo:hi].add_(F.linear(F.linear(x, A), B), alpha=scale)
    return y


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``LlamaRMSNorm``: w * x / sqrt(mean(x^2) + eps), torch's fused op (it accumulates a
    bf16 input in float32, as ``LlamaRMSNorm`` does; the product with w is rounded once, where
    transformers rounds x's normalised value to bf16 first)."""
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as transformers' ``apply_rotary_pos_emb``: x (n, h, d), cos/sin (n, 1, d)."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)                # (n, h, d)
    return x * cos + rot * sin


class StaticCache:
    """Keys and values of every layer in preallocated buffers (L, N, KV, T_max, d): column t
    holds position t of every row's sequence (prompts are left-padded, so all rows share
    the column index). ``t``: the columns filled. Rows are repeated and selected in place
    through transformers' Cache method names, so ``HFPolicy.repeat_cache`` and
    ``select_cache`` treat it as any cache."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, t: int):
        self.keys, self.values, self.t = keys, values, t

    @property
    def rows(self) -> int:
        return self.keys.shape[1]

    def batch_repeat_interleave(self, G: int) -> "StaticCache":
        self.keys = self.keys.repeat_interleave(G, 1)
        self.values = self.values.repeat_interleave(G, 1)
        return self

    def batch_select_indices(self, rows: torch.Tensor) -> "StaticCache":
        """Keep rows ``rows`` (n,) long, increasing: the decode batch without its finished
        rows. Compacted in place, row by row, the t filled columns only (the buffers keep
        their size; the cache becomes a view of their first n rows). Row j takes row
        rows[j] >= j, in increasing j, so no source is overwritten before it is read.
        Gathering with an index tensor (``buf[:, rows]``, ``index_select``) ran at ~1.5 GB/s
        here: 63 ms a selection on SmolLM2's 32-row cache against ~5 ms for this loop."""
        n, t = rows.shape[0], self.t
        if n and (int(rows[0]) < 0 or not bool((rows[1:] > rows[:-1]).all())):
            raise ValueError(f"StaticCache.batch_select_indices takes increasing row indices, got "
                             f"{rows.tolist()}")
        for j, r in enumerate(rows.tolist()):
            if j != r:
                for buf in (self.keys, self.values):                       # (L, N, KV, T, d)
                    buf[:, j, :, :t].copy_(buf[:, r, :, :t])
        self.keys, self.values = self.keys[:, :n], self.values[:, :n]
        return self


class LlamaDecoder:
    """One-token forwards of a ``LlamaForCausalLM``-shaped model (see the module docstring)."""

    def __init__(self, model: nn.Module):
        self.model = model
        body = model.model
        cfg = model.config
        self.eps = float(cfg.rms_norm_eps)
        att = body.layers[0].self_attn
        self.H, self.KV = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = att.head_dim
        self.scaling = float(att.scaling)
        self.L = len(body.layers)
        self._stamp = None
        self.refresh()

    def refresh(self) -> None:
        """Point at the model's weights (references: in-place updates reach them) and stack
        q/k/v again if one of them changed since the last stacking (tensor version counters;
        with LoRA the base weights are frozen, so only the first call stacks); bf16 weights
        where ``PACK_BF16``: every weight packed again when one changed (~75 ms for SmolLM2)."""
        body = self.model.model
        qkv = [(_base(l.self_attn.q_proj), _base(l.self_attn.k_proj), _base(l.self_attn.v_proj))
               for l in body.layers]
        self.gate = [_base(l.mlp.gate_proj) for l in body.layers]
        self.up = [_base(l.mlp.up_proj) for l in body.layers]
        self.o = [_base(l.self_attn.o_proj) for l in body.layers]
        self.down = [_base(l.mlp.down_proj) for l in body.layers]
        self.head = _base(self.model.lm_head)                              # (V, C)
        pack = (PACK_BF16 and self.head.dtype == torch.bfloat16
                and self.head.device.type == "cpu")
        watched = [w for ws in qkv for w in ws]
        if pack:
            watched += [*self.gate, *self.up, *self.o, *self.down, self.head]
        stamp = [(w.data_ptr(), w._version) for w in watched]
        if stamp != self._stamp:
            with torch.no_grad():
                self.qkv = [torch.cat(ws) for ws in qkv]                   # ((H+2KV) d, C) each
                self.weights = {"qkv": self.qkv, "o": self.o, "gate": self.gate, "up": self.up,
                                "down": self.down, "head": [self.head]}
                if pack:                   # the GEMMs' operands: the same weights, packed
                    self.weights = {k: [torch.ops.mkldnn._reorder_linear_weight(w) for w in ws]
                                    for k, ws in self.weights.items()}
                self.packed = pack
            self._stamp = stamp
        self.adapters = {}                 # (layer, projection) -> _adapters(...): LoRA only
        for i, l in enumerate(body.layers):
            a = l.self_attn
            H, KV, d = self.H, self.KV, self.d
            found = {"qkv": _adapters(a.q_proj) + _adapters(a.k_proj, H * d)
                     + _adapters(a.v_proj, (H + KV) * d), "o": _adapters(a.o_proj),
                     "gate": _adapters(l.mlp.gate_proj), "up": _adapters(l.mlp.up_proj),
                     "down": _adapters(l.mlp.down_proj)}
            self.adapters.update({(i, k): v for k, v in found.items() if v})
        if _adapters(self.model.lm_head):
            self.adapters["head"] = _adapters(self.model.lm_head)
        self.norm1 = [l.input_layernorm.weight for l in body.layers]
        self.norm2 = [l.post_attention_layernorm.weight for l in body.layers]
        self.norm_f = body.norm.weight
        self.embed = body.embed_tokens.weight

    def start(self, cache, G: int, max_new_tokens: int) -> StaticCache:
        """transformers' prompt cache (B rows, Tp columns) -> a StaticCache of B*G rows with
        room for ``max_new_tokens`` more columns."""
        self.refresh()
        layers = cache.layers
        k0 = layers[0].keys                                                # (B, KV, Tp, d)
        B, KV, Tp, d = k0.shape
        shape = (self.L, B, KV, Tp + max_new_tokens, d)
        keys, values = k0.new_empty(shape), k0.new_empty(shape)     # k0's dtype and device
        for i, layer in enumerate(layers):
            keys[i, :, :, :Tp] = layer.keys
            values[i, :, :, :Tp] = layer.values
        return StaticCache(keys, values, Tp).batch_repeat_interleave(G)

    @torch.no_grad()
    def step(self, tok: torch.Tensor, pos: torch.Tensor, key_mask: torch.Tensor,
             cache: StaticCache) -> torch.Tensor:
        """tok (n,) long, pos (n,) long, key_mask (n, t+1) bool over the cached columns and
        the new one -> logits (n, V) of the next token; the cache gets column t."""
        n = tok.shape[0]
        t = cache.t
        if key_mask.shape != (n, t + 1) or cache.rows != n:
            raise ValueError(f"decode step: {n} tokens, key mask {tuple(key_mask.shape)} and "
                             f"a cache of {cache.rows} rows x {t} columns do not agree")
        if t >= cache.keys.shape[3]:
            raise ValueError(f"the decode cache holds {cache.keys.shape[3]} positions; "
                             f"step {t + 1} does not fit")
        H, KV, d = self.H, self.KV, self.d
        g = H // KV
        h = self.embed[tok]                                                # (n, C)
        cos, sin = self.model.model.rotary_emb(h, pos[:, None])            # (n, 1, d) each
        bias = torch.zeros(n, 1, 1, t + 1, dtype=h.dtype, device=h.device)
        bias.masked_fill_(~key_mask[:, None, None], float("-inf"))         # (n, 1, 1, t+1)
        lin = small_gemm.linear_rows8 if small_gemm.applies(h, self.head) else F.linear
        W = self.weights                   # weight lists by name: the model's, or packed
        if self.packed:
            lin = _packed_linear
        ad = self.adapters                                                 # {} without LoRA
        for i in range(self.L):            # (every weight C-contiguous, float32 or bf16)
            x = _rms(h, self.norm1[i], self.eps)                           # (n, C)
            qkv = _with_adapters(lin(x, W["qkv"][i]), x, ad.get((i, "qkv"), ()))  # (n, (H+2KV) d)
            qk = _rotate(qkv[:, :(H + KV) * d].view(n, H + KV, d), cos, sin)  # (n, H+KV, d)
            q, k = qk[:, :H], qk[:, H:]                                    # (n, H|KV, d)
            cache.keys[i, :, :, t] = k
            cache.values[i, :, :, t] = qkv[:, (H + KV) * d:].view(n, KV, d)
            keys = cache.keys[i, :, :, :t + 1]                             # (n, KV, t+1, d)
            vals = cache.values[i, :, :, :t + 1]                           # (n, KV, t+1, d)
            q = q.reshape(n, KV, g, d)                     # a KV head's g queries together
            if h.dtype == torch.float32:
                s = torch.matmul(q, keys.transpose(2, 3))                  # (n, KV, g, t+1)
                p = torch.softmax(s.mul_(self.scaling).add_(bias), dim=-1)
                o = o_in = torch.matmul(p, vals).reshape(n, H * d)         # (n, H d)
            else:            # bf16: sdpa keeps scores and probabilities in float32, as
                o = o_in = F.scaled_dot_product_attention(                 # transformers' does
                    q, keys, vals, attn_mask=bias, scale=self.scaling).reshape(n, H * d)
            o = lin(o, W["o"][i])                                          # (n, C)
            h = h + _with_adapters(o, o_in, ad.get((i, "o"), ()))
            x = _rms(h, self.norm2[i], self.eps)
            gate = _with_adapters(lin(x, W["gate"][i]), x, ad.get((i, "gate"), ()))  # (n, I)
            up = _with_adapters(lin(x, W["up"][i]), x, ad.get((i, "up"), ()))        # (n, I)
            m = F.silu(gate).mul_(up)                                      # (n, I)
            down = lin(m, W["down"][i])                                    # (n, C)
            h = h + _with_adapters(down, m, ad.get((i, "down"), ()))
        cache.t = t + 1
        h = _rms(h, self.norm_f, self.eps)                                 # (n, C)
        if "head" in ad:
            head = lin if self.packed else F.linear
            return _with_adapters(head(h, W["head"][0]), h, ad["head"])    # (n, V)
        if lin is not F.linear:
            return lin(h, W["head"][0])                                    # (n, V)
        return torch.cat([F.linear(h, self.head[s:s + HEAD_BLOCK])        # (n, V)
                          for s in range(0, self.head.shape[0], HEAD_BLOCK)], dim=1)


def _llama_like(model: nn.Module) -> str:
    """'' if ``LlamaDecoder`` computes this model's forward, else why not."""
    cfg = model.config
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "biases in attention or MLP"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act}"
    if getattr(cfg, "sliding_window", None):
        return "sliding-window attention"
    if not hasattr(getattr(model, "model", None), "rotary_emb"):
        return "no model.rotary_emb"
    return ""


DECODERS = {"llama": (LlamaDecoder, _llama_like), "mistral": (LlamaDecoder, _llama_like)}
"""config.model_type -> (decoder class, a check returning '' or why it does not apply)."""


def decoder_for(model: nn.Module):
    """A lean decoder for ``model`` (a transformers causal LM in float32 or bfloat16, bare or
    with peft LoRA adapters, which it adds as peft does), or None."""
    if hasattr(model, "get_base_model"):                                   # peft
        model = model.get_base_model()
    kind = DECODERS.get(getattr(model.config, "model_type", ""))
    if kind is None or next(model.parameters()).dtype not in DTYPES or kind[1](model):
        return None
    return kind[0](model)
