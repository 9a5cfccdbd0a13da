"""FP8, Top-K with error feedback, DGC options, the protocol and its wire format."""
import struct
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_lab.distributed import compression as C
from grpo_lab.distributed import wire
from grpo_lab.distributed.wire import WireError

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def grads(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(200, 16, generator=g),
            "block.attn.weight": torch.randn(48, 16, generator=g) * 0.1,
            "block.attn.bias": torch.randn(48, generator=g),
            "head.weight": torch.randn(16, 40, generator=g) * 3}


# --------------------------------------------------------------------------- FP8

def test_fp8_scale_by_hand():
    # amax 896 -> scale 896 / 448 = 2; x / 2 = 0.5, -1, 448 are exact in e4m3
    codes, scale = C.fp8_quantize(torch.tensor([1.0, -2.0, 896.0]), "e4m3")
    assert scale.tolist() == [2.0]
    assert C.fp8_dequantize(codes, scale, "e4m3").tolist() == [1.0, -2.0, 896.0]
    codes, scale = C.fp8_quantize(torch.tensor([57344.0, 1.0]), "e5m2")
    assert scale.tolist() == [1.0] and codes.dtype == torch.uint8


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@FAST
@given(seed=st.integers(0, 2 ** 31), log_scale=st.floats(-20, 20), block=st.sampled_from([0, 7, 64]))
def test_fp8_round_trip_error_within_the_format_bound(fmt, seed, log_scale, block):
    spec = C.FP8_FORMATS[fmt]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, generator=g) * torch.exp(torch.randn(300, generator=g) * 2) * 2.0 ** log_scale
    codes, scales = C.fp8_quantize(x, fmt, block)
    x_hat = C.fp8_dequantize(codes, scales, fmt, block)
    s = scales.repeat_interleave(block or 300)[:300].double()              # (300,) each one's scale
    y = x.double() / s                                                     # scaled magnitudes
    normal = y.abs() >= spec.min_normal
    err = (x_hat.double() - x.double()).abs()
    # round to nearest: half an ulp, 2^-(m+1) relative (2^-4 e4m3, 2^-3 e5m2)
    assert (err[normal] <= 2.0 ** -(spec.mantissa_bits + 1) * x.double().abs()[normal] * (1 + 1e-6)).all()
    half_sub = spec.min_normal * 2.0 ** -(spec.mantissa_bits + 1)         # half the subnormal step
    assert (err[~normal] <= half_sub * s[~normal] * (1 + 1e-6)).all()
    flushed = C.fp8_flushed(x, x_hat)
    assert int((y.abs() < half_sub).sum()) <= flushed <= int((y.abs() <= half_sub).sum())


def test_per_block_scales_stop_a_spike_from_flushing_its_neighbours():
    x = torch.full((256,), 1e-5)
    x[0] = 1e4                                 # per tensor: 1e-5 * 448 / 1e4 = 4.5e-7 < 2^-10
    per_tensor = C.fp8_dequantize(*C.fp8_quantize(x, "e4m3"), "e4m3")
    per_block = C.fp8_dequantize(*C.fp8_quantize(x, "e4m3", 128), "e4m3", 128)
    assert C.fp8_flushed(x, per_tensor) == 255
    assert C.fp8_flushed(x, per_block) == 127                              # only the spike's block


def test_fp8_rejects_non_finite_and_unknown_format():
    with pytest.raises(ValueError, match="1 non-finite"):
        C.fp8_quantize(torch.tensor([1.0, float("inf")]))
    with pytest.raises(ValueError, match="unknown fp8 format 'e3m4'"):
        C.fp8_quantize(torch.ones(3), "e3m4")


# --------------------------------------------------------------------------- top-k, error feedback

