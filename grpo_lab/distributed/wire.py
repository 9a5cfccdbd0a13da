"""The wire format of the compression protocol: compressed tensors as real, checked bytes.

One message carries the gradients of one step (all little-endian):

    header   magic b"GLCP" (4) | version u8 | reserved u8 | tensors u16 | step u32       12 bytes
    record   name_len u16 | name (utf-8) | kind u8 | format u8 | codec u8 | ndim u8
             | shape u32 x ndim | block u32 | scales u32 | k u32 | values_len u32
             | index_len u32 | scale f32 x scales | values | index                 26 + ... bytes
    trailer  crc32 of everything before it, u32                                       4 bytes

``kind`` is dense (every element, in ``format``: fp32 | fp16 | bf16 | e4m3 | e5m2, FP8 with
one scale per ``block`` elements, block 0 = one per tensor) or topk (k values, then the k
positions coded by ``codec``, one of ``codecs.CODECS``). Versions: 1 sends top-k values in fp32
only; 2 (issue 27) also in e4m3 | e5m2 with one scale over the k values (block 0). ``pack``
writes the lowest version a message needs, so every version-1 message is byte for byte what it
was; ``unpack`` reads both. The overhead is 16 bytes a message
plus 26 + len(name) + 4 * (ndim + scales) bytes a tensor: about 50 bytes for a 2-D weight.

``unpack`` checks, before trusting any field: length, magic, version, the CRC-32 (which catches
every burst error up to 32 bits and all but 2^-32 of random corruption), then every field's
range and every length against the bytes present, and last every value as the receiver will
decode it: a NaN or infinity (an fp32/fp16/bf16 NaN or inf pattern, an FP8 NaN/inf code, or an
FP8 code times its scale that overflows float32) is rejected, so a buggy or hostile peer cannot
poison every replica behind a valid CRC; any failure raises ``WireError`` naming the
offending value. The ids below are part of the format: append, never reorder (bump VERSION).
"""
from __future__ import annotations

import math
import struct
import zlib
from typing import NamedTuple

import numpy as np

from grpo_lab.distributed.codecs import CODECS

MAGIC = b"GLCP"
VERSION = 2
"""The newest version this module writes and reads; it reads every version from 1."""
TOPK_FORMATS = {1: ("fp32",), 2: ("fp32", "e4m3", "e5m2")}
"""Value formats a top-k record may use, by wire version."""
KINDS = ("dense", "topk")
FORMATS = ("fp32", "fp16", "bf16", "e4m3", "e5m2")
FORMAT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "e4m3": 1, "e5m2": 1}
CODEC_IDS = tuple(CODECS)   # a codec's wire id is its place in codecs.CODECS: append, never reorder
NO_CODEC = 255
MAX_NDIM = 8
_HEAD = struct.Struct("<4sBBHI")
_REC = struct.Struct("<BBBB")
_SIZES = struct.Struct("<IIIII")


class WireError(ValueError):
    """Bytes that are not a valid message of this format (corrupt, truncated or foreign)."""


