"""Fused CPU kernels for the fast path (``fastpath.py``): one compiled pass per stage, numba.

The fast path's torch ops are the same on a CPU and a GPU, but on a CPU every torch op has a fixed
cost whatever its size (0.7-6.8 us a call on 16 elements, bench/RESULTS_op_overhead.md), a bool
compare 0.6 ns and ``nonzero`` 1.5 ns per element, and a
stage that is one loop over the elements takes five to ten ops and passes. Here each stage is
one loop, compiled by numba (``@njit(cache=True)``: compiled once per machine, then loaded from
``__pycache__``), over the CPU tensor's memory (``tensor.numpy()``, no copy):

  * ``probe_values``: DGC's probe, |residual + g| at the drawn positions (the draws stay
    torch's, so they are the reference's); its d-th largest, by numpy, is the threshold.
  * ``feedback_mask``: error feedback + the threshold compare in one pass, 64 elements a step as
    LLVM vectors (``_mark64``: add, store the residual, compare straight to one 64-bit word of
    bits, an integer max of |acc|), so the pass runs at about one memory copy and says how many
    passed and the largest |acc| (the fp8 scale when all of them are sent, and a NaN or
    infinity check for free). ``bit_positions`` turns the bits into positions (a hardware count
    of trailing zeros, branch-free for up to 4 bits a word); ``gather_sent`` takes their values
    and zeroes them in the residual (the torch path: add_, abs, max, compare, nonzero,
    index_select, index_fill_; seven passes and temporaries).
  * ``sent_e4m3_rice``: when every passing entry is sent, the e4m3 codes, the rounding error
    back into the residual and the Rice bytes of the positions in one loop over them.
  * ``rice_encode`` / ``rice_decode``: ``codecs.rice_encode``'s bit layout (k r-bit remainders,
    MSB first, then k unary codes: q zeros and a 1) written and read with a 64-bit accumulator
    straight into / out of the byte buffer, no bit array. ``rice_scatter``: the decode and the
    dense tensor in one pass (the unary codes read 64 bits at a time).
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
exactly what the torch path computes (same float32 operations in the same order per element;
the marking pass's integer max of |acc| bits is the float max, as non-negative float32 values
order like their bits); the tests compare messages, indices, values and residuals byte for
byte. ``AVAILABLE`` is False when numba is not importable (it is the ``fast`` extra, not a dependency
of the wheel: pyproject.toml): the fast path then runs its torch ops (and on a GPU it always does).
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


if AVAILABLE:                                               # bit instructions, inlined
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.core.extending import intrinsic

    @intrinsic
    def _ctz0(typingctx, x):
        """Count trailing zeros, the bit width for 0 (tzcnt)."""
        def codegen(context, builder, sig, args):
            return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))
        return x(x), codegen

    @intrinsic
    def _clz(typingctx, x):
        """Count leading zeros of a nonzero unsigned integer (one lzcnt/bsr)."""
        def codegen(context, builder, sig, args):
            return builder.ctlz(args[0], ir.Constant(ir.IntType(1), 1))
        return x(x), codegen

    @intrinsic
    def _bswap(typingctx, x):
        """Reverse the bytes of an integer (one bswap)."""
        def codegen(context, builder, sig, args):
            return builder.bswap(args[0])
        return x(x), codegen

    @intrinsic
    def _popcount(typingctx, x):
        def codegen(context, builder, sig, args):
            return builder.ctpop(args[0])
        return x(x), codegen

    def _splat(builder, value, count):
        """An LLVM vector of ``count`` copies of a scalar."""
        vty, i32 = ir.VectorType(value.type, count), ir.IntType(32)
        v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(i32, 0))
        return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined),
                                      ir.Constant(ir.VectorType(i32, count), [0] * count))

    @intrinsic
    def _mark64(typingctx, g, res, i, thr, words, w, feedback):
        """64 elements from i at once, as LLVM vectors: a = g[i:i+64] (+ res[i:i+64], stored back
        into res with ``feedback``, a literal bool); words[w] = the 64 bits |a| >= thr (a vector
        compare whose 64 lanes are one integer: movemask, no byte per element); -> the largest
        |a| bit pattern (float32, sign cleared) among the 64."""
        f32c = types.Array(types.float32, 1, "C")
        if (not isinstance(feedback, types.BooleanLiteral) or thr != types.float32
                or not all(isinstance(x, types.Array) and x.dtype == types.float32
                           and x.layout == "C" and x.ndim == 1 for x in (g, res))
                or words != types.Array(types.uint64, 1, "C")):
            return None                                      # not typed: numba says so

        def codegen(context, builder, sig, args):
            garr = context.make_array(sig.args[0])(context, builder, args[0])
            rarr = context.make_array(sig.args[1])(context, builder, args[1])
            warr = context.make_array(sig.args[4])(context, builder, args[4])
            i, thr = args[2], args[3]
            f32, i32 = ir.FloatType(), ir.IntType(32)
            vf, vi = ir.VectorType(f32, 64), ir.VectorType(i32, 64)
            gp = builder.bitcast(builder.gep(garr.data, [i]), vf.as_pointer())
            a = builder.load(gp, align=4)
            if feedback.literal_value:
                rp = builder.bitcast(builder.gep(rarr.data, [i]), vf.as_pointer())
                a = builder.fadd(builder.load(rp, align=4), a)
                builder.store(a, rp, align=4)
            sign_off = _splat(builder, ir.Constant(i32, 0x7FFFFFFF), 64)
            u = builder.and_(builder.bitcast(a, vi), sign_off)              # |a| as bits
            ge = builder.fcmp_ordered(">=", builder.bitcast(u, vf), _splat(builder, thr, 64))
            builder.store(builder.bitcast(ge, ir.IntType(64)), builder.gep(warr.data, [args[5]]))
            umax = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [vi]),
                                                  "llvm.vector.reduce.umax.v64i32")
            return builder.call(umax, [u])
        return types.uint32(g, res, i, thr, words, w, feedback), codegen

    @intrinsic
    def _bits32(typingctx, x):
        """A float32's bit pattern as uint32 (no conversion)."""
        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], ir.IntType(32))
        return types.uint32(types.float32), codegen