def test_topk_by_hand():
    x = torch.tensor([0.1, -3.0, 2.0, 0.5, -0.2])
    assert C.topk_exact(x, 2).tolist() == [1, 2]
    idx, vals, res, _ = C.sparsify(x, torch.tensor([0.0, 0.0, 0.0, 2.0, 0.0]), None, 2)
    assert idx.tolist() == [1, 3] and vals.tolist() == [-3.0, 2.5]        # 0.5 + 2 residual
    assert res.tolist() == pytest.approx([0.1, 0.0, 2.0, 0.0, -0.2])


def test_sampled_threshold_with_full_sample_equals_exact():
    x = torch.randn(5000, generator=torch.Generator().manual_seed(3))
    sel = C.topk_sampled(x, 50, torch.Generator().manual_seed(0), sample=1.0)
    assert torch.equal(sel, C.topk_exact(x, 50))
    approx = C.topk_sampled(x, 50, torch.Generator().manual_seed(0))       # 1000 samples
    assert len(approx) <= 50 and len(approx) > 10


def test_dgc_momentum_correction_by_hand():
    # m = 0.5; step 1: u = g1 = [1, 4]; send idx 1 (4); v = [1, 0]; u masked -> [1, 0]
    # step 2: u = 0.5 [1, 0] + [1, 1] = [1.5, 1]; v = [1, 0] + u = [2.5, 1]; send idx 0 (2.5)
    res, mom = torch.zeros(2), torch.zeros(2)
    idx, vals, res, mom = C.sparsify(torch.tensor([1.0, 4.0]), res, mom, 1, momentum=0.5)
    assert (idx.tolist(), vals.tolist(), res.tolist(), mom.tolist()) == ([1], [4.0], [1.0, 0.0], [1.0, 0.0])
    idx, vals, res, mom = C.sparsify(torch.tensor([1.0, 1.0]), res, mom, 1, momentum=0.5)
    assert (idx.tolist(), vals.tolist(), res.tolist(), mom.tolist()) == ([0], [2.5], [0.0, 1.0], [0.0, 1.0])


def test_density_warmup_is_exponential():
    cfg = C.CompressionConfig(density=0.0025, warmup_steps=2, warmup_density=0.25)
    assert [C.density_at(s, cfg) for s in range(4)] == pytest.approx([0.25, 0.025, 0.0025, 0.0025])


@pytest.mark.parametrize("codec", ["huffman", "rice", "ans", "zstd", "raw_int32"])
@FAST
@given(seed=st.integers(0, 2 ** 31), steps=st.integers(1, 6),
       density=st.sampled_from([0.001, 0.01, 0.05, 0.5, 1.0]), sampled=st.booleans())
