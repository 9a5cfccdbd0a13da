"""The compression protocol's fast path: the reference algorithm in whole-tensor torch ops.

The reference path (``compression.sparsify``, ``codecs.rice_encode``) is written to be read: a
fresh tensor per stage and numpy bit arrays, one byte per bit. It is exact and slow: 5% of a
4 MB gradient took 30 ms to encode and 18 ms to decode, 0.008x of a memory copy of the same
4 MB, so on any datacentre link compressing took longer than sending (issue 27). This module
computes the *same* outputs with a pass budget in mind. Speed arithmetic, one core, the 4 MB
fp32 gradient of the bench (n = 1e6, k = 5e4):

    a memory copy of 4 MB                 ~0.15 ms  (26 GB/s; the ceiling every row is read against)
    one elementwise pass over the 4 MB    ~0.1  ms  (add_, abs, a float compare)
    a pass over the k kept entries        ~0.03 ms  (gather, scatter, fp8 cast of 5e4 values)
    one torch op on a CPU, any size       ~0.01-0.02 ms of overhead
    => 1/10 of memcpy leaves ~1.5 ms for select + quantise + encode + decode: about ten passes
       over the gradient and a few dozen ops, so every full-size temporary and every second
       pass must go. What this module reaches, stage by stage: bench/RESULTS_compression.md.

What changes against the reference, and what stays bit for bit:

  * Error feedback in place: the residual buffer *is* the accumulator (``residual += g``), the
    sent entries are zeroed in it; the reference builds ``acc = residual + g`` and a clone.
    Same float additions, same residual.
  * Selection: exact top-k is the reference's ``torch.topk`` (no faster exact selection exists;
    it costs ~30 ms on 1e6 entries, the one slow stage left). DGC's sampled threshold (Lin et al.
    2018, sec. 3.1; ``compression.topk_sampled``) takes |acc| once instead of three times and finds
    the positions above the threshold with ``positions_at_least``. Same draws, same positions.
    A NaN or infinity raises (one max over |acc|): a threshold never selects NaN, which would
    otherwise stay in the residual unsent.
  * Rice (``codecs.rice_encode``: k r-bit remainders, then k unary codes): the same bytes. The
    remainders are cut into bytes 8 values at a time (8 r-bit values are r whole bytes, one
    int64 each), the unary terminators set in one scatter, and the bits packed once; the
    decoder finds the terminators with one compaction and reads the remainders the same way.
    ``raw_int32`` is a cast.
  * Device dependence: five primitives (``positions``, ``positions_at_least``, ``pack_bits``,
    ``unpack_bits``, ``set_ones``) run torch on a GPU and numpy on the same memory on a CPU,
    where torch's kernels are the slow part: its bool compare and nonzero run at 0.6 and 1.5 ns
    per element against numpy's 0.07 and 0.8, and its bit packing 30x slower than np.packbits.
    Everything else is the same torch code on both (tests run the torch branches on a CPU).
  * Fused CPU kernels (``kernels.py``, numba; ``KERNELS_ON_CPU``): on a CPU tensor the sampled
    selection with error feedback is two kernel calls (the probe, whose d-th largest numpy's
    partition takes: 11 us where numba's took 31; then a marking pass at about one memory copy
    and the positions), and for ``fast_topk5`` the whole record is one more
    (``sampled_e4m3_rice_``, registered in ``FUSED_TOPK``: the e4m3 codes, their rounding error
    into the residual and the Rice bytes); the decode is one kernel from the Rice bytes to the
    dense tensor (``rice_dense``, ``DENSE_DECODERS``). Rice encode and decode alone, the fp8
    values with their rounding error (``fp8_sent_``) and the decode scatter (``scatter``) have
    kernels too. All of them write the same outputs bit for bit; the torch ops above stay for
    GPU tensors and when numba is not importable; the tests run both on every equality check.

Values after fp8 (``CompressionConfig.topk_format``) are quantised by ``compression.fp8_quantize``
on both paths; the residual keeps the quantisation error of the sent values (error feedback
over the whole compressor, Karimireddy et al. 2019: e = acc - C(acc)). Deviation: the fast path
does not implement DGC momentum correction (``CompressionConfig`` refuses the combination).
"""
from __future__ import annotations

