"""Fused CPU kernels for the fast path (``fastpath.py``): one compiled pass per stage, numba.

The fast path's torch ops are the same on a CPU and a GPU, but on a CPU every torch op costs
10-20 us whatever its size, a bool compare 0.6 ns and ``nonzero`` 1.5 ns per element, and a
stage that is one loop over the elements takes five to ten ops and passes. Here each stage is
one loop, compiled by numba (``@njit(cache=True)``: compiled once per machine, then loaded from
``__pycache__``), over the CPU tensor's memory (``tensor.numpy()``, no copy):

  * ``feedback_select``: error feedback + DGC's sampled-threshold compare + compaction of the
    positions and values + the residual update: one pass over the tensor and one over a byte
    mask (the torch path: add_, abs, max, compare, nonzero, index_select, index_fill_; seven
    passes and temporaries).
  * ``rice_encode`` / ``rice_decode``: ``codecs.rice_encode``'s bit layout (k r-bit remainders,
    MSB first, then k unary codes: q zeros and a 1) written and read with a 64-bit accumulator
    straight into / out of the byte buffer, no bit array.
  * ``fp8_e4m3_sent``: the per-tensor scale, the e4m3 codes and the rounding error back into
    the residual for the k sent values, three loops over the k values (amax, divide, round and
    write back) instead of a dozen torch ops; the float32 -> e4m3 rounding is c10's
    ``fp8e4m3fn_from_fp32_value`` (round to nearest even) with torch's CPU cast's saturation
    (anything above 448, infinity included, becomes 448; NaN stays NaN), checked against
    torch's own cast on every float32 bit pattern (once, by hand) and on sampled ones in
    ``tests/test_fastpath.py``.
  * ``scatter_fp8`` / ``scatter_f32``: the dense tensor back from k positions and values.

The algorithms are the fast path's (DGC, Lin et al. 2018, sec. 3.1 for the sampled threshold;
Rice coding as ``codecs.py``), with no deviation in what they output. Every kernel computes
exactly what the torch path computes (same float32 operations in the
same order per element); the tests compare messages, indices, values and residuals byte for
byte. ``AVAILABLE`` is False when numba is not importable: the fast path then runs its torch
ops (and on a GPU it always does).
"""
from __future__ import annotations

import numpy as np

try:
    import numba
    from numba import njit
    AVAILABLE = True
except ImportError:                                          # the torch path still works
    AVAILABLE = False

    def njit(*args, **kwargs):                               # keeps the definitions importable
        return (lambda f: f) if not args or not callable(args[0]) else args[0]


_DEBRUIJN = np.uint64(0x03F79D71B4CB0A89)
_DEBRUIJN_BIT = np.zeros(64, np.int64)
"""(lowest set bit of x * _DEBRUIJN) >> 58 -> the bit's position: count trailing zeros."""
for _b in range(64):
    _DEBRUIJN_BIT[(((1 << _b) * 0x03F79D71B4CB0A89) & (2 ** 64 - 1)) >> 58] = _b