def test_error_feedback_conserves_every_gradient(codec, seed, steps, density, sampled):
    """sum over steps of what was sent (decoded from real bytes) + residual == sum of inputs."""
    cfg = C.CompressionConfig(dense_fraction=0.0, density=density, index_codec=codec,
                              topk="sampled" if sampled else "exact")
    comp = C.Compressor(cfg, seed=seed)
    inputs = [grads(seed + s) for s in range(steps)]
    sent = {n: torch.zeros(g.shape, dtype=torch.float64) for n, g in inputs[0].items()}
    for g in inputs:
        for n, t in C.decode_message(comp.encode(g)).items():
            sent[n] += t.double()
    for n in sent:
        total_in = sum(g[n].double() for g in inputs)
        total_out = sent[n] + comp.residual[n].double().reshape(sent[n].shape)
        torch.testing.assert_close(total_out, total_in, rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- the protocol

def test_plan_takes_whole_tensors_by_importance():
    g = {"a": torch.zeros(10), "b": torch.zeros(30), "c": torch.zeros(60)}
    imp = {"a": 1.0, "b": 3.0, "c": 2.0}
    # budget 0.4 * 100 = 40: b (midpoint 15) dense, c (30 + 30 = 60 > 40) stops the prefix
    assert C.plan(g, imp, 0.4) == {"b": "dense", "c": "topk", "a": "topk"}
    assert set(C.plan(g, imp, 1.0).values()) == {"dense"}
    assert set(C.plan(g, imp, 0.0).values()) == {"topk"}
    with pytest.raises(ValueError, match=r"no importance for tensors \['a'\]"):
        C.plan(g, {"b": 1.0, "c": 1.0}, 0.5)


def test_fp32_preset_is_lossless_and_fp16_is_half_the_bytes():
    g = grads()
    comp = C.Compressor("fp32")
    out = C.decode_message(comp.encode(g))
    assert all(torch.equal(out[n], g[n]) for n in g)
    half = C.Compressor("fp16")
    half.encode(g)
    assert comp.stats["comm/bytes"] - half.stats["comm/bytes"] == 2 * sum(t.numel() for t in g.values())


def test_message_bytes_match_the_byte_accounting():
    g = grads()
    cfg = C.PRESETS["fp8_topk5"]
    comp = C.Compressor(cfg)
    payload = comp.encode(g)
    kinds = C.plan(g, None, cfg.dense_fraction)
    expect = 12 + 4                                                        # header + crc
    for n, t in g.items():
        expect += 26 + len(n) + 4 * t.dim()
        if kinds[n] == "dense":
            expect += 4 + t.numel()                                        # one scale + 1 B/elem
        else:
            k = round(0.05 * t.numel())
            idx = np.flatnonzero(C.decode_message(payload)[n].reshape(-1).numpy())
            expect += 4 * k + len(C.codecs.get_codec("huffman").encode(idx, t.numel()))
    assert len(payload) == expect == comp.stats["comm/bytes"]
    assert comp.stats["comm/raw_bytes"] == 4 * sum(t.numel() for t in g.values())
    assert kinds["embed.weight"] == "topk" and kinds["head.weight"] == "dense"


@pytest.mark.parametrize("kwargs, message", [
    ({"density": 0.0}, "density must be in \\(0, 1\\], got 0.0"),
    ({"density": 1.5}, "density must be in \\(0, 1\\], got 1.5"),
    ({"dense_fraction": -0.1}, "dense_fraction must be in \\[0, 1\\], got -0.1"),
    ({"index_codec": "lz4"}, "unknown index codec 'lz4'"),
    ({"dense_format": "fp4"}, "unknown dense_format 'fp4'"),
    ({"topk": "random"}, "unknown topk 'random'"),
    ({"momentum": 0.9, "error_feedback": False}, "momentum correction needs error_feedback"),
    ({"adam_beta1": 1.0}, "adam_beta1 must be in \\[0, 1\\), got 1.0"),
    ({"dense_small": -1}, "dense_small -1 must be >= 0"),
])
def test_config_errors_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        C.CompressionConfig(**kwargs)


def test_unknown_preset_and_non_finite_gradient():
    with pytest.raises(ValueError, match="unknown compression preset 'tiny'"):
        C.Compressor("tiny")
    with pytest.raises(ValueError, match="gradient 'w': top-k met 1 non-finite"):
        C.Compressor().encode({"w": torch.tensor([1.0, float("nan")])})
    with pytest.raises(ValueError, match="gradient 'w': cannot quantize 2 non-finite"):
        C.Compressor(C.CompressionConfig(dense_fraction=1.0)).encode(
            {"w": torch.tensor([1.0, float("inf"), -float("inf")])})
    with pytest.raises(ValueError, match="gradient 'w': cannot encode 1 non-finite"):
        C.Compressor("fp16").encode({"w": torch.tensor([1.0, 1e6])})     # beyond fp16's range


def test_aggressive_preset_sends_three_thousandths_after_warmup():
    comp = C.Compressor(C.CompressionConfig(**{**C.PRESETS["aggressive"].__dict__, "warmup_steps": 3}))
    gen = torch.Generator().manual_seed(0)
    g = {"w": torch.randn(100_000, generator=gen), "b": torch.randn(1024, generator=gen)}
    for _ in range(4):
        out = C.decode_message(comp.encode(g))
    assert 60 <= int((out["w"] != 0).sum()) <= 300                         # sampled: k' <= 300
    assert int((out["b"] != 0).sum()) == 1024                              # small: dense e4m3


def test_dense_small_tensors_are_dense_outside_the_budget():
    grads = {"w": torch.ones(2000), "b": torch.ones(10), "c": torch.ones(1025)}
    assert C.plan(grads, None, 0.0, dense_small=1024) == {"w": "topk", "b": "dense", "c": "topk"}
    assert C.plan(grads, None, 0.0) == {"w": "topk", "b": "topk", "c": "topk"}


def test_split_messages_equal_one_message():
    # the sharder's path: one message per owner, same step, same plan, same sampled draws
    cfg = C.CompressionConfig(**{**C.PRESETS["aggressive"].__dict__, "dense_small": 600,
                                 "warmup_steps": 2})
    one, split = C.Compressor(cfg, seed=3), C.Compressor(cfg, seed=3)
    gen = torch.Generator().manual_seed(0)
    for step in range(3):
        g = {"a": torch.randn(5000, generator=gen), "b": torch.randn(500, generator=gen),
             "c": torch.randn(3000, generator=gen), "d": torch.randn(7, generator=gen)}
        whole = C.decode_message(one.encode(g))
        parts = split.encode_split(g, [["c", "a"], [], ["d", "b"]])
        assert parts[1] == b""                                             # nothing to send
        merged = {**C.decode_message(parts[0]), **C.decode_message(parts[2])}
        assert set(merged) == set(whole)
        for name in whole:
            assert torch.equal(merged[name], whole[name]), (step, name)
        for name in one.residual:
            assert torch.equal(split.residual[name], one.residual[name])
    assert split.step == one.step == 3
    assert split.stats["comm/messages"] == 6 and one.stats["comm/messages"] == 3
    # split messages carry one header more: bytes differ by exactly that, 12 header + 4 crc
    assert split.stats["comm/bytes"] == one.stats["comm/bytes"] + 3 * 16
    with pytest.raises(ValueError, match="group 1 names 'a', which is in another group too"):
        split.encode_split(g, [["a", "b"], ["a", "c", "d"]])
    with pytest.raises(ValueError, match="group 0 names 'z', which is not a gradient"):
        split.encode_split(g, [["z"]])
    with pytest.raises(ValueError, match=r"tensors in no group: \['d'\]"):
        split.encode_split(g, [["a", "b", "c"]])


# --------------------------------------------------------------------------- wire format

def _resign(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


def test_wire_rejects_foreign_version_and_checksum():
    payload = C.Compressor().encode(grads())
    with pytest.raises(WireError, match="magic b'PK\\\\x03\\\\x04'"):
        C.decode_message(b"PK\x03\x04" + payload[4:])
    with pytest.raises(WireError, match="version 3 is not supported"):
        C.decode_message(_resign(payload[:4] + b"\x03" + payload[5:-4]))
    with pytest.raises(WireError, match="checksum mismatch"):
        C.decode_message(payload[:-5] + bytes([payload[-5] ^ 1]) + payload[-4:])
    with pytest.raises(WireError, match="shorter than"):
        C.decode_message(b"GLCP")


@FAST
@given(data=st.data())
def test_any_corruption_or_truncation_is_a_wire_error(data):
    payload = bytearray(C.Compressor().encode(grads(data.draw(st.integers(0, 100)))))
    if data.draw(st.booleans()):
        cut = data.draw(st.integers(0, len(payload) - 1))
        with pytest.raises(WireError):
            C.decode_message(bytes(payload[:cut]))
    else:
        pos = data.draw(st.integers(0, len(payload) - 1))
        payload[pos] ^= data.draw(st.integers(1, 255))
        with pytest.raises(WireError):
            C.decode_message(bytes(payload))


@FAST
@given(data=st.data())
def test_corruption_behind_a_valid_checksum_is_still_caught_or_harmless(data):
    """Bytes re-signed after a flip: every field check must hold without the CRC's help."""
    g = grads(1)
    body = bytearray(C.Compressor().encode(g)[:-4])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(body) - 1))
        body[pos] ^= data.draw(st.integers(1, 255))
    try:
        out = C.decode_message(_resign(bytes(body)))
    except WireError:
        return
    # a flip the fields cannot see (a value byte, a name letter) decodes: into float32 tensors
    assert all(t.dtype == torch.float32 for t in out.values()) and len(out) <= len(g)