import functools
import math
import struct
from typing import Callable, NamedTuple

import numpy as np
import torch

from grpo_lab.distributed import codecs, kernels
from grpo_lab.distributed.codecs import CodecError
from grpo_lab.registry import lookup


NUMPY_ON_CPU = True
"""Run the five device-dependent primitives through numpy for CPU tensors (False: torch
everywhere, as on a GPU; the tests use it to check the GPU branches on a CPU)."""


KERNELS_ON_CPU = kernels.AVAILABLE
"""Run the fused numba kernels of ``kernels.py`` for CPU tensors where a stage has one (False,
or numba not importable: the torch ops below, as on a GPU; the tests run both)."""


def _numpy(t: torch.Tensor) -> bool:
    return NUMPY_ON_CPU and t.device.type == "cpu"


def _kernel(t: torch.Tensor) -> bool:
    return KERNELS_ON_CPU and t.device.type == "cpu"


# --------------------------------------------------------------------------- selection

def positions(mask: torch.Tensor) -> torch.Tensor:
    """Sorted positions (m,) int64 of the True entries of a 1-D bool ``mask``."""
    if _numpy(mask):                                         # numpy: 2x faster
        return torch.from_numpy(np.flatnonzero(mask.numpy()))            # (m,)
    return mask.nonzero().flatten()                                       # (m,)


def positions_at_least(a: torch.Tensor, thr: torch.Tensor) -> torch.Tensor:
    """Sorted positions (m,) int64 where the 1-D ``a`` >= ``thr`` (a 0-d tensor)."""
    if _numpy(a):                                            # numpy: 10x faster compare
        return torch.from_numpy(np.flatnonzero(a.numpy() >= thr.item()))  # (m,)
    return (a >= thr).nonzero().flatten()                                 # (m,)


def select_exact(a: torch.Tensor, k: int, generator=None) -> torch.Tensor:
    """The reference ``compression.topk_exact`` on a = |acc| (n,): positions (k,), sorted."""
    return torch.topk(a, k, sorted=False).indices.sort().values           # (k,)


def select_sampled(a: torch.Tensor, k: int, generator=None, sample: float = 0.01) -> torch.Tensor:
    """The reference ``compression.topk_sampled`` (DGC sec. 3.1) on a = |acc| (n,): the threshold
    is the top-d magnitude of a random sample of a; positions at or above it are kept, and if
    more than k, the exact top-k among them. The same draws and positions as the reference."""
    n = a.numel()
    s = min(n, max(1000, int(sample * n)))
    probe = a if s >= n else a[torch.randint(n, (s,), generator=generator)]  # (s,)
    thr = torch.topk(probe, max(1, math.ceil(k * s / n))).values[-1]      # 0-d
    chosen = positions_at_least(a, thr)                                   # (>=1,) sorted
    if len(chosen) > k:                                                   # keep the top k of them,
        keep = torch.zeros(len(chosen), dtype=torch.bool, device=a.device)  # in position order:
        keep[torch.topk(a[chosen], k, sorted=False).indices] = True        # a mask, not a sort
        chosen = chosen[keep]                                             # (k,) sorted
    return chosen


SELECT = {"exact": select_exact, "sampled": select_sampled}
"""Fast selections by the name ``CompressionConfig.topk`` uses for the reference's."""