_U1, _U8, _TOP = np.uint64(1), np.uint64(8), np.uint64(1 << 63)
FINITE_BITS = np.uint32(0x7F7FFFFF)
"""float32 max as bits: |x|'s bits above it are an infinity or a NaN."""


@njit(cache=True, nogil=True)
def probe_values(g, res, feedback, draw):
    """DGC's probe: |res[j] + g[j]| (float32 sums; |g[j]| without ``feedback``) at the drawn
    positions j (s,) -> (s,) float32. Its d-th largest is the sampled threshold; the caller
    takes it with numpy's ``np.partition`` (11 us on 10,000 values against 31 for numba's),
    ``torch.topk(probe, d).values[-1]``'s value (a NaN orders differently, but then the marking
    pass finds it and the caller raises)."""
    s = draw.shape[0]
    probe = np.empty(s, np.float32)
    for t in range(s):
        j = draw[t]
        probe[t] = abs(res[j] + g[j]) if feedback else abs(g[j])
    return probe


@njit(cache=True, nogil=True)
def feedback_mask(g, res, thr, feedback, words):
    """acc = res + g (float32; with ``feedback`` stored into res, else acc = g); bit i % 64 of
    words[i // 64] = |acc[i]| >= thr; ``words``: uint64 (ceil(n / 64),). -> (m, how many bits
    are set; amax, the largest |acc| as float32 bits: above ``FINITE_BITS`` when some acc is
    NaN or infinite, and NaN never passes the compare).

    64 elements a step as LLVM vectors (``_mark64``: add, store, compare straight to bits, an
    integer max), the last n % 64 one by one."""
    n = g.shape[0]
    nw = words.shape[0]
    n64 = n // 64
    thr = np.float32(thr)                                    # a float32 value, exactly
    amax = np.uint32(0)
    m = 0
    if feedback:
        for w in range(n64):
            amax = max(amax, _mark64(g, res, 64 * w, thr, words, w, True))
            m += np.int64(_popcount(words[w]))
    else:
        for w in range(n64):
            amax = max(amax, _mark64(g, res, 64 * w, thr, words, w, False))
            m += np.int64(_popcount(words[w]))
    if nw > n64:                                             # the tail, < 64 elements
        bits = np.uint64(0)
        for i in range(64 * n64, n):
            a = res[i] + g[i] if feedback else g[i]
            if feedback:
                res[i] = a
            amax = max(amax, _bits32(a) & np.uint32(0x7FFFFFFF))
            if abs(a) >= thr:
                bits |= _U1 << np.uint64(i - 64 * n64)
        words[n64] = bits
        m += np.int64(_popcount(bits))
    return m, amax


