"""Fault injection (issue 10): every bad input or corrupted byte gets a clear error naming the
value, or the documented correct result worked out by hand; nothing non-finite is written.

Library level only: advantages, loss, rewards, the wire decoder, checkpoint files and strict
loading. (Resume semantics, checks after each optimizer step and CLI parsing live with the
trainer and CLI tests.)
"""
import json
import random
import struct
import zlib

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from grpo_lab.algorithm.advantages import ADVANTAGES, process_advantages
from grpo_lab.checkpoint import (CHECKSUM_KEY, CheckpointError, add_checksum, atomic_save_tensors,
                                 content_checksum, load_state_strict, read_tensors)
from grpo_lab.distributed import codecs, compression as C, wire
from grpo_lab.distributed.wire import TensorRecord, WireError
from grpo_lab.algorithm.loss import KL, Clip, grpo_loss
from grpo_lab.policies.model import FORMAT_TAG, GPT, GPTConfig, load_policy, save_policy
from grpo_lab.tasks.rewards import REWARDS, accuracy_reward, resolve_rewards, weighted_reward
from grpo_lab.tasks import Example

T = torch.tensor
NAN, INF = float("nan"), float("inf")
ONE_GROUP = torch.zeros(4, dtype=torch.long)


# =========================================================================== advantages

# rewards [1, 0, 0, 0]: mean 0.25, centred [0.75, -0.25, -0.25, -0.25];
# sample std sqrt((0.5625 + 3 * 0.0625) / 3) = sqrt(0.25) = 0.5
INT_EXPECTED = {
    "grpo": [0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001],   # eps = 1e-4
    "dr_grpo": [0.75, -0.25, -0.25, -0.25],
    "rloo": [1.0, -1 / 3, -1 / 3, -1 / 3],              # 1 - 0, 0 - 1/3
    "rank": [1.0, -1 / 3, -1 / 3, -1 / 3],              # ranks 4 and 2 (ties: mean of 1, 2, 3)
    "batch_std": [0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001],  # batch std 0.5
    "mean_centred": [0.75, -0.25, -0.25, -0.25],
    # one token per completion (no lengths): token mean 0, var 0.75 / 3 = 0.25, + 1e-8
    "reinforce_pp_baseline": [x / (0.25 + 1e-8) ** 0.5 for x in (0.75, -0.25, -0.25, -0.25)],
}


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
@pytest.mark.parametrize("rewards", [T([1, 0, 0, 0]), [1, 0, 0, 0], np.array([1, 0, 0, 0]),
                                     T([True, False, False, False]), [1.0, 0.0, 0.0, 0.0]],
                         ids=["int_tensor", "int_list", "int_numpy", "bool", "float_list"])
def test_integer_list_numpy_rewards_give_float_advantages(name, rewards):
    adv = ADVANTAGES[name](rewards, ONE_GROUP)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, T(INT_EXPECTED[name]), rtol=0, atol=1e-7)


