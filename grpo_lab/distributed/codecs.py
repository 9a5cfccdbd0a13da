"""Index codecs: lossless coders for the positions Top-K keeps.

Top-K sends k of n gradient entries: k values and *which* k. The positions are a sorted set
of distinct integers in [0, n). Sent as int32 they cost 32 bits each; but a uniformly random
k-subset carries only log2 C(n, k) ~= n * H(k/n) bits, so no lossless coder can average fewer
than

    bound = n * H(k/n) / k  bits per index,      H(p) = -p log2 p - (1-p) log2 (1-p)

At density d = k/n = 5%: H(0.05) = 0.2864 bits, bound = 0.2864 / 0.05 = 5.73 bits per index,
so indices shrink at most 32 / 5.73 = 5.6x against int32 (11.2x against int64). "8:1 on the
indices" at 5% density is impossible; at 1% the bound is 8.08 bits (4.0x), at 0.1% 11.4 (2.8x).

Every codec here codes the *gaps* g_i = idx_i - idx_{i-1} - 1 (zeros skipped between kept
entries). For uniformly random positions the gaps are close to i.i.d. geometric,
P(g) = p (1-p)^g with p = k/n, whose entropy per gap is H(p)/p: exactly the bound. So a coder
that is optimal for a geometric law reaches the bound; the codecs differ in how close they get
and how fast they run. Siblings with one signature, ``encode(indices (k,) int64, n) -> bytes``
and ``decode(payload, n) -> indices (k,) int64``, collected in ``CODECS``:

  * ``raw_int32``: 4 bytes per index, the baseline.
  * ``rice``:    Golomb-Rice (Golomb 1966, Rice 1979) with parameter r from the density (Kiely
                 2004): each gap is q = g >> r in unary plus r low bits. Deviation: the unary
                 parts and the r-bit remainders are stored as two streams (the same bits as
                 interleaved Rice) so numpy decodes both without a per-symbol loop.
  * ``huffman``: canonical Huffman (Huffman 1952) over the gap symbols 0..L-1 plus an escape
                 ESC meaning "add L, keep reading". A geometric law is memoryless, so the escape
                 loses almost nothing while the code table (L + 1 code lengths, one byte each)
                 stays small and travels in the payload.
  * ``ans``:     rANS (Duda 2013) through the ``constriction`` library, with the same escape
                 alphabet and the geometric model P(r) = p (1-p)^r, P(ESC) = (1-p)^L. The
                 product over escapes is exactly p (1-p)^g, so the model costs nothing over
                 the ideal geometric code; only its parameter p (4 bytes) is in the payload.
  * ``zstd``:    the gaps as LEB128 varints (one byte when g < 128) compressed by zstandard;
                 a general-purpose coder, to show what an off-the-shelf tool gets.

Decoding validates everything it can (lengths, counts, code tables, terminators, range) and
raises ``CodecError`` on corrupt, truncated or foreign payloads. A flipped bit that still
decodes to a valid index set cannot be detected by a codec: the wire format's CRC-32 catches it.
"""
from __future__ import annotations

import functools
import heapq
import math
import struct
from typing import Callable, NamedTuple

import numpy as np

from grpo_lab.registry import lookup


class CodecError(ValueError):
    """A payload that does not decode to a valid index set (corrupt, truncated or foreign)."""


# --------------------------------------------------------------------------- checks, gaps, bounds