@njit(cache=True, nogil=True)
def bit_positions(words, idx_out):
    """The set bits of ``words`` as positions in increasing order into idx_out (>= m + 4 slots,
    m the set bits). Branch-free for up to 4 bits a word: each word writes 4 slots whatever it
    holds (one trailing-zero count each; past its bits they are overwritten by the next word's)
    and advances by its popcount, so the loop's branches depend on the data only for the words
    with more than 4 bits, not on every word's exit. -> m."""
    j = 0
    for w in range(words.shape[0]):
        x = words[w]
        base = 64 * w
        cnt = np.int64(_popcount(x))
        for t in range(4):
            idx_out[j + t] = base + np.int64(_ctz0(x))      # 64 past the last bit: overwritten
            x &= x - _U1
        if cnt > 4:
            for t in range(4, cnt):
                idx_out[j + t] = base + np.int64(_ctz0(x))
                x &= x - _U1
        j += cnt
    return j


@njit(cache=True, nogil=True)
def sampled_marks(g, res, feedback, thr, words):
    """``feedback_mask`` and ``bit_positions`` in one call (one dispatch from Python instead of
    two), for the threshold ``thr`` (float32) from ``probe_values``. -> (m, amax bits as
    ``feedback_mask``, positions (m + 4,) int64, the first m valid; empty when amax says NaN or
    inf)."""
    m, amax = feedback_mask(g, res, thr, feedback, words)
    if amax > FINITE_BITS:
        return m, amax, np.empty(0, np.int64)
    idx = np.empty(m + 4, np.int64)
    bit_positions(words, idx)
    return m, amax, idx


@njit(cache=True, nogil=True)
def gather_sent(idx, src, res, feedback, val_out):
    """val_out[j] = src[idx[j]] for j < len(val_out); with ``feedback`` res[idx[j]] = 0 (what is
    sent leaves the residual)."""
    for j in range(val_out.shape[0]):
        i = idx[j]
        val_out[j] = src[i]
        if feedback:
            res[i] = 0.0