@njit(cache=True, nogil=True)
def feedback_select(g, res, thr, feedback, idx_out, val_out, mask):
    """acc = res + g (float32); positions with |acc| >= thr -> idx_out[:m], val_out[:m];
    with ``feedback`` the residual becomes acc with the selected entries zeroed. Past
    len(idx_out) it counts the entries that pass but neither stores nor zeroes them.
    -> (m, how many acc are NaN or infinite).

    Two passes: (1) add, test finiteness (a count, not a branch), write the residual and one
    byte per element, |acc| >= thr, into ``mask`` (uint8, >= n; a loop the compiler
    vectorises); (2) read the mask 8 bytes at a time and visit only the set bytes (lowest set
    bit, de Bruijn count of trailing zeros), so the work is ~n/8 words + m hits instead of n
    mispredicted branches (one core, n = 1e6 at 5%: 0.8 ms against 1.5 for one branchy loop)."""
    n = g.shape[0]
    cap = idx_out.shape[0]
    nbad = 0
    big = np.float32(3.4028235e38)                           # float32 max: inf and NaN fail
    for i in range(n):
        a = res[i] + g[i] if feedback else g[i]
        nbad += not (abs(a) <= big)
        mask[i] = abs(a) >= thr
        if feedback:
            res[i] = a
    n8 = n - n % 8
    words = mask[:n8].view(np.uint64)                        # byte b of word w: element 8w + b
    m = 0
    one = np.uint64(1)
    s58 = np.uint64(58)
    for w in range(words.shape[0]):
        x = words[w]
        while x:
            low = x & (~x + one)                             # the lowest set bit
            i = 8 * w + (_DEBRUIJN_BIT[(low * _DEBRUIJN) >> s58] >> 3)
            if m < cap:
                idx_out[m] = i
                val_out[m] = res[i] if feedback else g[i]
                if feedback:
                    res[i] = 0.0
            m += 1                                           # past the buffer: counted only
            x &= x - one
    for i in range(n8, n):
        if mask[i]:
            if m < cap:
                idx_out[m] = i
                val_out[m] = res[i] if feedback else g[i]
                if feedback:
                    res[i] = 0.0
            m += 1
    return m, nbad