def test_grpo_of_integer_rewards_by_hand():
    # the example: 0.75 / (0.5 + 1e-4) = 1.4997001, -0.25 / 0.5001 = -0.4999000
    adv = ADVANTAGES["grpo"](T([1, 0, 0, 0]), torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(adv, T([1.4997001, -0.4999000, -0.4999000, -0.4999000]),
                               rtol=0, atol=1e-7)
    assert ADVANTAGES["grpo"](np.array([1.0, 0.0]), np.array([3, 3])).dtype == torch.float64


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_non_finite_rewards_name_the_sample(name):
    with pytest.raises(ValueError, match=r"reward of sample 2 is nan \(1 non-finite"):
        ADVANTAGES[name]([0.0, 1.0, NAN, 1.0], ONE_GROUP)
    with pytest.raises(ValueError, match=r"reward of sample 1 is -inf \(2 non-finite"):
        ADVANTAGES[name](np.array([0.0, -INF, INF, 1.0]), ONE_GROUP)


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_bad_group_ids(name):
    with pytest.raises(ValueError, match="group_ids must be integers, got dtype torch.float32"):
        ADVANTAGES[name]([1.0, 0.0], T([0.0, 0.0]))
    with pytest.raises(ValueError, match="group_ids must be integers, got dtype torch.bool"):
        ADVANTAGES[name]([1.0, 0.0], T([True, True]))
    with pytest.raises(ValueError, match=r"got shapes \(2,\) and \(3,\)"):
        ADVANTAGES[name]([1.0, 0.0], [0, 0, 0])
    with pytest.raises(ValueError, match="no rewards"):
        ADVANTAGES[name]([], torch.zeros(0, dtype=torch.long))


def test_rloo_near_float32_max_is_exact_or_a_clear_error():
    # [3e38, 0, 0, 0]: r_0 - mean(0, 0, 0) = 3e38; r_1 - (3e38 + 0 + 0) / 3 = -1e38 (fits)
    adv = ADVANTAGES["rloo"](T([3e38, 0.0, 0.0, 0.0]), ONE_GROUP)
    torch.testing.assert_close(adv, T([3e38, -1e38, -1e38, -1e38]), rtol=1e-7, atol=0)
    # [-3e38, 3e38]: -3e38 - 3e38 = -6e38, past float32's 3.4028e38: an error, not -inf
    with pytest.raises(ValueError, match=r"rloo advantage of sample 0 is -6e\+38, beyond "
                                         r"torch.float32's range"):
        ADVANTAGES["rloo"](T([-3e38, 3e38]), T([0, 0]))
    # the same rewards in float64 give the exact answer
    adv = ADVANTAGES["rloo"](T([-3e38, 3e38], dtype=torch.float64), T([0, 0]))
    assert adv.tolist() == [-6e38, 6e38]
    # every estimator stays finite on rewards of that size that it can represent
    for name, fn in ADVANTAGES.items():
        assert torch.isfinite(fn(T([3e38, 0.0, 0.0, 0.0]), ONE_GROUP)).all(), name


def test_process_advantages_coerce_and_ignore_padding():
    # integer steps, padding holding NaN: the same result as zeros there
    mask = T([[True, True, False], [True, True, True]])
    steps = T([[1, 0, 0], [1, 1, 0]])
    nan_pad = T([[1.0, 0.0, NAN], [1.0, 1.0, 0.0]])
    want = process_advantages(steps.float(), mask, T([3, 3]))
    torch.testing.assert_close(process_advantages(steps, mask, T([3, 3])), want, rtol=0, atol=0)
    torch.testing.assert_close(process_advantages(nan_pad, mask, [3, 3]), want, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"step reward of sample 1, token 0 is inf"):
        process_advantages(T([[1.0, 0.0, 0.0], [INF, 1.0, 0.0]]), mask, T([3, 3]))


# =========================================================================== loss

# as tests/test_loss.py: ratios [[1.5, 1.1], [0.5, *]], A = [+1, -1], eps 0.2 / 0.28
RATIO = T([[1.5, 1.1], [0.5, 0.9]])
MASK = T([[True, True], [True, False]])
SEQ_MEAN = ((-1.28 - 1.1) / 2 + 0.8) / 2                                 # -0.195


def loss_of(logp, adv=T([1.0, -1.0]), old=None, ref=None, beta=0.0):
    return grpo_loss(logp, torch.zeros(2, 2) if old is None else old, adv, MASK, Clip(0.2, 0.28),
                     KL(beta), ref_logp=ref)


@pytest.mark.parametrize("adv", [[1, -1], np.array([1, -1]), T([1, -1]), (1.0, -1.0)],
                         ids=["int_list", "int_numpy", "int_tensor", "float_tuple"])
def test_loss_accepts_int_list_numpy_advantages(adv):
    loss, _ = loss_of(RATIO.log(), adv)
    assert loss.item() == pytest.approx(SEQ_MEAN, abs=1e-6)


@pytest.mark.parametrize("pad", [NAN, -INF, INF])
def test_nan_and_inf_on_padding_never_reach_the_loss(pad):
    logp = RATIO.log().clone()
    logp[1, 1] = pad                                                     # under the mask
    logp.requires_grad_(True)
    old = T([[0.0, 0.0], [0.0, pad]])
    ref = T([[0.0, 0.0], [0.0, pad]])
    loss, stats = loss_of(logp, old=old, ref=ref, beta=0.0)
    assert loss.item() == pytest.approx(SEQ_MEAN, abs=1e-6)
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[1, 1] == 0
    # with a KL term: ref = logp on real tokens -> KL 0, the loss is unchanged
    loss, stats = loss_of(logp.detach(), old=old, ref=torch.where(MASK, logp.detach(), pad),
                          beta=0.1)
    assert loss.item() == pytest.approx(SEQ_MEAN, abs=1e-6) and stats["loss/kl"] == 0
    # process advantages (N, T): NaN on padding is never read either
    loss, _ = loss_of(logp.detach(), T([[1.0, 1.0], [-1.0, NAN]]))
    assert loss.item() == pytest.approx(SEQ_MEAN, abs=1e-6)


def test_loss_rejects_bad_values_naming_them():
    z = torch.zeros(2, 2)
    with pytest.raises(ValueError, match=r"no completions to score: logp has shape \(0, 2\)"):
        grpo_loss(torch.zeros(0, 2), torch.zeros(0, 2), torch.zeros(0),
                  torch.zeros(0, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"advantage of sample 1 is nan"):
        grpo_loss(z, z, T([1.0, NAN]), MASK)
    with pytest.raises(ValueError, match=r"advantage of sample 0 is -inf"):
        grpo_loss(z, z, [-INF, 1.0], MASK)
    with pytest.raises(ValueError, match=r"advantage of sample 1, token 0 is nan"):
        grpo_loss(z, z, T([[1.0, 1.0], [NAN, 0.0]]), MASK)
    with pytest.raises(ValueError, match=r"old_logp of sample 0, token 1 is nan"):
        grpo_loss(z, T([[0.0, NAN], [0.0, 0.0]]), T([1.0, -1.0]), MASK)
    with pytest.raises(ValueError, match=r"logp of sample 1, token 0 is -inf"):
        grpo_loss(T([[0.0, 0.0], [-INF, 0.0]]), z, T([1.0, -1.0]), MASK)
    with pytest.raises(ValueError, match=r"ref_logp of sample 0, token 0 is nan"):
        grpo_loss(z, z, T([1.0, -1.0]), MASK, kl=KL(0.1), ref_logp=T([[NAN, 0.0], [0.0, 0.0]]))


@pytest.mark.parametrize("kw,message", [
    ({"kl": KL(NAN)}, r"kl\.beta must be finite and >= 0, got nan"),
    ({"kl": KL(INF)}, r"kl\.beta must be finite and >= 0, got inf"),
    ({"kl": KL(-0.1)}, r"kl\.beta must be finite and >= 0, got -0.1"),
    ({"clip": Clip(eps_low=1.0)}, r"eps_low must be finite and in \[0, 1\), got 1.0"),
    ({"clip": Clip(eps_low=1.5)}, r"eps_low must be finite and in \[0, 1\), got 1.5"),
    ({"clip": Clip(eps_low=-0.2)}, r"eps_low must be finite and in \[0, 1\), got -0.2"),
    ({"clip": Clip(eps_high=-0.1)}, r"eps_high must be finite and >= 0, got -0.1"),
    ({"clip": Clip(eps_high=INF)}, r"eps_high must be finite and >= 0, got inf"),
    ({"clip": Clip(eps_high="0.2")}, r"eps_high must be a number, got '0.2'"),
    ({"max_len": 0}, r"max_len must be a positive int \(the dr_grpo normaliser\), got 0"),
])
def test_loss_ranges(kw, message):
    z = torch.zeros(2, 2)
    with pytest.raises(ValueError, match=message):
        grpo_loss(z, z, T([1.0, -1.0]), MASK, ref_logp=z, **kw)


def reference_loss(logp, old_logp, ref_logp, adv, mask, eps_low, eps_high, beta, agg, max_len):
    """grpo_loss as it was before the input checks: padding multiplied by the mask."""
    from grpo_lab.algorithm.loss import AGGREGATIONS
    mask = mask.to(logp.dtype)
    A = adv[:, None] if adv.dim() == 1 else adv
    ratio = torch.exp(logp - old_logp)
    per_tok = -torch.min(ratio * A, ratio.clamp(1 - eps_low, 1 + eps_high) * A)
    if beta != 0:
        d = ref_logp - logp
        per_tok = per_tok + beta * (torch.exp(d) - d - 1)
    return AGGREGATIONS[agg](per_tok, mask, max_len)


@pytest.mark.parametrize("seed", range(4))
def test_loss_on_valid_inputs_is_bit_identical_to_the_unchecked_one(seed):
    from grpo_lab.algorithm.loss import AGGREGATIONS
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(8, 7, generator=g) * 3                              # (N, T)
    old, ref = (logp + torch.randn(8, 7, generator=g) * 0.3 for _ in range(2))
    mask = torch.rand(8, 7, generator=g) > 0.3
    for adv in [torch.randn(8, generator=g), torch.randn(8, 7, generator=g)]:
        for agg in AGGREGATIONS:
            for beta in (0.0, 0.04):
                loss, _ = grpo_loss(logp, old, adv, mask, Clip(0.2, 0.28), KL(beta), aggregation=agg,
                                    max_len=9, ref_logp=ref)
                want = reference_loss(logp, old, ref, adv, mask, 0.2, 0.28, beta, agg, 9)
                assert loss.item() == want.item(), (agg, beta, adv.dim())


# =========================================================================== rewards

EX = [Example("12+34=", "46", "addition")] * 2


def test_rewards_reject_bad_inputs(monkeypatch):
    with pytest.raises(ValueError, match="2 completions, 2 examples and 1 stopped flags"):
        accuracy_reward(["46", "47"], EX, [True])
    with pytest.raises(ValueError, match="2 completions, 2 examples and 3 stopped flags"):
        weighted_reward(["46", "47"], EX, resolve_rewards({"accuracy": 1.0}), [True] * 3)
    with pytest.raises(ValueError, match=r"reward weight 'accuracy' must be a finite number, "
                                         r"got inf"):
        weighted_reward(["46", "47"], EX, resolve_rewards({"accuracy": INF}))
    with pytest.raises(ValueError, match=r"reward weight 'partial' must be a finite number, "
                                         r"got nan"):
        weighted_reward(["46", "47"], EX, resolve_rewards({"accuracy": 1.0, "partial": NAN}))
    with pytest.raises(ValueError, match=r"weighted reward of sample 0 is inf"):
        weighted_reward(["46", "47"], EX, resolve_rewards({"accuracy": 3e38, "partial": 3e38}))
    monkeypatch.setitem(REWARDS, "broken", lambda c, e, s: [None, 1.0])
    with pytest.raises(ValueError, match=r"reward function 'broken' returned None for sample 0 "
                                         r"\(completion '46'\), not a number"):
        weighted_reward(["46", "47"], EX, resolve_rewards({"broken": 1.0}))
    monkeypatch.setitem(REWARDS, "ints", lambda c, e, s: [1, 0])      # ints -> float32
    total, parts = weighted_reward(["46", "47"], EX, resolve_rewards({"ints": 2}))
    assert total.tolist() == [2.0, 0.0] and parts["ints"].dtype == torch.float32


# =========================================================================== wire decoder

EMPTY = np.zeros(0, np.float32)


def dense(fmt, values: bytes, n, scales=EMPTY, block=0):
    return TensorRecord("w", "dense", fmt, None, (n,), block, np.asarray(scales, np.float32),
                        n, values, b"")


POISONED = {
    "fp32_nan": (dense("fp32", np.array([1.0, NAN, 2.0], "<f4").tobytes(), 3),
                 "value 1 decodes to nan"),
    "fp32_inf": (dense("fp32", np.array([1.0, 2.0, -INF], "<f4").tobytes(), 3),
                 "value 2 decodes to -inf"),
    "fp16_inf": (dense("fp16", np.array([INF, 1.0], "<f2").tobytes(), 2), "value 0 decodes to inf"),
    "bf16_nan": (dense("bf16", struct.pack("<2H", 0x3F80, 0x7FC0), 2), "value 1 decodes to nan"),
    # e4m3 code 0x7F = S.1111.111 is NaN; e5m2 code 0x7C = 0.11111.00 is +inf
    "e4m3_nan": (dense("e4m3", bytes([0x38, 0x7F]), 2, [1.0]), "value 1 decodes to nan"),
    "e5m2_inf": (dense("e5m2", bytes([0x7C, 0x3C]), 2, [1.0]), "value 0 decodes to inf"),
    # e4m3 0x7E = 448 (largest finite) times a scale of 1e36 = 4.48e38 > float32 max 3.40e38
    "e4m3_overflow": (dense("e4m3", bytes([0x38, 0x7E]), 2, [1e36]), "value 1 decodes to inf"),
    "topk_nan": (TensorRecord("w", "topk", "fp32", "raw_int32", (10,), 0, EMPTY, 2,
                              np.array([0.5, NAN], "<f4").tobytes(),
                              codecs.get_codec("raw_int32").encode(np.array([3, 7]), 10)),
                 "value 1 decodes to nan"),
}


@pytest.mark.parametrize("case", sorted(POISONED))
def test_wire_rejects_non_finite_values_behind_a_valid_crc(case):
    record, message = POISONED[case]
    payload = wire.pack([record])                                          # CRC of the poison
    with pytest.raises(WireError, match=f"tensor 'w': {message}"):
        wire.unpack(payload)
    with pytest.raises(WireError, match=f"tensor 'w': {message}"):
        C.decode_message(payload)


def test_wire_nan_planted_in_an_honest_message_and_resigned():
    g = {"w": torch.tensor([0.5, -1.25, 3.0, 7.0])}
    payload = C.Compressor("fp32").encode(g)
    assert torch.equal(C.decode_message(payload)["w"], g["w"])           # fp32: lossless
    body = bytearray(payload[:-4])
    at = body.find(struct.pack("<f", 3.0))                                 # value 2's bytes
    body[at:at + 4] = struct.pack("<f", NAN)
    resigned = bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))
    with pytest.raises(WireError, match="tensor 'w': value 2 decodes to nan in fp32"):
        C.decode_message(resigned)
    with pytest.raises(WireError, match="checksum mismatch"):              # not re-signed
        C.decode_message(bytes(body) + payload[-4:])


