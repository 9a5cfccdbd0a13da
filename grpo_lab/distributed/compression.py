"""Gradient compression: FP8 for the important tensors, Top-K with error feedback for the rest.

Byte accounting, per gradient element (what each choice puts on the wire):

    fp32                    32 bits                                               1x
    fp16 / bf16             16 bits                                               2x
    fp8 e4m3 / e5m2          8 bits + a 32-bit scale per tensor (or per block of B
                            elements: 8 + 32/B bits; B = 128 -> 8.25)              ~4x
    top-k at density d       d * (32 value bits + b index bits) per element
                              d = 5%,  int32 indices (b = 32):     3.20 bits     10x
                              d = 5%,  coded at the bound 5.73:    1.89 bits     17x
                              d = 0.1%, coded at the bound 11.4:   0.043 bits   737x

The ``fp8_topk5`` preset sends the top 20% of elements (whole tensors, by importance) in FP8 and
top-k 5% of the rest with Huffman-coded indices: 0.2 * 8 + 0.8 * 0.05 * (32 + 5.8) = 3.1
bits per element, about 10x less than fp32. The indices can never be squeezed 8:1 against
int32 at 5% density: a random 5% subset of n positions holds n * H(0.05) bits, 5.73 bits per
index, so the best any coder does is 32 / 5.73 = 5.6x (see ``codecs``).

Mechanisms and papers:
  * FP8 (Micikevicius et al. 2022, "FP8 formats for deep learning"): scale = amax / format max
    (448 for e4m3, 57344 for e5m2) so the largest magnitude lands on the top of the range;
    values below the smallest subnormal after scaling flush to zero (counted, not hidden).
    CPUs cannot do fp8 arithmetic but can cast; the payload is the uint8 view.
  * Top-K with error feedback (Seide et al. 2014; Stich et al. 2018; Karimireddy et al. 2019):
    what is not sent is kept in a residual and added to the next step's gradient, so every
    gradient entry is eventually sent: sent over all steps + residual == sum of gradients.
  * Deep Gradient Compression (Lin et al. 2018): a sampled threshold instead of an exact
    top-k (sec. 3.1 / "hierarchical" selection), momentum correction and momentum factor
    masking (sec. 3.2, 3.3: accumulate u = m u + g, then v = v + u; send top-k of v; zero
    both where sent; the receiver then applies plain SGD), and density warm-up (sec. 3.4:
    density shrinks exponentially from a large value over the first steps).
Deviations: the fp8/top-k split is per tensor (whole tensors, never a tensor cut in two);
top-k values travel as fp32 unless ``topk_format`` says fp8 (one scale per tensor over its k
values; the residual then keeps their rounding error too); DGC's local gradient clipping is
left out.

The fast path (``fast=True``, ``fastpath.py``): the same algorithm in whole-tensor torch ops
(on a CPU tensor fused numba kernels, ``kernels.py``; a whole ``fast_topk5`` record in three
kernel calls and a numpy partition, its decode in one), the residual updated in place, the
index codec's bytes written without one byte per bit. It
gives the same indices, values and bytes as this module's readable path for the same config
(``tests/test_fastpath.py``); ``fast_topk5`` is the preset built for speed (DGC's sampled
threshold, fp8 values, Rice), ``fp8_topk5_fast`` is ``fp8_topk5`` through the fast path
(Rice instead of Huffman: 5.79 instead of 5.76 bits per index, the same training).

The ``aggressive`` preset: top-k 0.3% of every tensor of more than 1024 elements with error
feedback, ANS-coded indices, the small tensors (biases, norm gains: 3,280 of the toy's 240,160
elements) dense in e4m3, as DGC's reference code leaves them uncompressed, a receiver AdamW
with beta1 = 0 (``adam_beta1``), and no density warm-up. Per step, for the toy: ~720 values x
(32 + ~9.9) bits + 3,280 x 8 bits + ~50 B a tensor x 40 = ~9.1 kB against 960 kB in fp32,
about 105x. DGC's density warm-up stays an option (``warmup_steps``): 25% -> 0.3% over 100
steps cost 2.5x the bytes of a 400-step run (41x instead of 105x) for no accuracy (94.0% with
and without it, bench/RESULTS_train_dist.md); DGC trains from scratch, the bench fine-tunes
a trained base.

Why ``aggressive`` departs from DGC as published (the ``dgc`` preset): DGC's momentum
correction assumes a plain-SGD receiver, and AdamW's beta1 = 0.9 smears each rare sent value
over later steps; the measurements that led there are in BENCHMARKS.md (section 4,
"how the aggressive preset was found").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from grpo_lab.distributed import codecs, fastpath, wire
from grpo_lab.distributed.wire import TensorRecord, WireError
from grpo_lab.registry import lookup


# --------------------------------------------------------------------------- value formats

class Fp8Format(NamedTuple):
    dtype: torch.dtype
    max: float              # largest finite magnitude
    mantissa_bits: int      # relative rounding error <= 2^-(mantissa_bits+1) in the normal range
    min_normal: float


FP8_FORMATS = {
    "e4m3": Fp8Format(torch.float8_e4m3fn, 448.0, 3, 2.0 ** -6),
    "e5m2": Fp8Format(torch.float8_e5m2, 57344.0, 2, 2.0 ** -14),
}
HALF_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def fp8_format(name: str) -> Fp8Format:
    return lookup(FP8_FORMATS, name, "fp8 format")


def fp8_quantize(x: torch.Tensor, fmt: str = "e4m3", block: int = 0):
    """-> (codes uint8 (n,), scales float32 (ceil(n/B),)); one scale per ``block`` (0 = tensor)."""
    spec = fp8_format(fmt)
    flat = x.detach().reshape(-1).float()                                  # (n,)
    n = flat.numel()
    if block < 0:
        raise ValueError(f"fp8 block must be >= 0 (0 = one scale per tensor), got {block}")
    B = min(block, n) if block and n else max(n, 1)     # a block past the tensor is one block
    nb = -(-n // B)
    padded = torch.nn.functional.pad(flat, (0, nb * B - n)).view(nb, B)   # (nb, B)
    amax = padded.abs().amax(1)                                            # (nb,)
    if not torch.isfinite(amax).all():                                     # inf or nan inside
        raise ValueError(f"cannot quantize {int((~torch.isfinite(flat)).sum())} non-finite values")
    scale = torch.where(amax > 0, amax / spec.max, torch.ones_like(amax))  # (nb,)
    q = (padded / scale[:, None]).to(spec.dtype)                           # (nb, B) fp8; the cast
    #                                                  saturates, so a rounding 448.0001 -> 448
    return q.view(torch.uint8).reshape(-1)[:n], scale                      # (n,), (nb,)


def fp8_dequantize(codes: torch.Tensor, scales: torch.Tensor, fmt: str = "e4m3",
                   block: int = 0) -> torch.Tensor:
    """uint8 codes (n,) and scales -> float32 (n,)."""
    spec = fp8_format(fmt)
    n = codes.numel()
    B = min(block, n) if block and n else max(n, 1)     # bounded by n: a peer's block of 2**27
    nb = -(-n // B)                                     # on 10 codes pads nothing
    if len(scales) != nb:
        raise ValueError(f"{len(scales)} scales for {n} codes in blocks of {block} (need {nb})")
    padded = torch.nn.functional.pad(codes.reshape(-1), (0, nb * B - n)).view(nb, B)  # (nb, B)
    return (padded.view(spec.dtype).float() * scales[:, None]).reshape(-1)[:n]        # (n,)


def fp8_flushed(x: torch.Tensor, x_hat: torch.Tensor) -> int:
    """How many nonzero values came back as zero (flushed below the smallest subnormal)."""
    return int(((x.reshape(-1) != 0) & (x_hat.reshape(-1) == 0)).sum())


def dense_encode(x: torch.Tensor, fmt: str, block: int = 0):
    """-> (value bytes, scales float32): the whole tensor in fp32 | fp16 | bf16 | e4m3 | e5m2."""
    if fmt in FP8_FORMATS:
        codes, scales = fp8_quantize(x, fmt, block)
        return codes.numpy().tobytes(), scales.numpy()
    dtype = lookup(HALF_DTYPES, fmt, "dense format", f"the fp8 ones: {sorted(FP8_FORMATS)}")
    v = x.detach().reshape(-1).to(dtype).contiguous()          # (n,)
    if v.numel() and not torch.isfinite(v.abs().amax()):
        raise ValueError(f"cannot encode {int((~torch.isfinite(v)).sum())} non-finite values "
                         f"(or beyond {fmt}'s range)")
    return v.view(torch.uint8).numpy().tobytes(), np.zeros(0, np.float32)


def dense_decode(values: bytes, scales: np.ndarray, fmt: str, n: int, block: int = 0):
    raw = torch.frombuffer(bytearray(values), dtype=torch.uint8) if values else \
        torch.zeros(0, dtype=torch.uint8)                                  # (n * bytes,)
    if fmt in FP8_FORMATS:
        return fp8_dequantize(raw, torch.from_numpy(np.array(scales, np.float32)), fmt, block)
    return raw.view(HALF_DTYPES[fmt]).float()[:n]                          # (n,)


# --------------------------------------------------------------------------- top-k selection

def topk_exact(x: torch.Tensor, k: int, generator=None) -> torch.Tensor:
    """Positions (k,) of the k largest |x|, sorted ascending."""
    return torch.topk(x.abs(), k, sorted=False).indices.sort().values     # (k,)


def topk_sampled(x: torch.Tensor, k: int, generator=None, sample: float = 0.01) -> torch.Tensor:
    """DGC sec. 3.1: the threshold is the top-d magnitude of a random sample of |x|; entries
    above it are kept; if that is more than k, an exact top-k among them (hierarchical).
    May keep fewer than k: error feedback sends the rest later."""
    n = x.numel()
    s = min(n, max(1000, int(sample * n)))
    probe = x.abs() if s >= n else x.abs()[torch.randint(n, (s,), generator=generator)]  # (s,)
    thr = torch.topk(probe, max(1, math.ceil(k * s / n))).values[-1]
    chosen = (x.abs() >= thr).nonzero().flatten()                          # (>=1,)
    if len(chosen) > k:
        chosen = chosen[torch.topk(x.abs()[chosen], k, sorted=False).indices]
    return chosen.sort().values


TOPK = {"exact": topk_exact, "sampled": topk_sampled}
TOPK_FORMATS = ("fp32", "e4m3", "e5m2")


def sparsify(grad, residual, momentum_buf, k: int, select="exact", momentum: float = 0.0,
             generator=None):
    """One error-feedback step on a flat tensor. -> (indices (k',), values (k',), residual, momentum).

    acc = residual + g (or, with DGC momentum correction, u = m u + g; acc = residual + u);
    the top-k of acc is sent, the rest stays in the residual; momentum is masked where sent.
    Pass ``residual=None`` to run without error feedback (the unsent part is dropped).
    """
    g = grad.reshape(-1).float()                                           # (n,)
    if momentum:
        momentum_buf = momentum * momentum_buf + g                         # (n,) DGC sec. 3.2
        g = momentum_buf
    acc = g if residual is None else residual + g                          # (n,)
    if not torch.isfinite(acc).all():      # a NaN passes no sampled threshold: it would stay in
        bad = ~torch.isfinite(acc)         # the residual unsent, and a NaN threshold sends nothing
        raise ValueError(f"top-k met {int(bad.sum())} non-finite values (residual included), "
                         f"the first at position {int(bad.nonzero()[0])}")
    idx = TOPK[select](acc, k, generator)                                  # (k',)
    values = acc[idx]                                                      # (k',)
    new_residual = acc.clone()
    new_residual[idx] = 0.0
    if momentum:
        momentum_buf = momentum_buf.clone()
        momentum_buf[idx] = 0.0                                            # DGC sec. 3.3 masking
    return idx, values, (None if residual is None else new_residual), momentum_buf


def topk_decode(indices, values: bytes, n: int, fmt: str = "fp32",
                scales: np.ndarray | None = None) -> torch.Tensor:
    """Positions (k,) (numpy or torch int64) and their k values (fp32, or fp8 codes with one
    scale) -> the dense float32 tensor (n,)."""
    out = torch.zeros(n)                                                   # (n,)
    if len(indices):
        idx = torch.as_tensor(indices)
        if fmt in FP8_FORMATS:
            codes = torch.from_numpy(np.frombuffer(values, np.uint8).copy())
            vals = fp8_dequantize(codes, torch.from_numpy(np.array(scales, np.float32)), fmt)
        else:
            vals = torch.from_numpy(np.frombuffer(values, "<f4").copy())  # (k,)
        out.index_copy_(0, idx, vals)
    return out


# --------------------------------------------------------------------------- protocol config

@dataclass
class CompressionConfig:
    dense_fraction: float = 0.2
    """Fraction of all gradient elements sent dense; the most important tensors are taken
    first, whole, while a tensor's midpoint stays within this budget. 0 = all top-k."""
    dense_format: str = "e4m3"
    """Value format of dense tensors: fp32 (lossless) | fp16 | bf16 | e4m3 | e5m2."""
    dense_small: int = 0
    """Tensors of at most this many elements are sent dense (in ``dense_format``) whatever
    their importance, outside the ``dense_fraction`` budget (biases, norm gains). 0 = none."""
    fp8_block: int = 0
    """FP8 elements per scale; 0 = one scale per tensor."""
    density: float = 0.05
    """Top-K density d in (0, 1]: fraction of a tensor's entries sent each step."""
    topk: str = "exact"
    """Selection: exact (torch.topk) | sampled (DGC's sampled threshold)."""
    index_codec: str = "huffman"
    """Index codec for top-k positions, a key of codecs.CODECS."""
    topk_format: str = "fp32"
    """Value format of the k top-k values: fp32 | e4m3 | e5m2 (fp8: one scale per tensor;
    the rounding error stays in the residual)."""
    fast: bool = False
    """Encode and decode through fastpath.py (torch ops, in-place residual): the same indices,
    values and bytes as the readable path; needs an index codec of fastpath.FAST_CODECS and
    momentum 0."""
    error_feedback: bool = True
    """Keep what top-k did not send in a per-tensor residual and add it to the next step."""
    momentum: float = 0.0
    """DGC momentum correction factor m (0 = off); the receiver must then use plain SGD."""
    warmup_steps: int = 0
    """DGC density warm-up: steps over which density falls exponentially to ``density``."""
    warmup_density: float = 0.25
    """Density at step 0 of the warm-up."""
    adam_beta1: float = 0.9
    """AdamW beta1 the receiver should use with this config (the exchanges read it): 0 turns
    Adam's momentum off, for sparse error feedback whose residual already delays and sums."""

    def __post_init__(self):
        if not 0.0 <= self.dense_fraction <= 1.0:
            raise ValueError(f"dense_fraction must be in [0, 1], got {self.dense_fraction}")
        for field in ("density", "warmup_density"):
            if not 0.0 < getattr(self, field) <= 1.0:
                raise ValueError(f"{field} must be in (0, 1], got {getattr(self, field)}")
        lookup(wire.FORMATS, self.dense_format, "dense_format")
        lookup(TOPK, self.topk, "topk")
        codecs.get_codec(self.index_codec)
        lookup(TOPK_FORMATS, self.topk_format, "topk_format")
        if self.fast:
            fastpath.get_fast_codec(self.index_codec)
            if self.momentum:
                raise ValueError(f"the fast path has no DGC momentum correction; got momentum="
                                 f"{self.momentum} with fast=True")
        if not 0.0 <= self.adam_beta1 < 1.0:
            raise ValueError(f"adam_beta1 must be in [0, 1), got {self.adam_beta1}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.momentum and not self.error_feedback:
            raise ValueError("momentum correction needs error_feedback=True (DGC accumulates)")
        if self.fp8_block < 0 or self.warmup_steps < 0 or self.dense_small < 0:
            raise ValueError(f"fp8_block {self.fp8_block}, warmup_steps {self.warmup_steps} and "
                             f"dense_small {self.dense_small} must be >= 0")


PRESETS = {
    "fp8_topk5": CompressionConfig(),
    "fp32": CompressionConfig(dense_fraction=1.0, dense_format="fp32"),
    "fp16": CompressionConfig(dense_fraction=1.0, dense_format="fp16"),
    "aggressive": CompressionConfig(dense_fraction=0.0, dense_small=1024, density=0.003,
                                    topk="sampled", index_codec="ans", warmup_steps=0,
                                    adam_beta1=0.0),
    # DGC as published (Lin et al. 2018): 0.1%, momentum correction 0.9, density warm-up,
    # every tensor top-k; written for a plain-SGD receiver, fed to AdamW here (see above)
    "dgc": CompressionConfig(dense_fraction=0.0, density=0.001, topk="sampled",
                             index_codec="ans", momentum=0.9, warmup_steps=100),
    # fp8_topk5 through the fast path: the same training, Rice-coded indices
    "fp8_topk5_fast": CompressionConfig(index_codec="rice", fast=True),
    # built for speed (issue 27): DGC's sampled threshold, fp8 top-k values, Rice, fast path
    "fast_topk5": CompressionConfig(topk="sampled", topk_format="e4m3", index_codec="rice",
                                    fast=True),
}


def get_config(cfg: CompressionConfig | str) -> CompressionConfig:
    """A preset name or a config -> the config; unknown names raise, listing the presets."""
    if isinstance(cfg, CompressionConfig):
        return cfg
    return lookup(PRESETS, cfg, "compression preset")


def density_at(step: int, cfg: CompressionConfig) -> float:
    """DGC warm-up: warmup_density * (density / warmup_density) ** (step / warmup_steps)."""
    if step >= cfg.warmup_steps:
        return cfg.density
    return cfg.warmup_density * (cfg.density / cfg.warmup_density) ** (step / cfg.warmup_steps)


def plan(named_grads: dict, importance: dict | None, dense_fraction: float,
         dense_small: int = 0) -> dict[str, str]:
    """-> {name: "dense" | "topk"}. Default importance: each gradient's RMS. Tensors of at most
    ``dense_small`` elements are dense and left out of the budget."""
    if importance is None and dense_fraction == 0:                         # no budget: no ranking
        return {n: "dense" if g.numel() <= dense_small else "topk" for n, g in named_grads.items()}
    if importance is None:
        importance = {n: float(torch.linalg.vector_norm(g.float())) / max(g.numel(), 1) ** 0.5
                      for n, g in named_grads.items()}                     # RMS
    missing = set(named_grads) - set(importance)
    if missing:
        raise ValueError(f"no importance for tensors {sorted(missing)}")
    small = {n for n, g in named_grads.items() if g.numel() <= dense_small}
    total = sum(g.numel() for n, g in named_grads.items() if n not in small)
    kinds, used, open_ = {n: "dense" for n in small}, 0, True
    for name in sorted(set(named_grads) - small, key=lambda n: (-importance[n], n)):
        numel = named_grads[name].numel()
        open_ = open_ and used + numel / 2 <= dense_fraction * total and dense_fraction > 0
        kinds[name] = "dense" if open_ else "topk"
        used += numel if open_ else 0
    return kinds


# --------------------------------------------------------------------------- the compressor

class Compressor:
    """Stateful encoder (residuals and momentum per tensor name) and stateless decoder.

    ``stats`` counts what was produced: ``comm/bytes`` (encoded), ``comm/raw_bytes`` (the fp32
    size of the same gradients), ``comm/messages``.
    """

    def __init__(self, cfg: CompressionConfig | str = "fp8_topk5", seed: int = 0):
        self.cfg = get_config(cfg)
        self.residual: dict[str, torch.Tensor] = {}
        self.momentum: dict[str, torch.Tensor] = {}
        self.step = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.absbuf = torch.empty(0)                                       # fast path: |acc| scratch
        self.stats = {"comm/bytes": 0, "comm/raw_bytes": 0, "comm/messages": 0}

    def encode(self, named_grads: dict[str, torch.Tensor], importance: dict | None = None) -> bytes:
        """All of ``named_grads`` in one message; one step of residuals and density warm-up."""
        return self.encode_split(named_grads, [list(named_grads)], importance)[0]

    def encode_split(self, named_grads: dict[str, torch.Tensor], groups: list[list[str]],
                     importance: dict | None = None) -> list[bytes]:
        """One message per group of names (the sharder: one per owner), as one step: the
        dense/top-k plan and the density are computed over all ``named_grads`` together, and
        tensors are encoded in ``named_grads`` order, so the sampled top-k draws, residuals
        and step counter do not depend on how the names are grouped. An empty group gives
        b"" (nothing to send)."""
        cfg = self.cfg
        where = {}
        for gi, names in enumerate(groups):
            for name in names:
                if name not in named_grads or name in where:
                    raise ValueError(f"group {gi} names {name!r}, which is "
                                     f"{'in another group too' if name in where else 'not a gradient'}")
                where[name] = gi
        if len(where) != len(named_grads):
            raise ValueError(f"tensors in no group: {sorted(set(named_grads) - set(where))}")
        kinds = plan(named_grads, importance, cfg.dense_fraction, cfg.dense_small)
        density = density_at(self.step, cfg)
        records = [[] for _ in groups]
        for name, g in named_grads.items():
            records[where[name]].append(self._record(name, g, kinds[name], density))
        payloads = [wire.pack(r, self.step) if r else b"" for r in records]
        self.step += 1
        self.stats["comm/bytes"] += sum(len(m) for m in payloads)
        self.stats["comm/raw_bytes"] += 4 * sum(g.numel() for g in named_grads.values())
        self.stats["comm/messages"] += sum(1 for m in payloads if m)
        return payloads

    def _record(self, name: str, g: torch.Tensor, kind: str, density: float) -> TensorRecord:
        cfg = self.cfg
        shape, n = tuple(g.shape), g.numel()
        if kind == "dense" or n == 0:
            try:
                values, scales = dense_encode(g, cfg.dense_format, cfg.fp8_block)
            except ValueError as e:
                raise ValueError(f"gradient {name!r}: {e}") from None
            return TensorRecord(name, "dense", cfg.dense_format, None, shape, cfg.fp8_block,
                                scales, n, values, b"")
        k = min(n, max(1, round(density * n)))
        fused = self._fused_topk(name, g, k) if cfg.fast else None
        if fused is not None:                                              # one call, same bytes
            codes, scales, index = fused                                   # (k',), (1,), bytes
            return TensorRecord(name, "topk", cfg.topk_format, cfg.index_codec, shape, 0,
                                scales, len(codes), codes.tobytes(), index)
        idx, vals = self._sparsify(name, g, k)
        index = (fastpath.encode_indices(cfg.index_codec, idx, n) if cfg.fast
                 else codecs.get_codec(cfg.index_codec).encode(idx.numpy(), n))
        scales = np.zeros(0, np.float32)
        if cfg.topk_format in FP8_FORMATS:
            fused = fastpath.fp8_sent_(vals, idx, self.residual[name] if cfg.error_feedback
                                       else None, cfg.topk_format) if cfg.fast else None
            if fused is not None:                                          # one pass, same bytes
                codes, sc = fused                                          # (k',), (1,)
            else:
                codes, sc = fp8_quantize(vals, cfg.topk_format)            # (k',), (1,)
                if cfg.error_feedback:                                     # keep the rounding error
                    self.residual[name][idx] = vals - fp8_dequantize(codes, sc, cfg.topk_format)
            values, scales = codes.numpy().tobytes(), sc.numpy()
        else:
            values = vals.numpy().astype("<f4").tobytes()
        return TensorRecord(name, "topk", cfg.topk_format, cfg.index_codec, shape, 0,
                            scales, len(idx), values, index)

    def _flat_residual(self, name: str, g: torch.Tensor):
        """-> (the gradient flat (n,) float32, its residual (n,) or None without feedback)."""
        flat = g.detach().reshape(-1).float()                              # (n,)
        res = self.residual.get(name) if self.cfg.error_feedback else None
        if self.cfg.error_feedback and (res is None or res.shape != flat.shape):
            res = torch.zeros_like(flat)
        return flat, res

    def _scratch(self, n: int) -> torch.Tensor:
        if self.absbuf.numel() < n:                                        # the largest so far
            self.absbuf = torch.empty(n)
        return self.absbuf[:n]

    def _fused_topk(self, name: str, g: torch.Tensor, k: int):
        """The whole top-k record through one of ``fastpath.FUSED_TOPK`` where the settings have
        one and its kernels apply: -> (codes, scales, index bytes), else None."""
        cfg = self.cfg
        encode = fastpath.FUSED_TOPK.get((cfg.topk, cfg.topk_format, cfg.index_codec))
        if encode is None or cfg.momentum:
            return None
        flat, res = self._flat_residual(name, g)
        try:
            out = encode(flat, res, k, self.generator, self._scratch(flat.numel()))
        except ValueError as e:
            raise ValueError(f"gradient {name!r}: {e}") from None
        if out is not None and res is not None:
            self.residual[name] = res
        return out

    def _sparsify(self, name: str, g: torch.Tensor, k: int):
        flat, res = self._flat_residual(name, g)
        if self.cfg.fast:                                                  # in place, same values
            try:
                idx, vals, res = fastpath.sparsify_(flat, res, k, self.cfg.topk, self.generator,
                                                    self._scratch(flat.numel()))
            except ValueError as e:
                raise ValueError(f"gradient {name!r}: {e}") from None
            if res is not None:
                self.residual[name] = res
            return idx, vals
        mom = self.momentum.get(name)
        if self.cfg.momentum and (mom is None or mom.shape != flat.shape):
            mom = torch.zeros_like(flat)
        try:
            idx, vals, res, mom = sparsify(flat, res, mom, k, self.cfg.topk, self.cfg.momentum,
                                           self.generator)
        except ValueError as e:
            raise ValueError(f"gradient {name!r}: {e}") from None
        if res is not None:
            self.residual[name] = res
        if self.cfg.momentum:
            self.momentum[name] = mom
        return idx, vals

    @property
    def ratio(self) -> float:
        """fp32 bytes / bytes produced, over every message so far."""
        return self.stats["comm/raw_bytes"] / max(self.stats["comm/bytes"], 1)


def decode_message(payload, fast: bool = False) -> dict[str, torch.Tensor]:
    """bytes -> {name: float32 tensor}; raises WireError on anything invalid. ``fast``: decode
    with fastpath.DENSE_DECODERS (indices and values to the dense tensor in one pass) or
    fastpath.FAST_CODECS where the codec has one (the same positions, the same tensor)."""
    _, records = wire.unpack(payload)
    out = {}
    for r in records:
        n = r.numel
        if r.kind == "dense":
            flat = dense_decode(r.values, r.scales, r.format, n, r.block)  # (n,)
        else:
            try:
                dense = fastpath.DENSE_DECODERS.get(r.codec) if fast else None
                flat = None if dense is None else \
                    dense(r.index, n, r.k, r.format, r.values, r.scales)       # (n,) or None
                if flat is not None:                                       # one pass, same tensor
                    out[r.name] = flat if len(r.shape) == 1 else flat.reshape(r.shape)
                    continue
                idx = (fastpath.decode_indices(r.codec, r.index, n, r.k) if fast   # (k,) tensor
                       else torch.from_numpy(codecs.get_codec(r.codec).decode(r.index, n)))
            except codecs.CodecError as e:
                raise WireError(f"tensor {r.name!r}: {e}") from e
            if len(idx) != r.k:
                raise WireError(f"tensor {r.name!r}: index payload holds {len(idx)} positions, "
                                f"record says k={r.k}")
            flat = fastpath.scatter(idx, r.values, n, r.format, r.scales) if fast else None
            if flat is None:
                flat = topk_decode(idx, r.values, n, r.format, r.scales)    # (n,)
        out[r.name] = flat.reshape(r.shape)
    return out


# --------------------------------------------------------------------------- one tensor, traced

def trace_step(x: torch.Tensor, residual: torch.Tensor | None = None, density: float = 0.05,
               fmt: str = "e4m3", codec: str = "huffman", block: int = 0) -> dict:
    """One tensor through every stage, for explorers and notebooks; pure (returns the residual).

    -> dict with x, fp8 (dequantized), fp8_error, flushed, mask, sent, residual (all shaped
    like x), gaps, code_lengths (bits per index), and measured bytes: fp8_bytes, topk_bytes
    (wire messages holding this one tensor), index_bytes, raw_bytes (fp32), bits_per_index
    beside the bound n*H(k/n)/k.
    """
    CompressionConfig(density=density, dense_format=fmt, index_codec=codec, fp8_block=block)
    shape, flat = tuple(x.shape), x.detach().reshape(-1).float()          # (n,)
    n = flat.numel()
    codes, scales = fp8_quantize(flat, fmt, block)                         # (n,), (nb,)
    x_fp8 = fp8_dequantize(codes, scales, fmt, block)                      # (n,)
    k = min(n, max(1, round(density * n)))
    res = torch.zeros(n) if residual is None else residual.reshape(-1).float()
    idx, vals, new_res, _ = sparsify(flat, res, None, k)                   # (k,), (k,), (n,)
    ind = idx.numpy()
    index = codecs.get_codec(codec).encode(ind, n)
    fp8_msg = wire.pack([TensorRecord("x", "dense", fmt, None, shape, block, scales.numpy(), n,
                                      codes.numpy().tobytes(), b"")])
    topk_msg = wire.pack([TensorRecord("x", "topk", "fp32", codec, shape, 0, np.zeros(0, np.float32),
                                       k, vals.numpy().astype("<f4").tobytes(), index)])
    sent, mask = torch.zeros(n), torch.zeros(n, dtype=torch.bool)          # (n,), (n,)
    sent[idx], mask[idx] = vals, True
    return dict(x=flat.reshape(shape), fp8=x_fp8.reshape(shape),
                fp8_error=(x_fp8 - flat).reshape(shape), flushed=fp8_flushed(flat, x_fp8),
                mask=mask.reshape(shape),
                sent=sent.reshape(shape), residual=new_res.reshape(shape),
                gaps=codecs.gaps_of(ind), code_lengths=codecs.get_codec(codec).code_lengths(ind, n),
                k=k, n=n, index_bytes=len(index), fp8_bytes=len(fp8_msg), topk_bytes=len(topk_msg),
                raw_bytes=4 * n, bits_per_index=8 * len(index) / k,
                bound=codecs.entropy_bound_bits(k, n))
