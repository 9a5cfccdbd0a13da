"""Measurements of gradient bytes for the claims table (claims 2, 3, 16): real gradients of the
toy policy, their e4m3 round-trip error (fp8_errors), the entropy bound and the codecs' bits per
top-k index (index_bound, topk_index_bits), bytes per element and per message by format
(format_savings, exchange_bytes). claims_live.py has the arithmetic."""
from __future__ import annotations

import math

import numpy as np
import torch

from grpo_lab.distributed import codecs
from grpo_lab.distributed.wire import FORMAT_BYTES


def real_gradients(steps: int = 1) -> list[dict]:
    """Real gradients of the toy policy (``experiments.record_gradients``: supervised steps from the
    base checkpoint), each split into named tensors. About 2 s for one."""
    from grpo_lab.training.experiments import record_gradients
    rec = record_gradients(steps=steps)
    sizes = [math.prod(shape) for shape in rec["shapes"]]
    return [{name: g.view(shape)
             for name, shape, g in zip(rec["names"], rec["shapes"], flat.split(sizes))}
            for flat in rec["grads"]]                                      # (numel,) per step


def real_gradient(steps: int = 1) -> dict:
    """The last of ``real_gradients(steps)``."""
    return real_gradients(steps)[-1]


def fp8_errors(named_grads: dict, fmt: str = "e4m3") -> dict:
    """Claim 2: relative L2 error ||fp8(g) - g|| / ||g|| of each tensor's round trip (one scale
    per tensor, compression.fp8_quantize). {name: error}; all-zero tensors are skipped."""
    from grpo_lab.distributed.compression import fp8_dequantize, fp8_quantize
    out = {}
    for name, g in named_grads.items():
        if float(g.norm()) > 0:
            codes, scales = fp8_quantize(g, fmt)
            out[name] = float((fp8_dequantize(codes, scales, fmt) - g.reshape(-1)).norm() / g.norm())
    return out


def index_bound(density: float = 0.05, n: int = 1_000_000) -> dict:
    """Claim 3: the fewest bits per index of a random k-of-n set, n H(k/n) / k, and the best
    ratio against int32 and int64; ``density_8to1``: the density where the bound is 4 bits."""
    bits = codecs.entropy_bound_bits(round(density * n), n)
    lo, hi = 1e-4, 0.5                                   # bound(d) = H(d)/d falls as d grows
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if codecs.entropy_bound_bits(round(mid * n), n) > 4.0 else (lo, mid)
    return {"bits": bits, "vs_int32": 32 / bits, "vs_int64": 64 / bits, "density_8to1": hi}


def topk_index_bits(named_grads: dict, density: float = 0.05,
                    codec_names=("huffman", "rice", "ans", "zstd")) -> dict:
    """Claim 3 on a real gradient: bits per index each codec actually produces for the top
    ``density`` positions by magnitude, chosen two ways:

      * "global": over the whole model at once (one index set over all n elements);
      * "per_tensor": each tensor's own top ``density`` (what the ``fp8_topk5`` protocol sends),
        bytes summed over tensors.

    -> {"global": {codec: bits}, "per_tensor": {codec: bits}, "bound": n H(d)/k bits (random
    positions), "share_top_tensor": the global top-k's share that falls in its busiest tensor}."""
    flat = torch.cat([g.reshape(-1) for g in named_grads.values()])       # (n,)
    n, k = flat.numel(), max(1, round(density * flat.numel()))
    idx = np.sort(torch.topk(flat.abs(), k).indices.numpy())                # (k,) global positions
    out = {"global": {c: codecs.index_cost(c, idx, n).bits_per_index for c in codec_names},
           "bound": codecs.entropy_bound_bits(k, n), "k": k, "n": n}
    sizes = [g.numel() for g in named_grads.values()]
    edges = np.cumsum([0] + sizes)
    out["share_top_tensor"] = float(np.bincount(np.searchsorted(edges, idx, "right") - 1,
                                                minlength=len(sizes)).max() / k)
    per = {c: 0 for c in codec_names}
    total_k = 0
    for g in named_grads.values():
        kt = max(1, round(density * g.numel()))
        it = np.sort(torch.topk(g.reshape(-1).abs(), kt).indices.numpy())   # (kt,) in this tensor
        total_k += kt
        for c in codec_names:
            per[c] += 8 * codecs.index_cost(c, it, g.numel()).nbytes
    out["per_tensor"] = {c: b / total_k for c, b in per.items()}
    return out


def format_savings(block: int = 128) -> dict:
    """Claim 16, arithmetic: fraction of bytes saved against fp32 per element
    (wire.FORMAT_BYTES); int8 and e4m3 are 1 byte, plus a 4-byte scale per ``block`` elements
    when scaled by block."""
    fp32 = FORMAT_BYTES["fp32"]
    return {"fp16": 1 - FORMAT_BYTES["fp16"] / fp32, "int8": 1 - 1 / fp32,
            "int8_block_scaled": 1 - (1 + 4 / block) / fp32, "e4m3": 1 - FORMAT_BYTES["e4m3"] / fp32}


def exchange_bytes(named_grads: dict, formats=("fp32", "fp16", "e4m3")) -> dict:
    """Claim 16, measured: the bytes of the message ``compression.Compressor`` produces for
    ``named_grads`` with every tensor sent dense in each format (wire headers and per-tensor
    scales included) -> {format: bytes}."""
    from grpo_lab.distributed.compression import CompressionConfig, Compressor
    return {f: len(Compressor(CompressionConfig(dense_fraction=1.0, dense_format=f)).encode(named_grads))
            for f in formats}