def test_codec_errors_surface_as_wire_errors_naming_the_tensor():
    rec = wire.TensorRecord("w", "topk", "fp32", "rice", (10,), 0, np.zeros(0, np.float32), 2,
                            b"\0" * 8, b"\x02\0\0\0\x05\x04")              # rice payload cut short
    with pytest.raises(WireError, match="tensor 'w'"):
        C.decode_message(wire.pack([rec]))


def test_trace_step_measures_real_bytes():
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    tr = C.trace_step(x, None, 0.05, "e4m3", "rice")
    assert tr["k"] == round(0.05 * 2048) == int(tr["mask"].sum())
    assert tr["topk_bytes"] == 16 + 26 + 1 + 8 + 4 * tr["k"] + tr["index_bytes"]
    assert tr["fp8_bytes"] == 16 + 26 + 1 + 8 + 4 + 2048
    torch.testing.assert_close(tr["sent"] + tr["residual"], x, rtol=0, atol=0)


@pytest.mark.parametrize("block", [2 ** 27, 2 ** 31 - 1])
def test_a_peer_block_far_past_the_tensor_decodes_as_one_block(block):
    """A valid message whose FP8 block field is 2**27 made the decoder pad 10 codes to 2**27
    (42.8 s, 1.44 GB); a block past the tensor is one scale over the tensor, decoded in n."""
    import time
    from grpo_lab.distributed.wire import TensorRecord
    x = torch.linspace(-1, 1, 10)
    codes, scales = C.fp8_quantize(x, "e4m3", 0)
    msg = wire.pack([TensorRecord("x", "dense", "e4m3", None, (10,), block, scales.numpy(), 10,
                                  codes.numpy().tobytes(), b"")], step=1)
    sane = wire.pack([TensorRecord("x", "dense", "e4m3", None, (10,), 10, scales.numpy(), 10,
                                   codes.numpy().tobytes(), b"")], step=1)
    t0 = time.perf_counter()
    C.decode_message(sane)                    # the calibration: the same tensor, block 10, now
    sane_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = C.decode_message(msg)["x"]
    assert time.perf_counter() - t0 < 0.5 + 100 * sane_s      # padding to 2**27 took 42.8 s
    assert torch.equal(out, C.fp8_dequantize(codes, scales, "e4m3", 0))
    # and the encoder's view of the same: a block larger than the tensor is one block
    c2, s2 = C.fp8_quantize(x, "e4m3", 64)
    assert torch.equal(c2, codes) and torch.equal(s2, scales)


@pytest.mark.parametrize("preset", ["dgc", "aggressive"])
def test_a_nan_gradient_is_refused_by_the_sampled_top_k_not_kept_unsent(preset):
    # a sampled threshold passes no NaN: it stayed in the residual, unsent and unreported
    # (dgc decoded [nan, 1] as [0, 0]), and a NaN in the probe made the threshold NaN
    w = torch.ones(2000)
    w[7] = float("nan")
    with pytest.raises(ValueError, match="gradient 'w': top-k met 1 non-finite values "
                                         "\\(residual included\\), the first at position 7"):
        C.Compressor(preset).encode({"w": w})
    with pytest.raises(ValueError, match="top-k met 1 non-finite values .* position 0"):
        C.sparsify(torch.tensor([float("nan"), 1.0]), torch.zeros(2), None, 1, "sampled")
