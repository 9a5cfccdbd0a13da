"""Index codecs: hand-worked codes, exact round trips, the entropy bound, bad input."""
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_lab.distributed import codecs
from grpo_lab.distributed.codecs import CODECS, CodecError

LOSSLESS = list(CODECS)
CODED = [c for c in CODECS if c != "raw_int32"]
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def index_sets(draw, max_n=100_000):
    """(indices, n): random-density sets, arbitrary small sets, empty, full and single."""
    n = draw(st.integers(1, max_n))
    shape = draw(st.sampled_from(["random", "arbitrary", "empty", "full", "single"]))
    if shape == "random":
        density = draw(st.sampled_from([0.001, 0.01, 0.05, 0.3, 0.9]))
        rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
        idx = np.flatnonzero(rng.random(n) < density)
    elif shape == "arbitrary":
        idx = np.array(sorted(draw(st.sets(st.integers(0, n - 1), max_size=60))), np.int64)
    elif shape == "empty":
        idx = np.zeros(0, np.int64)
    elif shape == "full":
        n = min(n, 5000)
        idx = np.arange(n)
    else:
        idx = np.array([draw(st.integers(0, n - 1))])
    return idx.astype(np.int64), n


def is_valid_set(idx, n):
    return idx.ndim == 1 and (len(idx) == 0 or (idx[0] >= 0 and idx[-1] < n
                                                and (np.diff(idx) > 0).all()))


# --------------------------------------------------------------------------- hand-worked values

def test_entropy_bound_at_5_percent_is_5_73_bits():
    # H(0.05) = -0.05 log2 0.05 - 0.95 log2 0.95 = 0.21610 + 0.07030 = 0.28640; / 0.05
    assert codecs.entropy_bound_bits(50_000, 1_000_000) == pytest.approx(5.7279, abs=1e-4)
    assert codecs.entropy_bound_bits(0, 10) == 0 and codecs.entropy_bound_bits(10, 10) == 0


def test_huffman_code_by_hand():
    # counts 4, 2, 1, 1: merge 1+1 -> 2, 2+2 -> 4, 4+4 -> 8: lengths 1, 2, 3, 3
    lengths = codecs.huffman_code_lengths([4, 2, 1, 1])
    assert lengths.tolist() == [1, 2, 3, 3]
    # canonical: 0, 10, 110, 111
    assert codecs.canonical_codes(lengths).tolist() == [0b0, 0b10, 0b110, 0b111]
    bits = codecs._write_codes(np.array([0, 2, 6, 7, 0]), np.array([1, 2, 3, 3, 1]))
    assert "".join(map(str, bits)) == "0" "10" "110" "111" "0"
    assert codecs.huffman_code_lengths([0, 5, 0]).tolist() == [0, 1, 0]   # a lone symbol


def test_huffman_lengths_are_limited_and_satisfy_kraft():
    lengths = codecs.huffman_code_lengths([2 ** i for i in range(30)])     # would be 29 deep
    assert lengths.max() <= codecs.MAX_CODE_LEN
    assert (2.0 ** -lengths.astype(float)).sum() <= 1.0


def test_rice_parameter_from_density():
    # Kiely: r = 1 + floor(log2(log(phi-1) / log(1-p))); p=0.05: log2(9.38) = 3.23 -> 4
    assert codecs.rice_parameter(50_000, 1_000_000) == 4
    assert codecs.rice_parameter(1, 2) == 0


def test_rice_bits_by_hand():
    # indices 0, 50 of n=100: p = 0.02 -> r = 1 + floor(log2(23.8)) = 5; gaps 0, 49
    # remainders 00000, 10001 (49 = 1*32 + 17); unary q=0 -> "1", q=1 -> "01"
    # bits 00000 10001 1 01 + pad 000 = 0x04 0x68
    payload = codecs.rice_encode(np.array([0, 50]), 100)
    assert payload == struct.pack("<IB", 2, 5) + bytes([0x04, 0x68])
    assert codecs.rice_decode(payload, 100).tolist() == [0, 50]


def test_gaps_and_varints_by_hand():
    assert codecs.gaps_of(np.array([3, 4, 20])).tolist() == [3, 0, 15]
    assert codecs.varint_encode(np.array([5, 127, 128, 300])) == bytes([5, 127, 0x80, 1, 0xAC, 2])
    assert codecs.varint_decode(bytes([5, 127, 0x80, 1, 0xAC, 2])).tolist() == [5, 127, 128, 300]