def sparsify_(grad: torch.Tensor, residual: torch.Tensor | None, k: int, select: str = "exact",
              generator=None, absbuf: torch.Tensor | None = None):
    """``compression.sparsify`` without momentum, in place: ``residual`` becomes the new residual.
    -> (indices (k',) int64, values (k',) float32, residual). Raises ValueError on a NaN or
    infinity in grad + residual (a threshold never selects NaN: it would stay unsent forever)."""
    g = grad.reshape(-1)                                                  # (n,) float32
    n = g.numel()
    if not 1 <= k <= n:
        raise ValueError(f"top-k needs 1 <= k <= n; got k={k} for a tensor of {n} elements")
    lookup(SELECT, select, "selection")
    if select == "sampled" and _sampled_applies(g, residual):
        return _sampled_fused(g, residual, k, generator, absbuf)
    acc = g if residual is None else residual.add_(g)                     # (n,) the accumulator
    a = torch.abs(acc, out=absbuf) if absbuf is not None else acc.abs()   # (n,) |acc|
    if not torch.isfinite(a.max()):                                       # one reduction pass
        bad = int((~torch.isfinite(acc)).sum())
        raise ValueError(f"top-k met {bad} non-finite values (residual included), the first at "
                         f"position {int((~torch.isfinite(acc)).nonzero()[0])}")
    idx = SELECT[select](a, k, generator)                                 # (k',)
    values = acc.index_select(0, idx)                                     # (k',)
    if residual is not None:
        residual.index_fill_(0, idx, 0.0)                                 # what was sent leaves it
    return idx, values, residual