class TensorRecord(NamedTuple):
    """One compressed tensor as it travels; ``scales`` (float32) only for FP8."""
    name: str
    kind: str                  # "dense" | "topk"
    format: str                # value format: fp32 | fp16 | bf16 | e4m3 | e5m2
    codec: str | None          # index codec for topk, None for dense
    shape: tuple
    block: int                 # FP8 elements per scale, 0 = per tensor
    scales: np.ndarray         # (n_scales,) float32
    k: int                     # kept entries (topk); numel for dense
    values: bytes
    index: bytes

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def expected_scales(fmt: str, numel: int, block: int) -> int:
    """FP8 carries ceil(numel / block) scales (one if block is 0); other formats none."""
    if fmt not in ("e4m3", "e5m2") or numel == 0:
        return 0
    return 1 if block == 0 else -(-numel // block)


def version_needed(records: list[TensorRecord]) -> int:
    """The lowest wire version that holds these records (2 only for fp8 top-k values)."""
    return 2 if any(r.kind == "topk" and r.format != "fp32" for r in records) else 1


def pack(records: list[TensorRecord], step: int = 0) -> bytes:
    out = [_HEAD.pack(MAGIC, version_needed(records), 0, len(records), step % 2 ** 32)]
    for r in records:
        name = r.name.encode("utf-8")
        scales = np.asarray(r.scales, "<f4")
        out += [struct.pack("<H", len(name)), name,
                _REC.pack(KINDS.index(r.kind), FORMATS.index(r.format),
                          NO_CODEC if r.codec is None else CODEC_IDS.index(r.codec), len(r.shape)),
                struct.pack(f"<{len(r.shape)}I", *r.shape),
                _SIZES.pack(r.block, len(scales), r.k, len(r.values), len(r.index)),
                scales.tobytes(), bytes(r.values), bytes(r.index)]
    crc = 0
    for part in out:                                                       # one join, no copy
        crc = zlib.crc32(part, crc)                                        # of the body to extend
    out.append(struct.pack("<I", crc))
    return b"".join(out)


class _Reader:
    """Reads fields off a buffer; any read past the end is a WireError, never an IndexError."""

    def __init__(self, buf: bytes, end: int):
        self.buf, self.pos, self.end = buf, 0, end

    def take(self, size: int, what: str) -> bytes:
        if size < 0 or self.pos + size > self.end:
            raise WireError(f"message truncated: {what} needs {size} bytes at offset {self.pos}, "
                            f"{self.end - self.pos} left")
        chunk = self.buf[self.pos:self.pos + size]
        self.pos += size
        return chunk

    def unpack(self, st: struct.Struct | str, what: str) -> tuple:
        st = struct.Struct(st) if isinstance(st, str) else st
        return st.unpack(self.take(st.size, what))


def unpack(payload) -> tuple[int, list[TensorRecord]]:
    """bytes -> (step, records); raises WireError unless every check passes."""
    buf = bytes(payload)
    if len(buf) < _HEAD.size + 4:
        raise WireError(f"message of {len(buf)} bytes is shorter than the {_HEAD.size + 4}-byte "
                        f"header and trailer")
    magic, version, _, ntensors, step = _HEAD.unpack_from(buf)
    if magic != MAGIC:
        raise WireError(f"not a grpo_lab compressed message: magic {magic!r}, expected {MAGIC!r}")
    if not 1 <= version <= VERSION:
        raise WireError(f"wire format version {version} is not supported (this reads 1..{VERSION})")
    (crc,) = struct.unpack_from("<I", buf, len(buf) - 4)
    got = zlib.crc32(memoryview(buf)[:-4])                                 # no copy
    if got != crc:
        raise WireError(f"checksum mismatch: trailer says {crc:#010x}, bytes give "
                        f"{got:#010x} (corrupt or truncated message)")
    rd = _Reader(buf, len(buf) - 4)
    rd.pos = _HEAD.size
    records, names = [], set()
    for t in range(ntensors):
        (name_len,) = rd.unpack("<H", f"tensor {t} name length")
        try:
            name = rd.take(name_len, f"tensor {t} name").decode("utf-8")
        except UnicodeDecodeError as e:
            raise WireError(f"tensor {t} name is not utf-8: {e}") from None
        if name in names:
            raise WireError(f"tensor name {name!r} appears twice")
        names.add(name)
        kind, fmt, codec, ndim = rd.unpack(_REC, f"tensor {name!r} record")
        if kind >= len(KINDS) or fmt >= len(FORMATS) or ndim > MAX_NDIM:
            raise WireError(f"tensor {name!r}: kind {kind}, format {fmt} or ndim {ndim} unknown")
        kind, fmt = KINDS[kind], FORMATS[fmt]
        if (kind == "topk") != (codec != NO_CODEC) or (codec != NO_CODEC and codec >= len(CODEC_IDS)):
            raise WireError(f"tensor {name!r}: index codec id {codec} does not fit kind {kind!r}")
        shape = rd.unpack(f"<{ndim}I", f"tensor {name!r} shape")
        block, nscales, k, nvalues, nindex = rd.unpack(_SIZES, f"tensor {name!r} sizes")
        numel = math.prod(shape)
        _check_sizes(name, kind, fmt, numel, block, nscales, k, nvalues, version)
        scales = np.frombuffer(rd.take(4 * nscales, f"tensor {name!r} scales"), "<f4")
        if (not 0.0 < float(scales[0]) < math.inf if nscales == 1 else       # one: no arrays
                not np.isfinite(scales).all() or (scales <= 0).any()):
            bad = scales[~((scales > 0) & np.isfinite(scales))][:1]         # inf too, not []
            raise WireError(f"tensor {name!r}: FP8 scale {bad} is not "
                            f"a positive finite number")
        values = rd.take(nvalues, f"tensor {name!r} values")
        _check_values(name, fmt, values, scales, block)
        index = rd.take(nindex, f"tensor {name!r} index")
        records.append(TensorRecord(name, kind, fmt, None if codec == NO_CODEC else CODEC_IDS[codec],
                                    tuple(shape), block, scales.astype(np.float32), k, values, index))
    if rd.pos != rd.end:
        raise WireError(f"{rd.end - rd.pos} unexpected bytes after the last tensor record")
    return step, records


def _check_sizes(name, kind, fmt, numel, block, nscales, k, nvalues, version=VERSION) -> None:
    if numel >= 2 ** 31:
        raise WireError(f"tensor {name!r}: {numel} elements is above 2**31")
    if kind == "dense" and k != numel:
        raise WireError(f"tensor {name!r}: dense record with k={k} != numel={numel}")
    if kind == "topk" and (k > numel or fmt not in TOPK_FORMATS[version] or block):
        raise WireError(f"tensor {name!r}: top-k record with k={k} of {numel}, format {fmt!r}, "
                        f"block {block} (version {version} allows {TOPK_FORMATS[version]}, block 0)")
    count = k if kind == "topk" else numel                                 # values that are scaled
    if nscales != expected_scales(fmt, count, block):
        raise WireError(f"tensor {name!r}: {nscales} scales, format {fmt!r} with block {block} "
                        f"needs {expected_scales(fmt, count, block)}")
    if nvalues != k * FORMAT_BYTES[fmt]:
        raise WireError(f"tensor {name!r}: {nvalues} value bytes, expected "
                        f"{k} x {FORMAT_BYTES[fmt]}")


def fp8_table(fmt: str) -> np.ndarray:
    """The 256 values of an FP8 format as float32, by the bit arithmetic (OCP FP8, 2022).

    e4m3 (``float8_e4m3fn``): sign | 4 exponent bits, bias 7 | 3 mantissa bits; no inf, the
    codes S.1111.111 are NaN, largest finite 1.75 * 2^8 = 448. e5m2: sign | 5 exponent bits,
    bias 15 | 2 mantissa bits; exponent 11111 is inf (mantissa 0) or NaN, largest 57344.
    Exponent 0 is subnormal: m / 2^M * 2^(1 - bias).
    """
    E, M, bias = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}[fmt]
    code = np.arange(256)
    sign = np.where(code & 0x80, -1.0, 1.0)                                # (256,)
    e, m = (code >> M) & ((1 << E) - 1), code & ((1 << M) - 1)             # (256,) each
    value = sign * np.where(e == 0, m / 2 ** M * 2.0 ** (1 - bias),
                            (1 + m / 2 ** M) * 2.0 ** (e - bias))          # (256,)
    top = (1 << E) - 1
    if fmt == "e4m3":
        value[(e == top) & (m == (1 << M) - 1)] = np.nan
    else:
        value[e == top] = np.where(m[e == top] == 0, sign[e == top] * np.inf, np.nan)
    return value.astype(np.float32)