def check_indices(indices, n: int) -> np.ndarray:
    """-> indices as int64 (k,), after checking they are a sorted set of distinct ints in [0, n)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n < 2 ** 32:
        raise ValueError(f"n must be an int in [0, 2**32), got {n!r}")
    idx = np.asarray(indices)
    if idx.ndim != 1:
        raise ValueError(f"indices must be 1-D, got shape {idx.shape}")
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"indices must be integers, got dtype {idx.dtype}")
    idx = idx.astype(np.int64)
    if idx.size == 0:
        return idx
    if idx[0] < 0:
        raise ValueError(f"index {idx[0]} at position 0 is negative")
    step = np.diff(idx)
    bad = np.flatnonzero(step <= 0)
    if len(bad):
        i = int(bad[0]) + 1
        what = "duplicate" if step[i - 1] == 0 else "unsorted"
        raise ValueError(f"{what} index {idx[i]} at position {i} follows {idx[i - 1]}; "
                         f"indices must be sorted and distinct")
    if idx[-1] >= n:
        raise ValueError(f"index {idx[-1]} at position {len(idx) - 1} is out of range for n={n}")
    return idx


def gaps_of(idx: np.ndarray) -> np.ndarray:
    """Sorted distinct indices (k,) -> gaps (k,): entries skipped before each kept one."""
    return np.diff(idx, prepend=-1) - 1                                    # (k,) >= 0


def indices_of(gaps: np.ndarray) -> np.ndarray:
    return np.cumsum(gaps + 1) - 1                                         # (k,)


def entropy_bound_bits(k: int, n: int) -> float:
    """n * H(k/n) / k: the fewest bits per index any coder averages on random k-of-n sets."""
    if k <= 0 or k >= n:
        return 0.0
    p = k / n
    return n * (-p * math.log2(p) - (1 - p) * math.log2(1 - p)) / k


def geometric_p(k: int, n: int) -> float:
    """Maximum-likelihood geometric parameter of the gaps when they sum to n - k: k / n."""
    return k / n if n else 1.0


def escape_symbol(p: float, cap: int, tail: float = 1 / 64) -> int:
    """Alphabet size L before the escape: the gap exceeded with probability ``tail``, in [1, cap]."""
    if p >= 1.0 or p <= 0.0:
        return 1
    return int(min(cap, max(1, math.ceil(math.log(tail) / math.log1p(-p)))))


def _geometric_probs(p: float, L: int) -> np.ndarray:
    """(L+1,) P(r) = p q^r for r < L, P(ESC) = q^L; sums to 1. cumprod: bit-identical anywhere."""
    powers = np.concatenate([[1.0], np.cumprod(np.full(L, 1.0 - p))])      # (L+1,) q^0..q^L
    return np.concatenate([p * powers[:L], powers[L:]])


def _to_escaped(gaps: np.ndarray, L: int) -> np.ndarray:
    """Gaps (k,) -> symbols (m,): g = c*L + r becomes c escapes (symbol L) then r."""
    runs, rest = gaps // L, gaps % L                                       # (k,), (k,)
    syms = np.full(int(runs.sum()) + len(gaps), L, np.int64)              # (m,)
    syms[np.cumsum(runs + 1) - 1] = rest
    return syms


def _from_escaped(syms: np.ndarray, L: int, k: int) -> np.ndarray:
    """Symbols (m,) -> gaps (k,); the inverse of ``_to_escaped``."""
    esc = syms == L                                                        # (m,)
    ends = np.flatnonzero(~esc)                                            # (k,) gap-closing symbols
    if len(ends) != k or (len(syms) and esc[-1]):
        raise CodecError(f"symbol stream closes {len(ends)} gaps, header says k={k}")
    runs = np.diff(np.cumsum(esc)[ends], prepend=0)                        # (k,) escapes per gap
    return syms[ends] + L * runs


def _unpack(fmt: str, payload, offset: int = 0) -> tuple:
    size = struct.calcsize(fmt)
    if len(payload) < offset + size:
        raise CodecError(f"payload of {len(payload)} bytes is too short for its "
                         f"{offset + size}-byte header")
    return struct.unpack_from(fmt, payload, offset)


def _checked(idx: np.ndarray, n: int, k: int) -> np.ndarray:
    if len(idx) != k:
        raise CodecError(f"decoded {len(idx)} indices, header says k={k}")
    if k and (idx[0] < 0 or idx[-1] >= n):
        raise CodecError(f"decoded index {int(idx[-1])} is out of range for n={n}")
    return idx


def _check_k(k: int, n: int) -> None:
    if k > n:
        raise CodecError(f"header says k={k} indices, more than n={n} positions")


# --------------------------------------------------------------------------- raw int32

def raw_encode(indices, n: int) -> bytes:
    idx = check_indices(indices, n)
    if n > 2 ** 31:
        raise ValueError(f"raw_int32 holds positions below 2**31, got n={n}")
    return idx.astype("<i4").tobytes()


def raw_decode(payload, n: int) -> np.ndarray:
    if len(payload) % 4:
        raise CodecError(f"raw_int32 payload of {len(payload)} bytes is not a multiple of 4")
    idx = np.frombuffer(payload, "<i4").astype(np.int64)
    try:
        return check_indices(idx, n)
    except ValueError as e:
        raise CodecError(f"raw_int32 payload: {e}") from None


# --------------------------------------------------------------------------- Golomb-Rice

PHI = (1 + 5 ** 0.5) / 2


def rice_parameter(k: int, n: int) -> int:
    """Kiely (2004): r = max(0, 1 + floor(log2(log(phi - 1) / log(1 - p)))), p = k/n; 4 at 5%."""
    p = geometric_p(k, n)
    if p <= 0 or p >= 1:
        return 0
    return max(0, 1 + math.floor(math.log2(math.log(PHI - 1) / math.log1p(-p))))


def rice_encode(indices, n: int) -> bytes:
    idx = check_indices(indices, n)
    k, g = len(idx), gaps_of(idx)
    r = rice_parameter(k, n)
    q, low = g >> r, g & ((1 << r) - 1)                                    # (k,), (k,)
    low_bits = (low[:, None] >> np.arange(r - 1, -1, -1)) & 1              # (k, r) MSB first
    unary = np.zeros(int(q.sum()) + k, np.uint8)                           # q zeros, then a 1
    unary[np.cumsum(q + 1) - 1] = 1
    bits = np.concatenate([low_bits.astype(np.uint8).ravel(), unary])
    return struct.pack("<IB", k, r) + np.packbits(bits).tobytes()


def rice_header(payload, n: int):
    """-> (k, r, body (B,) uint8) after the checks on the header and the length."""
    k, r = _unpack("<IB", payload)
    _check_k(k, n)
    if r > 32:
        raise CodecError(f"Rice parameter r={r} is above 32")
    body = np.frombuffer(payload, np.uint8, offset=5)                     # (B,)
    if k * r > 8 * len(body):
        raise CodecError(f"{k} remainders of {r} bits need {k * r} bits, payload has "
                         f"{8 * len(body)}")
    return k, r, body


def rice_decode(payload, n: int) -> np.ndarray:
    k, r, body = rice_header(payload, n)
    bits = np.unpackbits(body)
    low = (bits[:k * r].reshape(k, r).astype(np.int64) << np.arange(r - 1, -1, -1)).sum(1)
    ones = np.flatnonzero(bits[k * r:])                                    # unary terminators
    if len(ones) != k:
        raise CodecError(f"found {len(ones)} unary terminators, header says k={k}")
    if k and len(bits) - (k * r + ones[-1] + 1) >= 8:
        raise CodecError("trailing bytes after the last Rice code")
    q = np.diff(ones, prepend=-1) - 1                                      # (k,)
    if k and q.max() > (n >> r):
        raise CodecError(f"unary part {int(q.max())} is too large for n={n}")
    return _checked(indices_of((q << r) | low), n, k)


def rice_lengths(idx: np.ndarray, n: int) -> np.ndarray:
    r = rice_parameter(len(idx), n)
    return (gaps_of(idx) >> r) + 1 + r                                     # (k,) bits per gap


# --------------------------------------------------------------------------- canonical Huffman

MAX_CODE_LEN = 16
HUFFMAN_MAX_L = 1024


def huffman_code_lengths(counts, max_len: int = MAX_CODE_LEN) -> np.ndarray:
    """Code length per symbol (0 = unused) of a Huffman code for ``counts``, at most ``max_len``.

    When the tree gets too deep the counts are halved (keeping used symbols at least 1) and the
    code rebuilt; that flattens the tree at a tiny cost. A lone symbol gets a 1-bit code.
    """
    counts = np.asarray(counts, np.int64)
    lengths = np.zeros(len(counts), np.int64)
    used = np.flatnonzero(counts > 0)
    if len(used) == 1:
        lengths[used] = 1
    while len(used) > 1:
        heap = [(int(counts[s]), i) for i, s in enumerate(used)]          # (weight, node id)
        heapq.heapify(heap)
        parent = np.zeros(2 * len(used) - 1, np.int64)                     # leaves first, root last
        for node in range(len(used), 2 * len(used) - 1):                   # merge the two lightest
            (w1, a), (w2, b) = heapq.heappop(heap), heapq.heappop(heap)
            parent[a] = parent[b] = node
            heapq.heappush(heap, (w1 + w2, node))
        depth = np.zeros(2 * len(used) - 1, np.int64)
        for node in range(2 * len(used) - 3, -1, -1):                      # parents have larger ids
            depth[node] = depth[parent[node]] + 1
        lengths[used] = depth[:len(used)]
        if lengths.max() <= max_len:
            break
        counts = np.where(counts > 0, (counts + 1) // 2, 0)
    return lengths


def canonical_codes(lengths) -> np.ndarray:
    """Canonical Huffman codes (Schwartz & Kallick 1964): by (length, symbol), counting up."""
    lengths = np.asarray(lengths, np.int64)
    codes = np.zeros(len(lengths), np.int64)
    code, prev = 0, 0
    for s in np.lexsort((np.arange(len(lengths)), lengths)):
        if lengths[s] == 0:
            continue
        code <<= int(lengths[s]) - prev
        codes[s], prev = code, int(lengths[s])
        code += 1
    return codes


@functools.lru_cache(maxsize=64)
def geometric_code_lengths(p: float, L: int) -> np.ndarray:
    """Huffman lengths (L+1,) for the escaped geometric model; with L ~ the Golomb parameter
    (P(ESC) ~ 1/2) this is the Golomb code, optimal for geometric gaps (Gallager & Van Voorhis
    1975). Probabilities become integer weights, so both ends derive the same table from p."""
    weights = np.maximum(1, np.round(_geometric_probs(p, L) * 2 ** 24)).astype(np.int64)
    lengths = huffman_code_lengths(weights)
    lengths.flags.writeable = False                                        # cached: shared, read-only
    return lengths


def _write_codes(codes: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Codes (m,) of lengths (m,) <= 16 -> one bit array, MSB of each code first."""
    aligned = (codes << (16 - lens)).astype(">u2")                         # (m,) code in top bits
    bitmat = np.unpackbits(aligned.view(np.uint8).reshape(-1, 2), axis=1)  # (m, 16)
    return bitmat[np.arange(16) < lens[:, None]]                           # (sum lens,) row-major


