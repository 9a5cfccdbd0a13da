"""The fast path (distributed/fastpath.py) against the readable reference path: same bytes,
same indices, same values after fp8, same residuals; exact round trips; clear errors."""
import dataclasses

import numpy as np
import pytest
import torch

from grpo_lab.distributed import codecs, compression as C, fastpath as F, kernels, wire


@pytest.fixture(params=["numba", "torch"])
def path(request, monkeypatch):
    """Both CPU writers of the fast path: the fused numba kernels and the torch ops."""
    if request.param == "numba" and not kernels.AVAILABLE:
        pytest.skip("numba is not importable")
    monkeypatch.setattr(F, "KERNELS_ON_CPU", request.param == "numba")
    return request.param


def random_indices(n, k, seed):
    return np.sort(np.random.default_rng(seed).choice(n, k, replace=False))


@pytest.mark.parametrize("n,k", [(1_000_000, 50_000), (100_000, 1_000), (100_000, 100),
                                 (1000, 300), (64, 64), (7, 1), (10, 0), (2 ** 31 + 7, 3)])
def test_rice_fast_writes_the_reference_bytes_and_round_trips(n, k, path):
    idx = random_indices(n, k, seed=k) if n < 2 ** 31 else np.array([0, 5, 2 ** 31 + 6])
    ref = codecs.rice_encode(idx, n)
    fast = F.rice_encode(torch.from_numpy(idx), n)
    assert fast == ref                                                     # byte for byte
    assert np.array_equal(F.rice_decode(ref, n).numpy(), idx)              # lossless
    assert np.array_equal(codecs.rice_decode(fast, n), idx)