@njit(cache=True, nogil=True)
def rice_encode(idx, n, r):
    """Sorted distinct positions (k,) int64 in [0, n) -> (header + body uint8, -1), or
    (empty, j) where idx[j] breaks the order or the range (the caller raises the reference's
    error)."""
    k = idx.shape[0]
    prev = -1
    unary = 0
    for j in range(k):
        gap = idx[j] - prev - 1
        if gap < 0 or idx[j] >= n:
            return np.zeros(0, np.uint8), j
        unary += gap >> r
        prev = idx[j]
    nbits = k * r + unary + k
    out = np.zeros(5 + (nbits + 7) // 8, np.uint8)
    out[0] = k & 255                                         # header "<IB": k u32, r u8
    out[1] = (k >> 8) & 255
    out[2] = (k >> 16) & 255
    out[3] = (k >> 24) & 255
    out[4] = r
    mask = (1 << r) - 1
    acc = 0
    nacc = 0
    p = 5
    prev = -1
    for j in range(k):                                       # remainders, MSB first
        acc = (acc << r) | ((idx[j] - prev - 1) & mask)
        nacc += r
        prev = idx[j]
        while nacc >= 8:
            nacc -= 8
            out[p] = (acc >> nacc) & 255
            p += 1
        acc &= (1 << nacc) - 1
    if nacc:
        out[p] = (acc << (8 - nacc)) & 255                   # the unary part ORs into it
    pos = k * r - 1
    prev = -1
    for j in range(k):                                       # a 1 ends each unary code
        pos += ((idx[j] - prev - 1) >> r) + 1
        prev = idx[j]
        out[5 + (pos >> 3)] |= 128 >> (pos & 7)
    return out, -1


_LEAD = np.array([0] + [7 - int(v).bit_length() + 1 for v in range(1, 256)], np.int64)
"""The position (0 = MSB) of a byte's highest set bit."""


def numba_version() -> str:
    return numba.__version__ if AVAILABLE else "absent"


@njit(cache=True, nogil=True)
def rice_decode(body, k, r, out):
    """The body (after the 5-byte header; the caller checked k*r <= 8*len(body)) -> positions
    in out[:k]. -> (unary terminators found, absolute bit position of the last, largest unary
    part among the first k); out is valid only when the first equals k."""
    mask = (1 << r) - 1
    acc = 0
    nacc = 0
    p = 0
    for j in range(k):                                       # remainders
        while nacc < r:
            acc = (acc << 8) | body[p]
            p += 1
            nacc += 8
        nacc -= r
        out[j] = (acc >> nacc) & mask
        acc &= (1 << nacc) - 1
    start = k * r
    count = 0
    prev = start - 1
    qmax = 0
    cur = -1
    for b in range(start >> 3, body.shape[0]):               # unary terminators
        v = np.int64(body[b])
        if b == start >> 3:
            v &= 255 >> (start & 7)                          # the remainders' bits are not ones
        while v:                                             # each set bit, MSB first
            t = _LEAD[v]
            v ^= 128 >> t
            pos = 8 * b + t
            if count < k:
                q = pos - prev - 1
                if q > qmax:
                    qmax = q
                cur += ((q << r) | out[count]) + 1
                out[count] = cur
            count += 1
            prev = pos
    return count, prev, qmax


@njit(cache=True, nogil=True)
def _e4m3(f, ax):
    """e4m3fn code (no sign) of a float32 with bits ``f`` (sign cleared) and value ``ax`` >= 0:
    c10's fp8e4m3fn_from_fp32_value with torch's CPU saturation."""
    if f > 0x43E00000:                                       # |x| > 448: saturate; NaN: NaN
        return 0x7F if f > 0x7F800000 else 0x7E
    if f < (121 << 23):                                      # below 2^-6: subnormal e4m3, a
        return np.int64(np.rint(ax * np.float32(512.0)))     # multiple of 2^-9, ties to even
    f += ((7 - 127) << 23) + 0x7FFFF + ((f >> 20) & 1)       # round the mantissa to 3 bits,
    return (f >> 20) & 255                                   # ties to even, rebias 127 -> 7


@njit(cache=True, nogil=True)
def e4m3_codes(x):
    """float32 (m,) -> e4m3fn codes (m,) uint8 (for the tests: against torch's cast)."""
    out = np.empty(x.shape[0], np.uint8)
    xb = x.view(np.uint32)
    for i in range(x.shape[0]):
        f = np.int64(xb[i])
        out[i] = _e4m3(f & 0x7FFFFFFF, abs(x[i])) | ((f >> 24) & 0x80)
    return out


@njit(cache=True, nogil=True)
def fp8_e4m3_sent(vals, idx, res, table, feedback, codes):
    """``compression.fp8_quantize(vals, "e4m3")`` with one scale, the codes into codes (k,);
    with ``feedback`` res[idx] = vals - dequantized. -> (scale, non-finite count)."""
    k = vals.shape[0]
    amax = np.float32(0.0)
    nbad = 0
    for j in range(k):
        a = abs(vals[j])
        if not np.isfinite(a):
            nbad += 1
        elif a > amax:
            amax = a
    if nbad:
        return np.float32(1.0), nbad
    scale = amax / np.float32(448.0) if amax > 0 else np.float32(1.0)
    x = np.empty(k, np.float32)
    for j in range(k):
        x[j] = vals[j] / scale                               # float32, as torch divides
    xb = x.view(np.uint32)
    for j in range(k):
        f = np.int64(xb[j])
        c = _e4m3(f & 0x7FFFFFFF, abs(x[j])) | ((f >> 24) & 0x80)
        codes[j] = c
        if feedback:
            res[idx[j]] = vals[j] - table[c] * scale
    return scale, 0


@njit(cache=True, nogil=True)
def scatter_fp8(idx, codes, table, scale, out):
    """out[idx[j]] = table[codes[j]] * scale (float32), out zeroed by the caller.
    -> -1, or the first j with idx[j] outside [0, len(out))."""
    n = out.shape[0]
    for j in range(idx.shape[0]):
        i = idx[j]
        if i < 0 or i >= n:
            return j
        out[i] = table[codes[j]] * scale
    return -1


@njit(cache=True, nogil=True)
def scatter_f32(idx, vals, out):
    """out[idx[j]] = vals[j]; -> -1, or the first j with idx[j] outside [0, len(out))."""
    n = out.shape[0]
    for j in range(idx.shape[0]):
        i = idx[j]
        if i < 0 or i >= n:
            return j
        out[i] = vals[j]
    return -1