def _huffman_model(k: int, n: int):
    """-> (p as float32, L, code lengths (L+1,) of the model table), all derived from k and n."""
    p = np.float32(max(geometric_p(k, n), 1e-9))
    L = escape_symbol(float(p), HUFFMAN_MAX_L, tail=0.5)                   # P(ESC) ~ 1/2: Golomb
    return p, L, geometric_code_lengths(float(p), L)


def huffman_encode(indices, n: int) -> bytes:
    """Header (k, m symbols, p, table mode); mode 1 adds the L+1 fitted code lengths."""
    idx = check_indices(indices, n)
    k = len(idx)
    p, L, model = _huffman_model(k, n)                                     # (L+1,) from p alone
    syms = _to_escaped(gaps_of(idx), L)                                    # (m,)
    fitted = huffman_code_lengths(np.bincount(syms, minlength=L + 1))      # (L+1,) from the data
    explicit = fitted[syms].sum() + 8 * (L + 1) < model[syms].sum()        # a table pays for itself?
    lengths = fitted if explicit else model                                # (L+1,)
    bits = _write_codes(canonical_codes(lengths)[syms], lengths[syms])
    head = struct.pack("<IIfB", k, len(syms), p, int(explicit))
    table = lengths.astype(np.uint8).tobytes() if explicit else b""
    return head + table + np.packbits(bits).tobytes()