def test_rice_remainder_widths_above_and_below_a_byte():
    for r in range(0, 33):                                                 # every Rice parameter
        vals = torch.tensor([0, (1 << r) - 1, (1 << r) // 3, 1 if r else 0])
        bits = F.uint_bits(vals, r) if r else torch.zeros(0, dtype=torch.uint8)
        assert len(bits) == 4 * r
        if r:
            body = F.pack_bits(bits)
            assert torch.equal(F.bytes_uint(body, 4, r), vals), r


@pytest.mark.parametrize("preset", ["fast_topk5", "aggressive"])
def test_gpu_branches_run_on_cpu_give_the_same_bytes(monkeypatch, preset):
    """NUMPY_ON_CPU off: every primitive takes its torch (GPU) branch; bytes and residuals as
    the readable path's, Rice round trips included."""
    monkeypatch.setattr(F, "NUMPY_ON_CPU", False)
    monkeypatch.setattr(F, "KERNELS_ON_CPU", False)
    monkeypatch.setattr(F, "FAST_MIN_K", 0)                               # the torch codec always
    for n, k in [(100_000, 5000), (1000, 13), (64, 64)]:
        idx = random_indices(n, k, seed=n)
        payload = F.rice_encode(torch.from_numpy(idx), n)
        assert payload == codecs.rice_encode(idx, n)
        assert np.array_equal(F.rice_decode(payload, n).numpy(), idx)
    cfg = dataclasses.replace(C.get_config(preset), index_codec="rice")
    slow = C.Compressor(dataclasses.replace(cfg, fast=False), seed=2)
    fast = C.Compressor(dataclasses.replace(cfg, fast=True), seed=2)
    for grads in _random_gradients():
        m = fast.encode(grads)
        assert m == slow.encode(grads)
        d = C.decode_message(m, fast=True)
        assert all(torch.equal(d[name], v) for name, v in C.decode_message(m).items())


def test_raw_fast_matches_reference():
    idx = random_indices(5000, 250, 1)
    assert F.raw_encode(torch.from_numpy(idx), 5000) == codecs.raw_encode(idx, 5000)
    assert np.array_equal(F.raw_decode(codecs.raw_encode(idx, 5000), 5000).numpy(), idx)


@pytest.mark.parametrize("n,feedback", [(200_000, True), (4_099, True), (1_001, False)])
@pytest.mark.parametrize("select", ["exact", "sampled"])
def test_fast_selection_equals_reference(select, path, n, feedback):
    """Sizes that are and are not a multiple of the kernel's 8-byte words; with and without
    a residual (error feedback)."""
    g = torch.randn(n, generator=torch.Generator().manual_seed(3)) ** 3  # heavy tails
    res = torch.randn(n, generator=torch.Generator().manual_seed(4)) * 0.1 if feedback else None
    k = max(1, n // 200)
    ref_idx, ref_vals, ref_res, _ = C.sparsify(g, None if res is None else res.clone(), None, k,
                                               select, generator=torch.Generator().manual_seed(5))
    idx, vals, new_res = F.sparsify_(g, None if res is None else res.clone(), k, select,
                                     generator=torch.Generator().manual_seed(5))
    assert torch.equal(idx, ref_idx) and torch.equal(vals, ref_vals)
    assert (new_res is None and ref_res is None) or torch.equal(new_res, ref_res)


def _toy_gradients(steps=3):
    """Real gradients: the toy GPT's next-token loss on three batches."""
    from grpo_lab.training.overlap_timing import lm_loss, toy_policy
    model, vocab = toy_policy(tiny=True)
    out = []
    for s in range(steps):
        model.zero_grad()
        tokens = torch.randint(0, vocab, (4, 12), generator=torch.Generator().manual_seed(s))
        lm_loss(model, tokens).backward()
        out.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return out


def _random_gradients(steps=3):
    gen = torch.Generator().manual_seed(7)
    return [{"w": torch.randn(300, 200, generator=gen), "b": torch.randn(37, generator=gen) * 1e-3,
             "e": torch.zeros(0)} for _ in range(steps)]


@pytest.mark.parametrize("min_k", [0, F.FAST_MIN_K], ids=["torch codec", "size-picked codec"])
@pytest.mark.parametrize("make", [_random_gradients, _toy_gradients])
@pytest.mark.parametrize("preset", ["fp8_topk5", "fast_topk5", "aggressive"])
def test_fast_compressor_sends_the_reference_bytes(make, preset, min_k, monkeypatch, path):
    """Over three steps of error feedback: every message byte-identical to the readable path's
    (so the same indices, the same values after fp8), the same residuals, decoded alike."""
    monkeypatch.setattr(F, "FAST_MIN_K", min_k)
    cfg = dataclasses.replace(C.get_config(preset), index_codec="rice")
    slow, fast = C.Compressor(dataclasses.replace(cfg, fast=False), seed=1), \
        C.Compressor(dataclasses.replace(cfg, fast=True), seed=1)
    for grads in make():
        m_slow, m_fast = slow.encode(grads), fast.encode(grads)
        assert m_fast == m_slow
        for name in slow.residual:
            assert torch.equal(fast.residual[name], slow.residual[name]), name
        d_ref, d_fast = C.decode_message(m_slow), C.decode_message(m_fast, fast=True)
        for name in grads:
            assert torch.equal(d_ref[name], d_fast[name]), name


def test_fp8_topk_values_are_the_fp8_rounding_of_the_sent_values(path):
    g = {"w": torch.randn(10_000, generator=torch.Generator().manual_seed(0))}
    comp = C.Compressor(C.get_config("fast_topk5"))
    payload = comp.encode(g)
    assert payload[4] == 2                                                 # wire version 2
    _, (rec,) = wire.unpack(payload)
    assert rec.kind == "topk" and rec.format == "e4m3" and len(rec.values) == rec.k == 500
    idx = codecs.rice_decode(rec.index, 10_000)
    expect = torch.topk(g["w"].abs(), 500).indices.sort().values
    assert len(np.intersect1d(idx, expect.numpy())) >= 450                 # sampled threshold
    sent = g["w"][torch.from_numpy(idx)]
    codes, scale = C.fp8_quantize(sent, "e4m3")
    assert rec.values == codes.numpy().tobytes() and rec.scales[0] == scale[0]
    out = C.decode_message(payload, fast=True)["w"].reshape(-1)
    # error feedback over the whole compressor: sent (after fp8) + residual == gradient
    assert torch.equal(out + comp.residual["w"], g["w"]) or \
        torch.allclose(out + comp.residual["w"], g["w"], rtol=0, atol=1e-6 * float(g["w"].abs().max()))
    rel = (out[idx] - sent).norm() / sent.norm()
    assert 0 < rel < 2 ** -4                                               # e4m3: 3 mantissa bits


def test_fp32_messages_keep_wire_version_1_bytes():
    g = {"w": torch.randn(1000, generator=torch.Generator().manual_seed(0))}
    payload = C.Compressor(C.CompressionConfig(dense_fraction=0.0)).encode(g)
    assert payload[4] == 1
    rec = wire.TensorRecord("w", "topk", "e4m3", "rice", (10,), 0, np.ones(1, np.float32), 1,
                            b"\x01", codecs.rice_encode(np.array([3]), 10))
    body = bytearray(wire.pack([rec]))
    body[4] = 1                                                            # claim version 1
    import zlib
    import struct
    body[-4:] = struct.pack("<I", zlib.crc32(bytes(body[:-4])))
    with pytest.raises(wire.WireError, match="version 1 allows"):
        wire.unpack(bytes(body))


def test_indices_go_to_the_faster_writer_of_the_same_bytes(monkeypatch):
    monkeypatch.setattr(F, "KERNELS_ON_CPU", False)                       # torch ops: by size
    calls = []
    monkeypatch.setattr(F, "FAST_CODECS", {"rice": F.FastCodec(
        lambda idx, n: calls.append("fast") or F.rice_encode(idx, n),
        lambda p, n: calls.append("fast") or F.rice_decode(p, n))})
    for k in (F.FAST_MIN_K - 1, F.FAST_MIN_K):
        idx = random_indices(20 * k, k, seed=k)
        payload = F.encode_indices("rice", torch.from_numpy(idx), 20 * k)
        assert payload == codecs.rice_encode(idx, 20 * k)
        assert np.array_equal(F.decode_indices("rice", payload, 20 * k, k).numpy(), idx)
    assert calls == ["fast", "fast"]                                       # only at FAST_MIN_K


def test_density_one_round_trips_exactly_and_density_zero_is_refused(path):
    g = {"w": torch.randn(40, 50, generator=torch.Generator().manual_seed(0))}
    cfg = C.CompressionConfig(dense_fraction=0.0, density=1.0, index_codec="rice", fast=True)
    out = C.decode_message(C.Compressor(cfg).encode(g), fast=True)["w"]
    assert torch.equal(out, g["w"])                                        # fp32 values: lossless
    with pytest.raises(ValueError, match=r"density must be in \(0, 1\], got 0"):
        C.CompressionConfig(density=0.0, fast=True)


def test_bad_inputs_get_clear_errors(path):
    g = torch.randn(1000)
    g[17] = float("nan")
    comp = C.Compressor(C.get_config("fast_topk5"))
    with pytest.raises(ValueError, match="gradient 'w': top-k met 1 non-finite values.*position 17"):
        comp.encode({"w": g})
    with pytest.raises(ValueError, match="1 <= k <= n; got k=1 for a tensor of 0 elements"):
        F.sparsify_(torch.zeros(0), None, 1)
    with pytest.raises(ValueError, match="1 <= k <= n; got k=0"):
        F.sparsify_(torch.ones(5), None, 0)
    empty = C.Compressor(C.get_config("fast_topk5")).encode({"e": torch.zeros(0, 3)})
    assert C.decode_message(empty, fast=True)["e"].shape == (0, 3)         # empty tensor: fine
    with pytest.raises(ValueError, match="unsorted index 2 at position 2 follows 9"):
        F.rice_encode(torch.tensor([1, 9, 2]), 10)
    with pytest.raises(ValueError, match="out of range for n=10"):
        F.rice_encode(torch.tensor([1, 10]), 10)
    with pytest.raises(ValueError, match="1-D int64 tensor"):
        F.rice_encode(torch.tensor([1.0]), 10)
    with pytest.raises(ValueError, match=r"unknown fast index codec 'huffman'; known: "
                                         r"\['raw_int32', 'rice'\] \(the other index codecs"):
        C.CompressionConfig(index_codec="huffman", fast=True)
    with pytest.raises(ValueError, match="no DGC momentum correction"):
        C.CompressionConfig(index_codec="rice", fast=True, momentum=0.9)
    with pytest.raises(ValueError, match="unknown topk_format 'int4'"):
        C.CompressionConfig(topk_format="int4")


def test_fast_rice_decoder_rejects_corrupt_payloads(path):
    idx = random_indices(10_000, 500, 0)
    good = codecs.rice_encode(idx, 10_000)
    with pytest.raises(codecs.CodecError, match="unary terminators"):
        F.rice_decode(good[:-20], 10_000)
    with pytest.raises(codecs.CodecError, match="trailing bytes"):
        F.rice_decode(good + b"\0", 10_000)
    with pytest.raises(codecs.CodecError, match="more than n"):
        F.rice_decode(good, 100)


@pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not importable")
def test_kernel_e4m3_rounding_is_torchs_cast():
    """The kernel's float32 -> e4m3 against torch's cast: random bit patterns, every e4m3 value,
    the midpoints between neighbours (ties to even) and one ulp either side, the specials.
    (Every one of the 2^32 float32 patterns agreed when checked by hand.)"""
    rng = np.random.default_rng(0)
    table = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    fin = np.unique(np.abs(table[np.isfinite(table)]))                    # 0 .. 448
    mid = ((fin[1:].astype(np.float64) + fin[:-1]) / 2).astype(np.float32)  # exact in float32
    around = np.concatenate([fin, mid, np.nextafter(mid, 0), np.nextafter(mid, 1e9),
                             np.array([448.5, 464, 479.9, 480, 1e30, np.inf, np.nan], np.float32)])
    x = np.concatenate([rng.integers(0, 2 ** 32, 1_000_000, dtype=np.uint64).astype(np.uint32)
                        .view(np.float32), around, -around])
    assert np.array_equal(kernels.e4m3_codes(x),
                          torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy())


@pytest.mark.parametrize("where", [0, 4999, 1234])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_is_refused_and_the_residual_kept_alike(path, where, bad):
    """Both writers raise the same error on a NaN or infinity anywhere (first, last, middle),
    and leave the residual as the torch ops leave it: residual + g, nothing zeroed."""
    g = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    g[where] = bad
    res = torch.randn(5000, generator=torch.Generator().manual_seed(2))
    expect = res + g
    with pytest.raises(ValueError, match=f"top-k met 1 non-finite values.*position {where}$"):
        F.sparsify_(g, res, 250, "sampled", torch.Generator().manual_seed(3))
    assert torch.equal(res, expect) or (torch.isnan(expect[where]) and
                                        torch.equal(res.nan_to_num(), expect.nan_to_num()))


@pytest.mark.parametrize("feedback", [True, False])
def test_sampled_threshold_with_ties_beyond_the_kernel_buffer(path, feedback):
    """A mostly-zero gradient: the sampled threshold is 0, every entry passes it (more than the
    kernel's 2k + 1024 buffer), and the top k of them are kept; as the reference, bit for bit."""
    g = torch.zeros(20_003)                                                # not a multiple of 8
    g[::97] = torch.randn(len(g[::97]), generator=torch.Generator().manual_seed(0))
    res = torch.zeros(20_003) if feedback else None
    ref_idx, ref_vals, ref_res, _ = C.sparsify(g, None if res is None else res.clone(), None, 500,
                                               "sampled", generator=torch.Generator().manual_seed(5))
    idx, vals, new_res = F.sparsify_(g, None if res is None else res.clone(), 500, "sampled",
                                     generator=torch.Generator().manual_seed(5))
    assert len(idx) == 500 and torch.equal(idx, ref_idx) and torch.equal(vals, ref_vals)
    assert (new_res is None and ref_res is None) or torch.equal(new_res, ref_res)


def test_kernel_decode_scatter_equals_the_torch_decode(path):
    """fastpath.scatter (the dense tensor from positions and fp32 or e4m3 values) against
    compression.topk_decode; an index out of range goes to the torch ops and their error."""
    idx = torch.from_numpy(random_indices(10_000, 700, 3))
    vals = torch.randn(700, generator=torch.Generator().manual_seed(4)) * 1e-3
    codes, sc = C.fp8_quantize(vals, "e4m3")
    for fmt, payload, scales in [("fp32", vals.numpy().astype("<f4").tobytes(), np.zeros(0)),
                                 ("e4m3", codes.numpy().tobytes(), sc.numpy()),
                                 ("e5m2", C.fp8_quantize(vals, "e5m2")[0].numpy().tobytes(),
                                  C.fp8_quantize(vals, "e5m2")[1].numpy())]:
        ref = C.topk_decode(idx, payload, 10_000, fmt, scales)
        got = F.scatter(idx, payload, 10_000, fmt, scales)
        assert got is None if (path == "torch" or fmt == "e5m2") else torch.equal(got, ref), fmt
    assert F.scatter(idx, vals.numpy().tobytes(), 500, "fp32", np.zeros(0)) is None


def _count_kernel_calls(monkeypatch):
    calls = []
    for name in ("probe_values", "sampled_marks", "gather_sent", "sent_e4m3_rice", "fp8_e4m3_sent", "rice_encode", "rice_decode", "rice_scatter",
                 "scatter_fp8"):
        fn = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _f=fn, _n=name: calls.append(_n) or _f(*a))
    monkeypatch.setattr(F, "KERNELS_ON_CPU", True)
    return calls


@pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not importable")
def test_a_cpu_tensor_takes_every_kernel_once(monkeypatch):
    """fast_topk5 on one CPU tensor: when at most k pass the threshold, one kernel for the
    probe (its d-th largest by numpy), one for the marking pass and the positions, one for
    fp8 + residual + Rice on the way out, one Rice + dense kernel on the way in; when more pass, their values first (for the
    floor that keeps the top k); with a tie across the k-th, the stages one by one (so the
    equality tests above test the kernels, not a fallback)."""
    calls = _count_kernel_calls(monkeypatch)
    g = {"w": torch.randn(20_000, generator=torch.Generator().manual_seed(0))}
    for seed, more in [(1, []), (0, ["gather_sent"])]:                     # 796 and > 1000 pass
        calls.clear()
        C.decode_message(C.Compressor("fast_topk5", seed=seed).encode(g), fast=True)
        assert calls == ["probe_values", "sampled_marks", *more, "sent_e4m3_rice",
                         "rice_scatter"], seed
    calls.clear()
    tied = {"w": torch.zeros(20_000)}                     # every entry passes a threshold of 0
    tied["w"][::97] = 1.0
    C.decode_message(C.Compressor("fast_topk5").encode(tied), fast=True)
    assert calls == ["probe_values", "sampled_marks", "gather_sent", "gather_sent", "fp8_e4m3_sent",
                     "rice_encode", "rice_scatter"]


@pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not importable")
@pytest.mark.parametrize("feedback", [True, False])
@pytest.mark.parametrize("levels", [0, 4], ids=["continuous", "few values"])
def test_fused_record_over_steps_takes_every_branch_and_sends_the_reference_bytes(
        monkeypatch, levels, feedback):
    """Ten steps of fast_topk5 on a 60,003-element tensor: at most k passing (one kernel), more
    than k with a unique top k (the floor), and, on gradients of a few distinct values, a tie
    across the k-th (torch.topk's choice, stage by stage); every message and residual equal
    to the readable path's."""
    calls = _count_kernel_calls(monkeypatch)
    cfg = dataclasses.replace(C.get_config("fast_topk5"), error_feedback=feedback)
    slow = C.Compressor(dataclasses.replace(cfg, fast=False), seed=3)
    fast = C.Compressor(cfg, seed=3)
    gen = torch.Generator().manual_seed(4)
    seen = set()
    for _ in range(10):
        g = torch.randn(60_003, generator=gen)
        if levels:
            g = torch.round(g * levels) / levels                            # many equal |values|
        calls.clear()
        m = fast.encode({"w": g})
        seen.add(["all", "floor", "tie"][calls.count("gather_sent")])
        assert m == slow.encode({"w": g})
        if feedback:
            assert torch.equal(fast.residual["w"], slow.residual["w"])
        assert torch.equal(C.decode_message(m, fast=True)["w"], C.decode_message(m)["w"])
    assert seen >= ({"all", "floor"} if not levels else {"tie"}), seen


@pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not importable")
@pytest.mark.parametrize("feedback", [True, False])
@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000, 4099, 100_000])
def test_marking_kernel_equals_numpy(n, feedback):
    """kernels.feedback_mask (64 elements a step as LLVM vectors, then the tail) against numpy:
    the residual, the bits (packbits, little-endian), their count and the largest |acc|, on
    sizes around the 64-element step, with -0.0, exact ties with the threshold, NaN and inf."""
    rng = np.random.default_rng(n)
    g = (rng.standard_normal(n) ** 3).astype(np.float32)
    res = (rng.standard_normal(n) * 0.1).astype(np.float32)
    acc = res + g if feedback else g.copy()
    thr = np.float32(np.quantile(np.abs(acc), 0.9))
    g[:: 7] = (thr - res[:: 7]) if feedback else thr                      # ties: |acc| == thr
    g[3 % n] = -0.0
    acc = res + g if feedback else g.copy()
    for bad in (None, np.nan, np.inf, -np.inf):
        gb = g.copy()
        if bad is not None:
            gb[(n * 2) // 3] = bad
        r = res.copy()
        words = np.full(-(-n // 64), 0xAAAA, np.uint64)                  # stale bits: overwritten
        m, amax = kernels.feedback_mask(gb, r, thr, feedback, words)
        expect = res + gb if feedback else gb
        passed = np.abs(expect) >= thr                                     # NaN: False
        assert np.array_equal(r, expect if feedback else res, equal_nan=True)
        assert m == passed.sum()
        padded = np.zeros(64 * len(words), bool)
        padded[:n] = passed
        assert np.array_equal(words, np.packbits(padded, bitorder="little").view(np.uint64))
        if bad is None:
            assert amax <= kernels.FINITE_BITS and \
                np.uint32(amax).view(np.float32) == np.abs(expect).max()
        else:
            assert amax > kernels.FINITE_BITS


@pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not importable")
def test_bit_positions_equal_flatnonzero():
    """Words with 0, 1-4 and more than 4 bits (the branch-free part and the rest), all 64."""
    rng = np.random.default_rng(0)
    for density in (0.0, 0.01, 0.05, 0.3, 0.9, 1.0):
        bits = rng.random(64 * 50) < density
        bits[64:128] = True                                                # a full word
        words = np.packbits(bits, bitorder="little").view(np.uint64)
        m = int(bits.sum())
        out = np.full(m + 4, -1, np.int64)
        assert kernels.bit_positions(words, out) == m
        assert np.array_equal(out[:m], np.flatnonzero(bits))


@pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not importable")
@pytest.mark.parametrize("n,m", [(1_000_000, 50_000), (100_003, 31), (4099, 205), (1001, 1001),
                                 (70, 3)])
@pytest.mark.parametrize("feedback", [True, False])
@pytest.mark.parametrize("cut", [False, True], ids=["all sent", "floor"])
def test_sent_kernel_writes_the_staged_bytes(n, m, feedback, cut):
    """kernels.sent_e4m3_rice (fp8 codes, residual error and Rice bytes in one call) against
    compression.fp8_quantize / fp8_dequantize and codecs.rice_encode, for Rice parameters from
    0 (every position sent) to 15, values that round to subnormals and to 448; with a floor,
    only the positions whose |value| reaches it (the others keep their residual)."""
    rng = np.random.default_rng(m)
    idx = np.sort(rng.choice(n, m, replace=False))
    acc = rng.standard_normal(n).astype(np.float32)
    acc[idx[: m // 3]] *= np.float32(1e-4)                                 # e4m3 subnormals
    res = acc.copy()
    floor = np.float32(np.quantile(np.abs(acc[idx]), 0.3)) if cut else np.float32(0.0)
    sent = idx[np.abs(acc[idx]) >= floor]
    vals = torch.from_numpy(acc[sent])
    codes_ref, scale = C.fp8_quantize(vals, "e4m3")
    r = codecs.rice_parameter(len(sent), n)
    padded = np.concatenate([idx, np.zeros(4, np.int64)])
    codes, index = kernels.sent_e4m3_rice(padded, m, res, res, feedback, floor,
                                          scale.numpy()[0], F._e4m3_table(), n, r)
    assert index.tobytes() == codecs.rice_encode(sent, n)
    assert np.array_equal(codes, codes_ref.numpy())
    expect = acc.copy()
    if feedback:
        expect[sent] = (vals - C.fp8_dequantize(codes_ref, scale, "e4m3")).numpy()
    assert np.array_equal(res, expect)


@pytest.mark.parametrize("fmt", ["e4m3", "fp32"])
@pytest.mark.parametrize("n,k", [(1_000_000, 50_000), (10_007, 1), (64, 64), (100, 1)])
def test_rice_dense_equals_decode_then_scatter(fmt, n, k, path):
    """fastpath.rice_dense (Rice positions and values to the dense tensor in one kernel)
    against codecs.rice_decode + compression.topk_decode; None without the kernels."""
    idx = random_indices(n, k, seed=n + k)
    vals = torch.randn(k, generator=torch.Generator().manual_seed(1))
    if fmt == "e4m3":
        codes, sc = C.fp8_quantize(vals, "e4m3")
        values, scales = codes.numpy().tobytes(), sc.numpy()
    else:
        values, scales = vals.numpy().tobytes(), np.zeros(0, np.float32)
    payload = codecs.rice_encode(idx, n)
    got = F.rice_dense(payload, n, k, fmt, values, scales)
    if path == "torch":
        assert got is None
        return
    assert torch.equal(got, C.topk_decode(idx, values, n, fmt, scales))
    assert F.rice_dense(payload, n, k + 1, fmt, values, scales) is None  # k disagrees: staged


@pytest.mark.parametrize("cut", ["short", "trailing", "n_small", "k_big", "unary", "last",
                                 "q_big", "r_bits", "r_big"])
def test_dense_decode_errors_are_the_staged_ones(cut, path):
    """Corrupt Rice payloads inside a valid message: decode_message(fast=True) raises the same
    WireError as the readable decoder, whichever writer (one kernel, or stage by stage)."""
    n, k = 10_000, 500
    idx = random_indices(n, k, 0)
    good = codecs.rice_encode(idx, n)
    body = bytearray(good)
    if cut == "short":
        body = body[:-20]
    elif cut == "trailing":
        body += b"\0"
    elif cut == "n_small":
        idx = idx[idx < 5000]
        k = len(idx)
        body = bytearray(codecs.rice_encode(np.append(idx, 9000), n))  # one index too large
        k += 1
    elif cut == "k_big":
        body[0:4] = (k + 1).to_bytes(4, "little")
    elif cut == "unary":
        body[-1] = 0                                                       # the last terminator lost
    elif cut == "last":
        body[5 + (k * body[4]) // 8 + 3] = 0xFF                            # extra terminators
    elif cut == "q_big":                                                   # 9999 >> r = 1 > 100 >> r
        k, body = 1, bytearray(codecs.rice_encode(np.array([9999]), n))
    else:
        body[4] = 32 if cut == "r_bits" else 40                            # r: too many bits, > 32
    codes, sc = C.fp8_quantize(torch.randn(k, generator=torch.Generator().manual_seed(0)), "e4m3")
    size = {"n_small": 5000, "q_big": 100}.get(cut, n)
    rec = wire.TensorRecord("w", "topk", "e4m3", "rice", (size,), 0, sc.numpy(), k,
                            codes.numpy().tobytes(), bytes(body))
    msg = wire.pack([rec])
    with pytest.raises(wire.WireError) as ref:
        C.decode_message(msg)
    with pytest.raises(wire.WireError) as fast:
        C.decode_message(msg, fast=True)
    assert str(fast.value) == str(ref.value), cut


def test_fp8_value_check_shortcut_is_exact():
    """wire._first_bad_code: for every scale tried, the codes it calls finite are exactly the
    codes whose value times the scale is finite (so the shortcut in _check_values can only
    accept what the full check accepts)."""
    for fmt in ("e4m3", "e5m2"):
        table = wire._FP8_TABLES[fmt]
        for scale in np.float32([1e-30, 1e-3, 1.0, 448.0, 1e30, 7.6e35, 1e36, 3e38]):
            first = wire._first_bad_code(fmt, scale)
            with np.errstate(over="ignore", invalid="ignore"):
                finite = np.isfinite(table * scale)                       # (256,)
            assert np.array_equal(finite, (np.arange(256) & 0x7F) < first), (fmt, scale)


def test_fp8_value_check_refuses_exactly_the_non_finite_codes():
    """wire._check_values with one scale (its unmasked two-max shortcut, then the full check):
    every code with either sign, next to finite codes of both signs, is refused exactly when
    its value times the scale is NaN or infinite."""
    for fmt in ("e4m3", "e5m2"):
        table = wire._FP8_TABLES[fmt]
        for scale in np.float32([1e-3, 1.0, 1e36, 3e38]):
            for c in range(256):
                with np.errstate(over="ignore", invalid="ignore"):
                    ok = bool(np.isfinite(table[[1, 0x81, c]] * scale).all())
                values = bytes([1, 0x81, c])
                if ok:
                    wire._check_values("w", fmt, values, np.float32([scale]), 0)
                else:
                    with pytest.raises(wire.WireError, match="value 2 decodes to"):
                        wire._check_values("w", fmt, values, np.float32([scale]), 0)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bad_fp8_scale_is_refused(scale):
    """One scale in a message that is not a positive finite number: a WireError naming it."""
    g = {"w": torch.randn(20_000, generator=torch.Generator().manual_seed(0))}
    _, records = wire.unpack(C.Compressor("fast_topk5").encode(g))
    bad = wire.pack([records[0]._replace(scales=np.float32([scale]))])
    with pytest.raises(wire.WireError, match="FP8 scale .* is not a positive finite number") as e:
        wire.unpack(bad)
    assert f"FP8 scale {np.float32([scale])} is not" in str(e.value)       # the value, named


@pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not importable")
@pytest.mark.parametrize("feedback", [True, False])
def test_probe_values_and_numpys_partition_give_torchs_threshold(feedback):
    """The sampled threshold as the kernels take it (kernels.probe_values, then the d-th
    largest by np.partition) is torch.topk's d-th largest |residual + g| over the same draws,
    on continuous values, heavy ties and zeros."""
    rng = np.random.default_rng(0)
    for trial in range(60):
        n = int(rng.integers(1, 3000))
        g = rng.standard_normal(n).astype(np.float32)
        if trial % 3 == 1:
            g = np.round(g * 2).astype(np.float32)                         # ties
        if trial % 3 == 2:
            g[rng.random(n) < 0.7] = 0.0                                   # zeros
        res = rng.standard_normal(n).astype(np.float32)
        draw = rng.integers(0, n, int(rng.integers(1, 2000)))
        s = len(draw)
        d = int(rng.integers(1, s + 1))
        probe = kernels.probe_values(g, res, feedback, draw)
        got = np.partition(probe, s - d)[s - d]
        acc = torch.from_numpy(res + g if feedback else g)
        ref = torch.topk(acc[torch.from_numpy(draw)].abs(), d).values[-1]
        assert np.float32(got).tobytes() == ref.numpy().tobytes(), trial


def test_without_numba_the_fast_path_runs_its_torch_ops():
    """numba not importable (blocked in a fresh interpreter): kernels.AVAILABLE is False and
    fast_topk5 still sends the readable path's bytes."""
    import subprocess
    import sys
    code = ("import sys, dataclasses, torch; sys.modules['numba'] = None\n"
            "from grpo_lab.distributed import kernels, fastpath, compression as C\n"
            "assert not kernels.AVAILABLE and not fastpath.KERNELS_ON_CPU\n"
            "g = {'w': torch.randn(20_000, generator=torch.Generator().manual_seed(0))}\n"
            "cfg = C.get_config('fast_topk5')\n"
            "m = C.Compressor(cfg).encode(g)\n"
            "assert m == C.Compressor(dataclasses.replace(cfg, fast=False)).encode(g)\n"
            "assert torch.equal(C.decode_message(m, fast=True)['w'], C.decode_message(m)['w'])\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