_FP8_TABLES = {f: fp8_table(f) for f in ("e4m3", "e5m2")}


def _first_special(table: np.ndarray) -> int:
    """The first NaN/inf code magnitude of an FP8 table, when the finite magnitudes below it
    grow with the code and every one from it up is NaN or inf (true of e4m3 and e5m2); else 0."""
    finite = np.isfinite(table[:128])                                      # (128,)
    first = int(np.argmax(~finite)) if not finite.all() else 128
    ok = finite[:first].all() and not finite[first:].any() and \
        bool((np.diff(table[:first]) >= 0).all())
    return first if ok else 0


_FP8_SPECIAL = {f: _first_special(t) for f, t in _FP8_TABLES.items()}


def _first_bad_code(fmt: str, scale: np.float32) -> int:
    """The smallest code magnitude c (code & 0x7F) whose value times ``scale`` is NaN or infinite
    (128: none; 0 when the table lacks the order below, and the caller looks at every value).
    Magnitudes grow with c up to the NaN and inf codes, so if the largest finite one times the
    scale is finite, the first bad one is the first NaN/inf code; else every magnitude from the
    first that overflows up is bad."""
    table, first = _FP8_TABLES[fmt], _FP8_SPECIAL[fmt]
    with np.errstate(over="ignore", invalid="ignore"):
        if first == 0 or np.isfinite(table[first - 1] * scale):
            return first
        return int(np.argmax(~np.isfinite(table[:first] * scale)))


def _check_values(name, fmt, values: bytes, scales: np.ndarray, block: int) -> None:
    """Raise WireError if any value decodes (as ``compression.dense_decode`` / ``topk_decode``
    will) to NaN or inf."""
    if fmt in ("fp32", "fp16"):
        x = np.frombuffer(values, "<f4" if fmt == "fp32" else "<f2")
    elif fmt == "bf16":                                                    # the top half of fp32
        x = (np.frombuffer(values, "<u2").astype(np.uint32) << 16).view(np.float32)
    else:                                                                  # FP8 code x its scale
        codes = np.frombuffer(values, np.uint8)                            # (n,)
        if len(scales) == 1 and len(codes):                                # max(codes & 0x7F) <
            first = _first_bad_code(fmt, scales[0])                        # first, without the mask
            if int(codes.view(np.int8).max()) < first and int(codes.max()) < 0x80 + first:
                return                                                     # every code is finite
        B = block or max(len(codes), 1)
        with np.errstate(over="ignore", invalid="ignore"):
            if len(scales) == 1:                                           # one scale: no index
                x = _FP8_TABLES[fmt][codes] * scales[0]                    # (n,) float32
            else:
                x = _FP8_TABLES[fmt][codes] * scales[np.arange(len(codes)) // B]  # (n,) float32
    bad = np.flatnonzero(~np.isfinite(x))
    if len(bad):
        raise WireError(f"tensor {name!r}: value {bad[0]} decodes to {x[bad[0]]} in {fmt} "
                        f"({len(bad)} non-finite values); refusing NaN/inf from a peer")