def _bit_windows(body: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` bits starting at every bit position of ``body``, as ints (8*len + 1,)."""
    b = np.concatenate([body, np.zeros(4, np.uint8)]).astype(np.uint64)
    word = (b[:-3] << 24) | (b[1:-2] << 16) | (b[2:-1] << 8) | b[3:]       # (len+1,) 32-bit BE
    p = np.arange(8 * len(body) + 1, dtype=np.uint64)
    return (((word[p >> 3] << (p & 7)) & 0xFFFFFFFF) >> (32 - width)).astype(np.int64)


def huffman_decode(payload, n: int) -> np.ndarray:
    k, m, p, explicit = _unpack("<IIfB", payload)
    _check_k(k, n)
    if not (np.float32(1e-9) <= p <= 1.0) or explicit > 1:
        raise CodecError(f"Huffman header has p={p}, table mode {explicit}")
    p_model, L, lengths = _huffman_model(k, n)
    if np.float32(p) != p_model:
        raise CodecError(f"header p={p} does not match k/n = {k}/{n}")
    head = 13 + (L + 1) * explicit
    if len(payload) < head:
        raise CodecError(f"payload of {len(payload)} bytes is too short for its {head}-byte header")
    if explicit:
        lengths = np.frombuffer(payload, np.uint8, count=L + 1, offset=13).astype(np.int64)
    body = np.frombuffer(payload, np.uint8, offset=head)
    nbits = 8 * len(body)
    if m < k or m > nbits or (m > 0 and k == 0):
        raise CodecError(f"{m} symbols for k={k} gaps do not fit {nbits} payload bits")
    if m == 0:
        if nbits:
            raise CodecError("trailing bytes after an empty Huffman stream")
        return np.zeros(0, np.int64)
    width = int(lengths.max())
    if width == 0 or width > MAX_CODE_LEN:
        raise CodecError(f"longest Huffman code has {width} bits, expected 1..{MAX_CODE_LEN}")
    kraft = (2 ** (width - lengths[lengths > 0])).sum()
    if kraft > 2 ** width:
        raise CodecError(f"invalid Huffman code lengths (max {width}, Kraft sum {kraft}/{2 ** width})")
    # decode table: the next `width` bits -> (symbol, code length); canonical codes tile it in order
    order = np.lexsort((np.arange(L + 1), lengths))
    order = order[lengths[order] > 0]
    span = 2 ** (width - lengths[order])                                   # (used,)
    table_sym = np.full(2 ** width, -1, np.int64)
    table_len = np.zeros(2 ** width, np.int64)
    table_sym[:span.sum()] = np.repeat(order, span)
    table_len[:span.sum()] = np.repeat(lengths[order], span)
    # where would a codeword read at each bit position end? then follow that chain from 0
    win = _bit_windows(body, width)                                        # (nbits+1,)
    nxt = np.minimum(np.arange(nbits + 1) + table_len[win], nbits)         # (nbits+1,)
    nxt[nbits] = nbits                                                     # a sink past the end
    starts = _follow(nxt, m)                                               # (m,) codeword starts
    syms = table_sym[win[starts]]                                          # (m,)
    end = int(starts[-1] + table_len[win[starts[-1]]])
    if (syms < 0).any() or starts[-1] >= nbits or end > nbits:
        raise CodecError("Huffman stream holds an invalid codeword or ends early")
    if nbits - end >= 8:
        raise CodecError("trailing bytes after the last Huffman code")
    if (syms > L).any():
        raise CodecError(f"decoded symbol above the escape symbol {L}")
    return _checked(indices_of(_from_escaped(syms, L, k)), n, k)


def _follow(nxt: np.ndarray, m: int) -> np.ndarray:
    """Positions nxt^i(0) for i in 0..m-1, by pointer doubling: log2(m) numpy passes, no loop over i."""
    i = np.arange(m)
    pos = np.zeros(m, np.int64)                                            # (m,)
    jump, b = nxt, 0                                                       # jump = nxt^(2^b)
    while (1 << b) < m:
        sel = ((i >> b) & 1).astype(bool)
        pos[sel] = jump[pos[sel]]
        jump = jump[jump]
        b += 1
    return pos


def huffman_lengths(idx: np.ndarray, n: int) -> np.ndarray:
    """Bits per gap under the model table (what ``huffman`` spends when it sends no table)."""
    _, L, lengths = _huffman_model(len(idx), n)
    g = gaps_of(idx)
    return (g // L) * lengths[L] + lengths[g % L]                          # (k,) bits per gap


# --------------------------------------------------------------------------- rANS (constriction)

ANS_MAX_L = 4096


def _geometric_model(p: np.float32):
    """Categorical over 0..L-1 and ESC = L: P(r) = p q^r, P(ESC) = q^L (sums to 1 exactly)."""
    import constriction
    L = escape_symbol(float(p), ANS_MAX_L)
    probs = _geometric_probs(float(p), L)                                  # (L+1,)
    return constriction.stream.model.Categorical(probs, perfect=False), L


def ans_encode(indices, n: int) -> bytes:
    import constriction
    idx = check_indices(indices, n)
    k = len(idx)
    p = np.float32(max(geometric_p(k, n), 1e-9))
    model, L = _geometric_model(p)
    syms = _to_escaped(gaps_of(idx), L).astype(np.int32)                  # (m,)
    coder = constriction.stream.stack.AnsCoder()
    if len(syms):
        coder.encode_reverse(syms, model)
    words = coder.get_compressed().astype("<u4")                           # (w,) 32-bit words
    return struct.pack("<IIfI", k, len(syms), p, len(words)) + words.tobytes()


def ans_decode(payload, n: int) -> np.ndarray:
    import constriction
    k, m, p, nwords = _unpack("<IIfI", payload)
    _check_k(k, n)
    if len(payload) != 16 + 4 * nwords:
        raise CodecError(f"payload of {len(payload)} bytes, header says {16 + 4 * nwords}")
    if not (np.float32(1e-9) <= p <= 1.0):
        raise CodecError(f"geometric parameter p={p} is outside [1e-9, 1]")
    model, L = _geometric_model(np.float32(p))
    if m < k or m > k + n // L + 1 or (m > 0 and k == 0):
        raise CodecError(f"{m} symbols cannot hold k={k} gaps within n={n}")
    if m == 0:
        return np.zeros(0, np.int64)
    words = np.frombuffer(payload, "<u4", offset=16).astype(np.uint32)
    try:
        coder = constriction.stream.stack.AnsCoder(words)
        syms = np.asarray(coder.decode(model, m), np.int64)
    except Exception as e:                                                 # the Rust side's errors
        raise CodecError(f"ANS stream does not decode: {e}") from None
    if not coder.is_empty():
        raise CodecError("ANS stream has words left after the last symbol")
    return _checked(indices_of(_from_escaped(syms, L, k)), n, k)


def ans_lengths(idx: np.ndarray, n: int) -> np.ndarray:
    p = max(geometric_p(len(idx), n), 1e-9)
    return -np.log2(p) - gaps_of(idx) * np.log2(max(1 - p, 1e-300))       # (k,) ideal bits per gap


# --------------------------------------------------------------------------- varint + zstd

ZSTD_LEVEL = 3


def varint_encode(values: np.ndarray) -> bytes:
    """Non-negative ints (k,) -> LEB128 bytes: 7 bits a byte, high bit set on all but the last."""
    v = np.asarray(values, np.int64)
    nb = np.ones(len(v), np.int64)                                         # (k,) bytes per value
    for j in range(1, 10):
        nb += v >= (1 << (7 * j))
    starts = np.cumsum(nb) - nb
    out = np.zeros(int(nb.sum()), np.uint8)
    for j in range(int(nb.max(initial=0))):
        sel = nb > j
        more = (nb[sel] - 1 > j) << 7
        out[starts[sel] + j] = ((v[sel] >> (7 * j)) & 0x7F) | more
    return out.tobytes()


def varint_decode(buf) -> np.ndarray:
    b = np.frombuffer(buf, np.uint8).astype(np.int64)
    if not len(b):
        return np.zeros(0, np.int64)
    last = b < 0x80                                                        # (nbytes,) value ends
    if not last[-1]:
        raise CodecError("varint stream ends inside a value")
    ends = np.flatnonzero(last)                                            # (k,)
    starts = np.concatenate([[0], ends[:-1] + 1])
    pos = np.arange(len(b)) - np.repeat(starts, ends - starts + 1)        # (nbytes,) byte in value
    if pos.max() > 4:
        raise CodecError(f"varint of {int(pos.max()) + 1} bytes is longer than 5")
    return np.add.reduceat((b & 0x7F) << (7 * pos), starts)


def zstd_encode(indices, n: int) -> bytes:
    import zstandard
    idx = check_indices(indices, n)
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(varint_encode(gaps_of(idx)))


def zstd_decode(payload, n: int) -> np.ndarray:
    import zstandard
    limit = 5 * n
    try:
        size = zstandard.frame_content_size(bytes(payload[:18]))
        if size < 0 or size > limit:
            raise CodecError(f"zstd frame declares {size} bytes, at most {limit} expected")
        stream = zstandard.ZstdDecompressor().decompressobj()
        raw = stream.decompress(bytes(payload))
    except zstandard.ZstdError as e:
        raise CodecError(f"zstd frame does not decode: {e}") from None
    if not stream.eof or stream.unused_data or len(raw) != size:
        raise CodecError(f"zstd frame is truncated or followed by {len(stream.unused_data)} "
                         f"stray bytes ({len(raw)} of {size} bytes decoded)")
    g = varint_decode(raw)
    if len(g) > n or (len(g) and g.max() >= n):
        raise CodecError(f"{len(g)} gaps do not fit n={n}")
    return _checked(indices_of(g), n, len(g))


def zstd_lengths(idx: np.ndarray, n: int) -> np.ndarray:
    """zstd has no per-symbol code: every gap gets the average."""
    return np.full(len(idx), 8 * len(zstd_encode(idx, n)) / max(len(idx), 1))


# --------------------------------------------------------------------------- registry, reports

class Codec(NamedTuple):
    encode: Callable        # (indices (k,) int64 sorted distinct, n) -> bytes
    decode: Callable        # (payload, n) -> indices (k,) int64
    code_lengths: Callable  # (indices (k,), n) -> bits spent on each index (k,)


CODECS = {
    "raw_int32": Codec(raw_encode, raw_decode, lambda idx, n: np.full(len(idx), 32.0)),
    "huffman": Codec(huffman_encode, huffman_decode, huffman_lengths),
    "rice": Codec(rice_encode, rice_decode, rice_lengths),
    "ans": Codec(ans_encode, ans_decode, ans_lengths),
    "zstd": Codec(zstd_encode, zstd_decode, zstd_lengths),
}


def get_codec(name: str) -> Codec:
    return lookup(CODECS, name, "index codec")


class IndexCost(NamedTuple):
    """Bytes a codec actually produced for k of n indices, beside the entropy bound."""
    codec: str
    k: int
    n: int
    nbytes: int

    @property
    def bits_per_index(self) -> float:
        return 8 * self.nbytes / self.k if self.k else 0.0

    @property
    def bound(self) -> float:
        return entropy_bound_bits(self.k, self.n)

    @property
    def over_bound(self) -> float:
        """Fractional excess over the bound (0.01 = 1% more bits than the bound)."""
        return self.bits_per_index / self.bound - 1 if self.bound else float("inf")

    def __str__(self) -> str:
        return (f"{self.codec}: {self.bits_per_index:.3f} bits/index "
                f"(bound {self.bound:.3f}, {self.over_bound:+.1%}; "
                f"{32 / max(self.bits_per_index, 1e-12):.2f}x vs int32)")


def index_cost(codec: str, indices, n: int) -> IndexCost:
    """Encode for real and report bits per index next to the bound n*H(k/n)/k."""
    payload = get_codec(codec).encode(indices, n)
    return IndexCost(codec, len(indices), n, len(payload))