def test_wire_edges_that_stay_finite_decode():
    # 448 x (3.4e38 / 448): the largest e4m3 code times the largest usable scale is finite
    rec = dense("e4m3", bytes([0x7E, 0xFE]), 2, [3.4e38 / 448])
    out = C.decode_message(wire.pack([rec]))["w"]
    assert torch.isfinite(out).all() and out[0] == -out[1]
    for fmt, dtype in [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)]:
        torch.testing.assert_close(torch.from_numpy(wire.fp8_table(fmt)),
                                   torch.arange(256, dtype=torch.uint8).view(dtype).float(),
                                   rtol=0, atol=0, equal_nan=True)


# =========================================================================== checkpoints

@pytest.fixture
def small_policy():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8))


def test_checksum_round_trip_and_shipped_files_carry_one(tmp_path, small_policy):
    save_policy(small_policy, tmp_path / "p.safetensors")
    tensors, meta = read_tensors(tmp_path / "p.safetensors")
    assert CHECKSUM_KEY not in meta and meta["format"] == FORMAT_TAG
    for path in ["data/base_policy.safetensors", "data/base_mixture.safetensors"]:
        with safe_open(path, "pt") as f:
            saved = f.metadata()[CHECKSUM_KEY]
        tensors, meta = read_tensors(path)
        assert saved == content_checksum(tensors, meta)