# --------------------------------------------------------------------------- round trips, bound

@pytest.mark.parametrize("name", LOSSLESS)
@FAST
@given(case=index_sets())
def test_round_trip_is_exact(name, case):
    idx, n = case
    out = CODECS[name].decode(CODECS[name].encode(idx, n), n)
    assert out.dtype == np.int64 and np.array_equal(out, idx)


@pytest.mark.parametrize("name", CODED)
def test_within_5_percent_of_the_bound_at_5_percent_density(name):
    n = 1_000_000
    idx = np.sort(np.random.default_rng(0).choice(n, n // 20, replace=False))
    cost = codecs.index_cost(name, idx, n)
    assert 8 * len(CODECS[name].encode(idx, n)) / len(idx) == cost.bits_per_index
    assert -0.01 < cost.over_bound < 0.05, str(cost)


def test_code_lengths_add_up_to_the_payload():
    n = 100_000
    idx = np.sort(np.random.default_rng(1).choice(n, 5000, replace=False))
    rice = CODECS["rice"]
    body_bits = 8 * (len(rice.encode(idx, n)) - 5)                         # minus 5 header bytes
    assert 0 <= body_bits - rice.code_lengths(idx, n).sum() < 8            # up to 7 pad bits
    ideal = CODECS["ans"].code_lengths(idx, n).sum() / len(idx)
    assert ideal == pytest.approx(codecs.entropy_bound_bits(5000, n), rel=0.02)


# --------------------------------------------------------------------------- bad input, corruption

@pytest.mark.parametrize("name", LOSSLESS)
@pytest.mark.parametrize("indices, n, message", [
    ([-1, 3], 10, "index -1 at position 0 is negative"),
    ([1, 5, 4], 10, "unsorted index 4 at position 2 follows 5"),
    ([1, 4, 4], 10, "duplicate index 4 at position 2 follows 4"),
    ([1, 10], 10, "index 10 at position 1 is out of range for n=10"),
    ([0.5], 10, "must be integers, got dtype float64"),
    ([[1, 2]], 10, "must be 1-D"),
    ([1], -3, "n must be an int"),
])
def test_bad_indices_name_the_offending_value(name, indices, n, message):
    with pytest.raises(ValueError, match=message):
        CODECS[name].encode(np.array(indices), n)


def test_unknown_codec_names_the_name():
    with pytest.raises(ValueError, match="unknown index codec 'lz4'"):
        codecs.get_codec("lz4")


@pytest.mark.parametrize("name", LOSSLESS)
@FAST
@given(case=index_sets(max_n=20_000), data=st.data())
def test_flipped_bytes_give_codec_error_or_a_valid_set(name, case, data):
    idx, n = case
    payload = bytearray(CODECS[name].encode(idx, n))
    if not payload:
        return
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(payload) - 1))
        payload[pos] ^= data.draw(st.integers(1, 255))
    try:
        out = CODECS[name].decode(bytes(payload), n)
    except CodecError:
        return
    assert is_valid_set(out, n)                 # undetectable by a codec; the wire CRC catches it


@pytest.mark.parametrize("name", CODED)
@FAST
@given(case=index_sets(max_n=20_000), data=st.data())
def test_truncated_payload_always_gives_codec_error(name, case, data):
    idx, n = case
    payload = CODECS[name].encode(idx, n)
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(CodecError):
        CODECS[name].decode(payload[:cut], n)


@pytest.mark.parametrize("name", LOSSLESS)
@FAST
@given(junk=st.binary(max_size=200), n=st.integers(1, 10_000))
def test_foreign_bytes_never_crash(name, junk, n):
    try:
        out = CODECS[name].decode(junk, n)
    except CodecError:
        return
    assert is_valid_set(out, n)


def test_raw_truncation_by_a_partial_index_is_detected():
    payload = CODECS["raw_int32"].encode(np.array([1, 2, 3]), 10)
    with pytest.raises(CodecError, match="not a multiple of 4"):
        CODECS["raw_int32"].decode(payload[:-1], 10)
    with pytest.raises(CodecError, match="out of range for n=3"):
        CODECS["raw_int32"].decode(payload, 3)