def _sampled_applies(g: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Whether the kernels can run the sampled selection on this flat tensor and residual."""
    return (_kernel(g) and g.dtype == torch.float32 and g.numel() > 1000 and g.is_contiguous()
            and not g.requires_grad
            and (residual is None or (residual.dtype == torch.float32 and residual.is_contiguous()
                                      and residual.shape == g.shape)))


def _sampled_mark(g: torch.Tensor, residual: torch.Tensor | None, k: int, generator=None,
                  absbuf: torch.Tensor | None = None, sample: float = 0.01):
    """The first half of the sampled selection on the kernels: the probe is drawn as the
    reference draws it (``torch.randint`` with the same generator) and read as |residual + g|
    at the drawn positions (the same float32 sums, ``kernels.probe_values``); its d-th largest
    (numpy's ``np.partition``) is the threshold (``torch.topk(probe, d).values[-1]``'s value);
    then one pass adds (residual = acc in place),
    compares and marks one bit per passing element, and the marks become positions
    (``kernels.sampled_marks``). -> (acc (n,) numpy: the residual or g, m passing, their
    positions (m + 4,) (the first m valid), the largest |acc| (float32)). Raises the torch
    path's ValueError on a NaN or infinity (the residual is then residual + g everywhere, as
    there). ``absbuf`` (n,) float32, if given, holds the bit words (n / 8 bytes of its 4 n)."""
    n = g.numel()
    s = min(n, max(1000, int(sample * n)))
    draw = torch.randint(n, (s,), generator=generator).numpy()            # (s,)
    gn = g.numpy()                                                        # (n,)
    acc = gn if residual is None else residual.numpy()                    # (n,)
    nw = -(-n // 64)
    words = (absbuf.numpy()[:2 * nw].view(np.uint64) if absbuf is not None
             and absbuf.numel() >= 2 * nw and absbuf.is_contiguous()
             and absbuf.dtype == torch.float32 else np.empty(nw, np.uint64))  # (nw,) scratch
    probe = kernels.probe_values(gn, acc, residual is not None, draw)      # (s,)
    d = max(1, math.ceil(k * s / n))
    thr = np.partition(probe, s - d)[s - d]                               # the d-th largest
    m, amax, idx = kernels.sampled_marks(gn, acc, residual is not None, thr, words)
    if amax > kernels.FINITE_BITS:
        bad = ~torch.isfinite(torch.from_numpy(acc))                      # (n,)
        raise ValueError(f"top-k met {int(bad.sum())} non-finite values (residual included), "
                         f"the first at position {int(bad.nonzero()[0])}")
    return acc, m, idx, np.array(amax, np.uint32).view(np.float32)[()]


def _sampled_fused(g: torch.Tensor, residual: torch.Tensor | None, k: int, generator=None,
                   absbuf: torch.Tensor | None = None):
    """``sparsify_`` with ``select_sampled`` through the kernels (``_sampled_mark``, then the
    marked positions' values, zeroed in the residual). Needs ``_sampled_applies``."""
    acc, m, idx, _ = _sampled_mark(g, residual, k, generator, absbuf)
    val = np.empty(m, np.float32)                                         # (m,)
    kernels.gather_sent(idx, acc, acc, residual is not None, val)
    return _top_k_of_passers(torch.from_numpy(idx[:m]), torch.from_numpy(val), residual, k)


def _top_k_of_passers(chosen: torch.Tensor, values: torch.Tensor, residual, k: int):
    """More than k passed the threshold: keep the exact top k of them, in position order (the
    reference's ``torch.topk`` among them); the dropped go back to the residual."""
    if len(chosen) > k:
        keep = torch.zeros(len(chosen), dtype=torch.bool)                 # (m,)
        keep[torch.topk(values.abs(), k, sorted=False).indices] = True
        if residual is not None:                                          # the dropped stay
            residual.index_copy_(0, chosen[~keep], values[~keep])
        chosen, values = chosen[keep], values[keep]                       # (k,), (k,)
    return chosen, values, residual


def sampled_e4m3_rice_(g: torch.Tensor, residual: torch.Tensor | None, k: int, generator=None,
                       absbuf: torch.Tensor | None = None):
    """The ``fast_topk5`` record in one go: ``sparsify_`` (sampled), ``fp8_sent_`` (e4m3) and
    ``rice_encode`` of the sent positions, the same bytes, values and residual. The sent
    values' amax is the largest |acc| (the largest always passes and is sent), which the
    marking pass found, so the scale is known before any value is visited and one kernel
    (``kernels.sent_e4m3_rice``) quantises, updates the residual and writes the Rice bytes.
    When more than k pass, the reference keeps ``torch.topk``'s k among them: when exactly k
    reach the k-th largest |acc| that set is the only top k, and it is kept by that floor;
    with a tie across the k-th, the stages run one by one with ``torch.topk`` (whose choice
    among equal values is its own). -> (codes (k',) uint8, scale (1,) float32, Rice bytes) as
    numpy / bytes, or None when the kernels do not apply (the caller runs the stages)."""
    if not _sampled_applies(g, residual):
        return None
    feedback = residual is not None
    acc, m, idx, amax = _sampled_mark(g, residual, k, generator, absbuf)
    n = g.numel()
    floor = np.float32(0.0)
    if m > k:                                                             # the top k of them
        val = np.empty(m, np.float32)                                     # (m,)
        kernels.gather_sent(idx, acc, acc, False, val)
        a = np.abs(val)                                                   # (m,)
        floor = np.partition(a, m - k)[m - k]                             # the k-th largest
        if np.count_nonzero(a >= floor) != k:         # a tie across the k-th: torch.topk decides
            kernels.gather_sent(idx, acc, acc, feedback, val)             # zero them, as staged
            chosen, values, _ = _top_k_of_passers(torch.from_numpy(idx[:m]),
                                                  torch.from_numpy(val), residual, k)
            codes, scale = fp8_sent_(values, chosen, residual, "e4m3")    # finite: not None
            return codes.numpy(), scale.numpy(), rice_encode(chosen, n)
    scale = amax / np.float32(448.0) if amax > 0 else np.float32(1.0)     # compression.fp8_quantize
    codes, index = kernels.sent_e4m3_rice(idx, m, acc, acc, feedback, floor, scale, _e4m3_table(),
                                          n, codecs.rice_parameter(min(m, k), n))
    return codes, np.array([scale], np.float32), index.tobytes()


FUSED_TOPK = {("sampled", "e4m3", "rice"): sampled_e4m3_rice_}
"""Whole top-k records in one call, by (selection, value format, index codec): each takes
(flat gradient, residual or None, k, generator, scratch) and returns (codes, scales, index
bytes), or None where its kernels do not apply; the other combinations run stage by stage."""


def fp8_sent_(values: torch.Tensor, idx: torch.Tensor, residual: torch.Tensor | None, fmt: str):
    """``compression.fp8_quantize(values, fmt)`` (one scale) and, with a residual, residual[idx] =
    values - their dequantization, in one pass (``kernels.fp8_e4m3_sent``). -> (codes (k,)
    uint8, scale (1,) float32), or None where no kernel applies (not e4m3, not a CPU float32
    tensor, numba missing, a non-finite value): the caller runs the torch ops."""
    if (fmt != "e4m3" or not _kernel(values) or values.dtype != torch.float32
            or (residual is not None and (residual.dtype != torch.float32
                                          or not residual.is_contiguous()))):
        return None
    codes = np.empty(len(values), np.uint8)                              # (k,)
    feedback = residual is not None
    scale, nbad = kernels.fp8_e4m3_sent(values.numpy(), idx.numpy(),
                                        residual.numpy() if feedback else values.numpy(),
                                        _e4m3_table(), feedback, codes)
    if nbad:
        return None
    return torch.from_numpy(codes), torch.tensor([scale], dtype=torch.float32)


def scatter(indices, values: bytes, n: int, fmt: str, scales) -> torch.Tensor | None:
    """``compression.topk_decode`` in one pass (``kernels.scatter_fp8`` / ``scatter_f32``): the
    dense float32 tensor (n,) from k positions and their fp32 values or e4m3 codes with one
    scale. None where no kernel applies (numba missing or off, e5m2, mismatched lengths or an
    index out of range): the caller runs the torch ops, which raise their own errors."""
    if not KERNELS_ON_CPU or fmt not in ("e4m3", "fp32"):
        return None
    idx = np.ascontiguousarray(indices.numpy() if isinstance(indices, torch.Tensor) else indices,
                               dtype=np.int64)                            # (k,)
    fp8 = fmt == "e4m3"
    raw = np.frombuffer(values, np.uint8 if fp8 else "<f4")               # (k,) codes or values
    if len(raw) != len(idx) or (fp8 and len(scales) != 1):
        return None
    out = torch.zeros(n)                                                  # (n,)
    bad = (kernels.scatter_fp8(idx, raw, _e4m3_table(), np.float32(scales[0]), out.numpy())
           if fp8 else kernels.scatter_f32(idx, raw, out.numpy()))
    return out if bad < 0 else None


@functools.cache
def _e4m3_table() -> np.ndarray:
    """The 256 e4m3fn values as float32 (256,), torch's own decoding of every code."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()


# --------------------------------------------------------------------------- bit arrays

_BITS_MSB = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0], dtype=torch.uint8)
_BYTE_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.float32)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Bits (m,) uint8 0/1 -> bytes (ceil(m/8),) uint8, MSB first (``np.packbits``)."""
    if _numpy(bits):                                         # numpy: 30x faster
        return torch.from_numpy(np.packbits(bits.numpy()))
    pad = torch.nn.functional.pad(bits, (0, (-len(bits)) % 8)).view(-1, 8)  # (m/8, 8)
    return (pad.float() @ _BYTE_WEIGHTS.to(bits.device)).to(torch.uint8)  # (m/8,) exact < 256


def unpack_bits(body: torch.Tensor) -> torch.Tensor:
    """Bytes (B,) uint8 -> bits (8B,) uint8 0/1, MSB first (``np.unpackbits``)."""
    if _numpy(body):
        return torch.from_numpy(np.unpackbits(body.numpy()))
    return ((body[:, None] >> _BITS_MSB.to(body.device)) & 1).reshape(-1)  # (8B,)


def set_ones(bits: torch.Tensor, where: torch.Tensor) -> None:
    """bits[where] = 1 in place (numpy on a CPU tensor's memory: 3x faster than index_fill_)."""
    if _numpy(bits):
        bits.numpy()[where.numpy()] = 1
    else:
        bits.index_fill_(0, where, 1)


def uint_bits(values: torch.Tensor, r: int) -> torch.Tensor:
    """Non-negative ints (k,) < 2^r -> their r bits each, MSB first, row after row: (k*r,) uint8.
    For r <= 7, 8 values make r whole bytes: one int64 per 8 values, cut into bytes."""
    k = len(values)
    if r <= 7:
        v = torch.nn.functional.pad(values, (0, (-k) % 8)).view(-1, 8)     # (k/8, 8)
        word = (v << (r * torch.arange(7, -1, -1, device=v.device))).sum(1)  # (k/8,) 8r bits
        be = (word[:, None] >> (8 * torch.arange(r - 1, -1, -1, device=v.device))) & 255
        return unpack_bits(be.to(torch.uint8).reshape(-1))[:k * r]       # (k*r,)
    nbytes = -(-r // 8)
    be = ((values[:, None] >> (8 * torch.arange(nbytes - 1, -1, -1, device=values.device)))
          & 255).to(torch.uint8)                                          # (k, nbytes) big-endian
    return unpack_bits(be.reshape(-1)).view(k, 8 * nbytes)[:, 8 * nbytes - r:].reshape(-1)


def bytes_uint(body: torch.Tensor, k: int, r: int) -> torch.Tensor:
    """The inverse of ``uint_bits`` read straight from packed bytes: k r-bit fields at the start
    of ``body`` (uint8) -> ints (k,) int64."""
    if r <= 7:
        k8 = -(-k // 8)
        b = torch.nn.functional.pad(body[:k8 * r], (0, k8 * r - len(body[:k8 * r])))
        be = b.to(torch.int64).view(k8, r)                                # (k/8, r) bytes
        word = (be << (8 * torch.arange(r - 1, -1, -1, device=b.device))).sum(1)  # (k/8,) 8r bits
        v = (word[:, None] >> (r * torch.arange(7, -1, -1, device=b.device))) & ((1 << r) - 1)
        return v.reshape(-1)[:k]                                          # (k,)
    nbytes = -(-r // 8)
    rows = torch.nn.functional.pad(unpack_bits(body)[:k * r].view(k, r), (8 * nbytes - r, 0))
    be = pack_bits(rows.reshape(-1)).view(k, nbytes).to(torch.int64)      # (k, nbytes)
    shifts = 8 * torch.arange(nbytes - 1, -1, -1, device=be.device)
    return (be << shifts).sum(1)                                          # (k,)


# --------------------------------------------------------------------------- index codecs

def _check_args(idx: torch.Tensor, n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n < 2 ** 32:
        raise ValueError(f"n must be an int in [0, 2**32), got {n!r}")
    if not isinstance(idx, torch.Tensor) or idx.ndim != 1 or idx.dtype != torch.int64:
        raise ValueError(f"indices must be a 1-D int64 tensor, got "
                         f"{getattr(idx, 'dtype', type(idx))} of shape {tuple(getattr(idx, 'shape', ()))}")


def _check(idx: torch.Tensor, n: int) -> torch.Tensor:
    """-> step (k,) = gaps + 1; a cheap check, and on failure the reference's precise error."""
    _check_args(idx, n)
    step = torch.diff(idx, prepend=idx.new_full((1,), -1))                # (k,)
    if len(idx) and (bool((step <= 0).any()) or int(idx[-1]) >= n):
        codecs.check_indices(idx.cpu().numpy(), n)                        # raises, naming the index
    return step


def raw_encode(idx: torch.Tensor, n: int) -> bytes:
    _check(idx, n)
    if n > 2 ** 31:
        raise ValueError(f"raw_int32 holds positions below 2**31, got n={n}")
    return idx.to(torch.int32).cpu().numpy().astype("<i4").tobytes()


def raw_decode(payload, n: int, device=None) -> torch.Tensor:
    return torch.from_numpy(codecs.raw_decode(payload, n)).to(device or "cpu")


def rice_encode(idx: torch.Tensor, n: int) -> bytes:
    """``codecs.rice_encode``'s bytes: header (k u32, r u8), k r-bit remainders, k unary codes."""
    if _kernel(idx):
        _check_args(idx, n)
        out, bad = kernels.rice_encode(idx.numpy(), n, codecs.rice_parameter(len(idx), n))
        if bad >= 0:
            codecs.check_indices(idx.numpy(), n)                          # raises, naming the index
        return out.tobytes()
    step = _check(idx, n)                                                 # (k,) = gaps + 1
    k = len(idx)
    r = codecs.rice_parameter(k, n)
    g = step - 1                                                          # (k,) gaps
    ones = torch.cumsum((g >> r) + 1, 0) - 1                              # (k,) unary terminators
    bits = torch.zeros(k * r + (int(ones[-1]) + 1 if k else 0), dtype=torch.uint8,
                       device=idx.device)                                 # (k*r + sum(q) + k,)
    if r:
        bits[:k * r] = uint_bits(g & ((1 << r) - 1), r)                   # remainders, MSB first
    set_ones(bits, ones + k * r)                                          # a 1 ends each unary code
    return struct.pack("<IB", k, r) + pack_bits(bits).cpu().numpy().tobytes()


def rice_decode(payload, n: int, device=None) -> torch.Tensor:
    """The inverse, with the reference's checks (``codecs.rice_decode``): -> indices (k,) int64.
    The bits are read by the numba kernel on a CPU (``KERNELS_ON_CPU``), else by torch ops;
    the checks below are the same for both, in the same order."""
    k, r, body = codecs.rice_header(payload, n)
    on_cpu = torch.device(device or "cpu").type == "cpu"
    read = _rice_read_kernel if KERNELS_ON_CPU and on_cpu else _rice_read_torch
    count, last, qmax, idx = read(body, k, r, device or "cpu")
    if _rice_check(count, last, qmax, int(idx[-1]) if count == k and k else 0, k, r, n, body):
        return idx
    return torch.zeros(0, dtype=torch.int64, device=device or "cpu")


def _rice_check(count: int, last, qmax, top: int, k: int, r: int, n: int, body) -> bool:
    """The reference's checks after reading (terminators found, the last one's bit position,
    the largest unary part, the last index ``top``), in its order. -> k > 0."""
    if count != k:
        raise CodecError(f"found {count} unary terminators, header says k={k}")
    if k == 0:
        return False
    if 8 * len(body) - (last + 1) >= 8:
        raise CodecError("trailing bytes after the last Rice code")
    if qmax > (n >> r):
        raise CodecError(f"unary part {qmax} is too large for n={n}")
    if top >= n:
        raise CodecError(f"decoded index {top} is out of range for n={n}")
    return True


def rice_dense(payload, n: int, k: int, fmt: str, values: bytes, scales) -> torch.Tensor | None:
    """``rice_decode`` and ``scatter`` in one pass (``kernels.rice_scatter``): the dense float32
    tensor (n,) from a Rice index payload and its k values (fp32, or e4m3 codes with one
    scale), with every check of ``rice_decode``, in its order. None where the kernel does not
    apply (numba missing or off, another format, a header k other than ``k``, lengths that do
    not match): the caller decodes stage by stage, which raises its own errors."""
    if not KERNELS_ON_CPU or fmt not in ("e4m3", "fp32") or (fmt == "e4m3" and len(scales) != 1):
        return None
    hk, r, body = codecs.rice_header(payload, n)
    fp8 = fmt == "e4m3"
    raw = np.frombuffer(values, np.uint8 if fp8 else "<f4")               # (k,)
    if hk != k or len(raw) != k or k == 0:
        return None
    out = torch.empty(n)                                                  # (n,) the kernel zeroes
    count, last, qmax, top = kernels.rice_scatter(
        body, k, r, raw if fp8 else _NO_CODES, _e4m3_table(), np.float32(scales[0] if fp8 else 1.0),
        _NO_VALUES if fp8 else raw, fp8, out.numpy())
    _rice_check(count, last, qmax, top, k, r, n, body)
    return out


_NO_CODES, _NO_VALUES = np.zeros(0, np.uint8), np.zeros(0, np.float32)


DENSE_DECODERS = {"rice": rice_dense}
"""The dense tensor straight from an index codec's bytes and the values, by codec (one pass
each); the other codecs decode the indices, then scatter."""


def _rice_read_kernel(body: np.ndarray, k: int, r: int, device):
    """-> (unary terminators found, the last one's bit position, the largest unary part,
    indices (k,) int64) through ``kernels.rice_decode``; the caller checks them."""
    out = np.empty(k, np.int64)                                           # (k,)
    count, last, qmax = kernels.rice_decode(body, k, r, out)
    return count, last, qmax, torch.from_numpy(out)


def _rice_read_torch(body: np.ndarray, k: int, r: int, device):
    """The same as ``_rice_read_kernel`` in torch ops (on ``device``); the unary parts and the
    indices only when there are k terminators (the caller raises otherwise)."""
    body = torch.from_numpy(body.copy()).to(device)                       # (B,)
    bits = unpack_bits(body)                                              # (8B,)
    ones = positions(bits[k * r:].view(torch.bool)).to(body.device)       # (k,) terminators
    if len(ones) != k or k == 0:
        return len(ones), None, None, None
    q = torch.diff(ones, prepend=ones.new_full((1,), -1)) - 1             # (k,) unary parts
    low = bytes_uint(body, k, r) if r else 0                              # (k,)
    idx = torch.cumsum(((q << r) | low) + 1, 0) - 1                       # (k,)
    return len(ones), k * r + int(ones[-1]), int(q.max()), idx


class FastCodec(NamedTuple):
    encode: Callable        # (indices (k,) int64 tensor, n) -> bytes, the reference codec's bytes
    decode: Callable        # (payload, n, device=None) -> indices (k,) int64 tensor


FAST_CODECS = {"raw_int32": FastCodec(raw_encode, raw_decode),
               "rice": FastCodec(rice_encode, rice_decode)}
"""Fast codecs by the reference codec whose bytes they write (``codecs.CODECS``, wire ids)."""


FAST_MIN_K = 8192
"""Below this many indices the readable numpy codec is the faster writer of the same bytes
than the torch ops (a torch op costs 10-20 us whatever its size: Rice on 500 indices 0.2 ms
fast, 0.06 readable; on 50,000 0.7 fast, 1.0 readable; one core). The numba kernels are the
faster writer at every size (500 indices: 7.6 + 7.0 us encode + decode against the readable
62 + 59): with them every k takes the fast codec."""


def encode_indices(name: str, idx: torch.Tensor, n: int) -> bytes:
    """The bytes of codec ``name`` for sorted positions (k,), by the faster of the two writers."""
    if len(idx) < (0 if _kernel(idx) else FAST_MIN_K):
        return codecs.get_codec(name).encode(idx.cpu().numpy(), n)
    return get_fast_codec(name).encode(idx, n)


def decode_indices(name: str, payload, n: int, k: int) -> torch.Tensor:
    """Positions (k,) int64 from codec ``name``'s bytes, by the faster reader for ``k``."""
    if k < (0 if KERNELS_ON_CPU else FAST_MIN_K) or name not in FAST_CODECS:
        return torch.from_numpy(codecs.get_codec(name).decode(payload, n))
    return FAST_CODECS[name].decode(payload, n)


def get_fast_codec(name: str) -> FastCodec:
    return lookup(FAST_CODECS, name, "fast index codec",
                  "the other index codecs have no fast path")