def test_every_bit_flip_is_detected(tmp_path, small_policy):
    """400 random single-bit flips, half in the JSON header, half in the tensor bytes: each
    is a CheckpointError (a checksum mismatch, or an unreadable / unsigned header)."""
    path = tmp_path / "p.safetensors"
    save_policy(small_policy, path)
    data = path.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    rng, kinds = random.Random(0), {}
    for trial in range(400):
        pos = rng.randrange(header) if trial % 2 == 0 else rng.randrange(header, len(data))
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        (tmp_path / "f.safetensors").write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError) as err:
            load_policy(tmp_path / "f.safetensors")
        msg = str(err.value)
        kind = ("mismatch" if "does not match" in msg else "unreadable" if "not a readable" in msg
                else "unsigned" if "no content checksum" in msg else msg)
        kinds[kind] = kinds.get(kind, 0) + 1
        if pos >= header:                                                  # tensor bytes
            assert kind == "mismatch" and str(tmp_path / "f.safetensors") in msg
    assert set(kinds) <= {"mismatch", "unreadable", "unsigned"}, kinds
    assert sum(kinds.values()) == 400


def test_non_finite_tensors_are_never_written(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    atomic_save_tensors({"a": torch.ones(3), "b": torch.zeros(2)}, path, {"format": "grpo_lab.x"})
    before = path.read_bytes()
    for bad in [NAN, INF, -INF]:
        with pytest.raises(FloatingPointError, match=rf"tensor 'b' holds 1 non-finite values "
                                                     rf"\(first: {bad} at flat index 1\)"):
            atomic_save_tensors({"a": torch.ones(3), "b": T([0.0, bad])}, path,
                                {"format": "grpo_lab.x"})
        assert path.read_bytes() == before                                 # byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.safetensors"]   # no debris
    with pytest.raises(FloatingPointError, match="'optim.0.exp_avg_sq'"):
        atomic_save_tensors({"optim.0.exp_avg_sq": T([[1.0, NAN]], dtype=torch.bfloat16)},
                            path, {})
    assert path.read_bytes() == before


def test_a_crash_mid_write_leaves_the_previous_file(tmp_path, monkeypatch):
    import grpo_lab.checkpoint as ck
    path = tmp_path / "ckpt.safetensors"
    atomic_save_tensors({"a": torch.ones(3)}, path, {"format": "grpo_lab.x"})
    before = path.read_bytes()

    def die(tensors, filename, metadata):
        open(filename, "wb").write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(ck, "save_file", die)
    with pytest.raises(KeyboardInterrupt):
        atomic_save_tensors({"a": torch.zeros(3)}, path, {"format": "grpo_lab.x"})
    assert path.read_bytes() == before and len(list(tmp_path.iterdir())) == 1


def test_unsigned_non_finite_and_foreign_files(tmp_path):
    ours = {"format": "grpo_lab.x", "step": "3"}
    save_file({"a": torch.ones(2)}, str(tmp_path / "old.safetensors"), ours)     # pre-checksum
    with pytest.raises(CheckpointError, match=r"old.safetensors has no content checksum .*"
                                              r"grpo_lab.checkpoint.add_checksum\("):
        read_tensors(tmp_path / "old.safetensors")
    assert read_tensors(tmp_path / "old.safetensors", allow_unsigned=True)[1] == ours
    add_checksum(tmp_path / "old.safetensors")
    tensors, meta = read_tensors(tmp_path / "old.safetensors")
    assert meta == ours and torch.equal(tensors["a"], torch.ones(2))
    # a NaN that slipped past the writer (signed by hand) is refused on read
    bad = {"a": T([1.0, NAN])}
    save_file(bad, str(tmp_path / "nan.safetensors"),
              {**ours, CHECKSUM_KEY: content_checksum(bad, ours)})
    with pytest.raises(CheckpointError, match=r"nan.safetensors: tensor 'a' holds 1 non-finite"):
        read_tensors(tmp_path / "nan.safetensors")
    # metadata is covered: an edited config (lr 1e-4 -> 1e-3) fails the checksum
    atomic_save_tensors({"a": torch.ones(2)}, tmp_path / "c.safetensors",
                        {"format": "grpo_lab.x", "config": json.dumps({"lr": 1e-4})})
    data = (tmp_path / "c.safetensors").read_bytes()
    (tmp_path / "c.safetensors").write_bytes(data.replace(b"0.0001", b"0.0010"))
    with pytest.raises(CheckpointError, match=r"c.safetensors is corrupt: content checksum"):
        read_tensors(tmp_path / "c.safetensors")
    # foreign files (no grpo_lab tag) are read, and refused by the policy loader by their tag
    save_file({"w": torch.zeros(2)}, str(tmp_path / "other.safetensors"), {"format": "someone"})
    with pytest.raises(ValueError, match="not a grpo_lab policy file"):
        load_policy(tmp_path / "other.safetensors")


def test_policy_loading_is_strict(tmp_path, small_policy):
    state = {k: v for k, v in small_policy.state_dict().items() if k != "lm_head.weight"}
    meta = {"format": FORMAT_TAG, "config": json.dumps(vars(small_policy.cfg))}
    cases = {
        "missing": ({k: v for k, v in state.items() if k != "blocks.0.attn.qkv.weight"},
                    r"1 missing \['blocks.0.attn.qkv.weight'\]"),
        "unexpected": ({**state, "blocks.9.mlp.weight": torch.zeros(2)},
                       r"1 unexpected \['blocks.9.mlp.weight'\]"),
        "shape": ({**state, "wpe.weight": torch.zeros(9, 16)},
                  r"1 of another shape \['wpe.weight: file \(9, 16\) vs module \(8, 16\)'\]"),
    }
    for name, (tensors, message) in cases.items():
        atomic_save_tensors(tensors, tmp_path / f"{name}.safetensors", meta)
        with pytest.raises(CheckpointError, match=rf"{name}.safetensors does not fit the GPT: "
                                                  rf"{message}"):
            load_policy(tmp_path / f"{name}.safetensors")
    atomic_save_tensors(state, tmp_path / "cfg.safetensors", {**meta, "config": '{"n_layer": 0}'})
    with pytest.raises(CheckpointError, match=r"metadata 'config' is not a policy config: "
                                              r"ValueError: GPTConfig.n_layer must be positive"):
        load_policy(tmp_path / "cfg.safetensors")


def test_load_state_strict_with_a_prefix_leaves_the_module_untouched_on_error(small_policy):
    """The trainer's helper: a training checkpoint keeps the policy under ``policy.``."""
    torch.manual_seed(1)
    other = GPT(small_policy.cfg)
    tensors = {f"policy.{k}": v for k, v in small_policy.state_dict().items()
               if k != "lm_head.weight"}
    tensors["optim.0.exp_avg"] = torch.zeros(3)                           # not under the prefix
    before = {k: v.clone() for k, v in other.state_dict().items()}
    broken = {k: v for k, v in tensors.items() if k != "policy.ln_f.bias"}
    with pytest.raises(CheckpointError, match=r"ckpt does not fit the GPT: 1 missing "
                                              r"\['policy.ln_f.bias'\]"):
        load_state_strict(other, broken, "ckpt", prefix="policy.")
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())
    load_state_strict(other, tensors, "ckpt", prefix="policy.")
    for k, v in small_policy.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k
    assert other.lm_head.weight is other.wte.weight                        # tying survives
    with pytest.raises(CheckpointError, match=r"17 missing"):             # nothing under prefix
        load_state_strict(other, tensors, "ckpt", prefix="policy_")