@njit(cache=True, nogil=True)
def sent_e4m3_rice(idx, m, src, res, feedback, floor, scale, table, n, r):
    """The passing positions idx[:m] (increasing) straight to the wire: with ``floor`` > 0
    only those with |src[i]| >= floor are kept (``keep_at_least``); their values src[i] / scale
    as e4m3 codes (``fp8_e4m3_sent``'s float32 ops), with ``feedback`` res[i] = src[i] - the
    dequantized value (the rounding error stays), then the positions as ``rice_encode``'s
    bytes with parameter r (the unary parts sum to <= (n - m) >> r: that bounds the buffer).
    Two loops over them (one is slower: each waits on the other's registers).
    -> (codes (m',) uint8, the Rice bytes (header + body) uint8)."""
    if floor > 0:
        m = keep_at_least(idx, m, src, floor)
    codes = np.empty(m, np.uint8)
    for j in range(m):
        i = idx[j]
        a = src[i]
        y = a / scale                                        # float32, as torch divides
        f = np.int64(_bits32(y))
        c = _e4m3(f & 0x7FFFFFFF, abs(y)) | ((f >> 24) & 0x80)
        codes[j] = c
        if feedback:
            res[i] = a - table[c] * scale
    out = np.zeros((5 + (m * r + ((n - m) >> r) + m + 7) // 8 + 7) & ~7, np.uint8)
    used = _rice_write(idx, m, r, out)
    return codes, out[:used]


@njit(cache=True, nogil=True)
def keep_at_least(idx, m, src, floor):
    """Keep the positions of idx[:m] whose |src[i]| >= floor, in order, in place (branch-free).
    -> how many."""
    w = 0
    for j in range(m):
        i = idx[j]
        idx[w] = i
        w += abs(src[i]) >= floor
    return w


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
    size = 5 + (nbits + 7) // 8
    out = np.zeros((size + 7) & ~7, np.uint8)                # whole 8-byte words
    _rice_write(idx, k, r, out)
    return out[:size], -1


@njit(cache=True, nogil=True, inline="always")
def _rice_write(idx, m, r, out):
    """``codecs.rice_encode``'s bytes of the increasing positions idx[:m] into out (zeroed, a
    multiple of 8 bytes, at least the 5-byte header + (m * r + sum of the unary parts + m +
    7) // 8): the header, the m r-bit remainders, then the m unary codes (q zeros and a 1).
    Both bit streams are built in a 64-bit register over an aligned 8-byte word of out and
    OR-ed into it (one byte-swapped store) when the next bits fall past it: a branch every
    ~64 bits, not every byte or bit. -> the bytes used."""
    out[0] = m & 255                                         # header "<IB": k u32, r u8
    out[1] = (m >> 8) & 255
    out[2] = (m >> 16) & 255
    out[3] = (m >> 24) & 255
    out[4] = r
    words = out.view(np.uint64)                              # big-endian 64-bit words, swapped
    low = np.uint64((1 << r) - 1)
    rword = 0                                                # remainders: bits of word rword,
    rpos = 40                                                # the first 40 the header's
    rwin = np.uint64(0)
    start = 40 + m * r                                       # the unary part's first bit
    uword = start >> 6                                       # terminators: bits of word uword
    u = (start & 63) - 1                                     # the last terminator in it
    uwin = np.uint64(0)
    prev = -1
    for j in range(m):
        i = idx[j]
        gap = i - prev - 1
        prev = i
        v = np.uint64(gap) & low
        rpos += r
        if rpos <= 64:
            rwin |= v << np.uint64(64 - rpos)
        else:                                                # the remainder straddles two words
            rpos -= 64
            words[rword] |= _bswap(rwin | (v >> np.uint64(rpos)))
            rword += 1
            rwin = v << np.uint64(64 - rpos)
        u += (gap >> r) + 1                                  # q zeros, then a 1
        while u >= 64:
            words[uword] |= _bswap(uwin)
            uwin = np.uint64(0)
            uword += 1
            u -= 64
        uwin |= _TOP >> np.uint64(u)
    words[rword] |= _bswap(rwin)
    words[uword] |= _bswap(uwin)
    return (64 * uword + u) // 8 + 1


def numba_version() -> str:
    return numba.__version__ if AVAILABLE else "absent"


@njit(cache=True, nogil=True, inline="always")
def _rice_read(body, k, r, idx_out, dense, codes, table, scale, vals, fp8):
    """Read ``codecs.rice_encode``'s body (after the 5-byte header; the caller checked
    k * r <= 8 * len(body)): the unary codes 64 bits at a time (the highest set bit: one
    instruction; a branch per 64 bits, not per bit), each terminator's remainder from its own
    cursor. The j-th position goes to idx_out[j] when idx_out has k slots, and/or makes the
    dense tensor: dense[i] = table[codes[j]] * scale (``fp8``) or vals[j], every other element
    0 (positions past len(dense) not written). -> (terminators found, absolute bit position of
    the last, largest unary part among the first k, the last position decoded); the outputs are
    valid only when the caller's checks on these pass."""
    n = dense.shape[0]
    to_idx = idx_out.shape[0] >= k
    nb = body.shape[0]
    low = (1 << r) - 1
    racc = 0
    rbits = 0
    rp = 0                                                   # the remainders' cursor
    start = k * r
    count = 0
    prev = start - 1
    qmax = 0
    cur = -1
    for i in range(n):                                       # a memset
        dense[i] = 0.0
    b = start >> 3
    while b < nb:
        word = np.uint64(0)
        for t in range(8):                                   # 8 bytes, big-endian (MSB first)
            word <<= _U8
            if b + t < nb:
                word |= np.uint64(body[b + t])
        if b == start >> 3:
            word &= ~np.uint64(0) >> np.uint64(start & 7)    # the remainders' bits are not ones
        while word:
            t = np.int64(_clz(word))
            word ^= _TOP >> np.uint64(t)
            pos = 8 * b + t
            if count < k:
                q = pos - prev - 1
                if q > qmax:
                    qmax = q
                while rbits < r:
                    racc = (racc << 8) | body[rp]
                    rp += 1
                    rbits += 8
                rbits -= r
                cur += ((q << r) | ((racc >> rbits) & low)) + 1
                racc &= (1 << rbits) - 1
                if to_idx:
                    idx_out[count] = cur
                if cur < n:
                    dense[cur] = table[codes[count]] * scale if fp8 else vals[count]
            count += 1
            prev = pos
        b += 8
    return count, prev, qmax, cur


@njit(cache=True, nogil=True)
def rice_decode(body, k, r, out):
    """The body (after the 5-byte header; the caller checked k*r <= 8*len(body)) -> positions
    in out[:k]. -> (unary terminators found, absolute bit position of the last, largest unary
    part among the first k); out is valid only when the first equals k."""
    none = np.empty(0, np.float32)
    count, last, qmax, _ = _rice_read(body, k, r, out, none, np.empty(0, np.uint8), none,
                                      np.float32(1.0), none, False)
    return count, last, qmax


@njit(cache=True, nogil=True)
def rice_scatter(body, k, r, codes, table, scale, vals, fp8, out):
    """``rice_decode`` and the dense tensor in one pass (``_rice_read``): the j-th decoded
    position i gets out[i] = table[codes[j]] * scale (``fp8``) or vals[j], every other
    element of out (n,) float32 0. -> ``rice_decode``'s three and the last decoded position."""
    return _rice_read(body, k, r, np.empty(0, np.int64), out, codes, table, scale, vals, fp8)


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