@pytest.mark.parametrize("field, value, said", [
    ("step", "x", "metadata 'step' is not valid: ValueError: invalid literal for int()"),
    ("history", "[{", "metadata 'history' is not valid: JSONDecodeError"),
    ("history", "{}", "metadata 'history' is a dict, not a list"),
    ("config", None, "metadata 'config' is missing"),
    ("model_config", "7", "metadata 'model_config' is a int, not a dict"),
    ("param_groups", "null", "metadata 'param_groups' is a NoneType, not a list"),
    ("step", "-5", "metadata 'step' is -5, not a step (0 or more)"),       # ran steps -4, -3, ...
    ("grpo_lab.shards", "{}", "metadata 'grpo_lab.shards' is not {\"dir\": folder, "     # KeyError
                              "\"files\": {name: sha256}}: {}"),
])
def test_a_forged_training_checkpoint_names_the_file_and_the_field(tmp_path, capsys, field,
                                                                    value, said):
    """A header edited and signed again gave a bare ValueError / JSONDecodeError / KeyError
    naming neither the file nor the field."""
    from grpo_lab.checkpoint import CKPT_TAG, read_training_checkpoint
    from grpo_lab.cli import main
    meta = {"format": CKPT_TAG, "step": "3", "config": "{}", "history": "[]",
            "model_config": "{}", "param_groups": "[]", field: value}
    path = tmp_path / "forged.safetensors"
    atomic_save_tensors({"policy.w": torch.zeros(2)}, path,
                        {k: v for k, v in meta.items() if v is not None})
    with pytest.raises(CheckpointError) as e:
        read_training_checkpoint(path)
    assert str(e.value).startswith(f"{path}: {said}"), str(e.value)


@pytest.mark.parametrize("tensors, said", [
    ({"optim.x.exp_avg": torch.zeros(2)},                                 # int('x'): ValueError
     "tensor 'optim.x.exp_avg' is not named optim.<parameter index>.<state name>"),
    ({"optim.3": torch.zeros(2)},                                         # unpacking: ValueError
     "tensor 'optim.3' is not named optim.<parameter index>.<state name>"),
    ({"optim.0.step": T(1.0), "optim.0.exp_avg": torch.zeros(2),
      "optim.0.exp_avg_sq": torch.zeros(2),
      "optim.1.step": T(1.0), "optim.1.exp_avg_sq": torch.zeros(2)},     # KeyError at step 1
     "the optimizer state of parameter 1 holds ['exp_avg_sq', 'step'], the others "
     "['exp_avg', 'exp_avg_sq', 'step']"),
])
def test_a_forged_optimizer_state_names_the_file_and_the_tensor(tmp_path, tensors, said):
    """Tensors renamed or dropped in a header signed again: a bare ValueError from the
    loader, or a KeyError from inside AdamW's first step after the resume."""
    from grpo_lab.checkpoint import CKPT_TAG, read_training_checkpoint
    path = tmp_path / "forged.safetensors"
    atomic_save_tensors({"policy.w": torch.zeros(2), **tensors}, path,
                        {"format": CKPT_TAG, "step": "3", "config": "{}", "history": "[]",
                         "model_config": "{}", "param_groups": "[]"})
    with pytest.raises(CheckpointError) as e:
        read_training_checkpoint(path)
    assert str(e.value) == f"{path}: {said}", str(e.value)


@pytest.mark.parametrize("config, said", [
    ("[1", "metadata 'config' is not valid: JSONDecodeError"),
    ('{"steps": "many"}', "metadata 'config' is not a run's config"),
])
def test_eval_of_a_forged_checkpoint_names_the_file_and_the_field(tmp_path, capsys, config,
                                                                   said):
    from grpo_lab.checkpoint import CKPT_TAG
    from grpo_lab.cli import main
    path = tmp_path / "forged.safetensors"
    atomic_save_tensors({"policy.w": torch.zeros(2)}, path,
                        {"format": CKPT_TAG, "step": "3", "config": config, "history": "[]",
                         "model_config": "{}", "param_groups": "[]"})
    assert main(["eval", "--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {said}" in err, err
