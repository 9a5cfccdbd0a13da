"""Data-parallel training on 2 gloo processes (one spawn for every case) against single-process
training on the full batch, and the bytes each exchange counts against hand-computed values.

Byte convention (train_dist's docstring): ``comm/bytes`` is what one rank sends per step under
the collective's bandwidth-optimal algorithm; at 2 ranks a ring all_reduce of b bytes sends
2 (N-1)/N b = b, so fp32 all_reduce is 4 B x numel per rank per step.
"""
import pytest
import torch

from grpo_lab.distributed import wire
from grpo_lab.distributed.exchanges import EXCHANGES
from grpo_lab.distributed.shard_plan import assign, default_max_shard_numel, make_shards
from grpo_lab.distributed.train_dist import DistConfig, make_policy, run_all, summary, train

WORLD, STEPS = 2, 3
# eps=1e-6 as in tests/test_sharder.py: the attention key bias has an exactly-zero true
# gradient, so its computed gradient is rounding noise that differs between a full-batch and
# a split backward, and Adam divides it by eps. Adam's first steps move each weight by about
# lr * g / (|g| + eps): rounding in a tiny g is amplified in proportion to lr, so lr=1e-3.
TINY = dict(n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=8, steps=STEPS,
            lr=1e-3, eps=1e-6, eval_size=20)
CASES = {
    "allreduce": dict(exchange="allreduce"),
    "fp32": dict(exchange="compressed", preset="fp32"),
    "seed": dict(exchange="compressed", preset="seed"),
    "ddp_fp16": dict(exchange="ddp_fp16_hook"),
    "powersgd": dict(exchange="ddp_powersgd_hook", powersgd_rank=1, powersgd_start=2),
    "sharded": dict(exchange="sharded", policy="size_balanced"),
    "sharded_rr": dict(exchange="sharded", policy="importance_round_robin", importance="seed",
                       reshard_every=2),
    "grpo": dict(exchange="allreduce", objective="grpo", batch_size=4, group_size=4, steps=2),
    "sharded_fp32": dict(exchange="sharded_compressed", preset="fp32"),
    "sharded_seed_whole": dict(exchange="sharded_compressed", preset="seed", max_shard_numel=10**9),
    "sharded_aggressive_rr": dict(exchange="sharded_compressed", preset="aggressive",
                                  policy="importance_round_robin", importance="seed",
                                  reshard_every=2),
    "sharded_seed_both": dict(exchange="sharded_compressed", preset="seed",
                              broadcast_preset="seed"),
}


@pytest.fixture(scope="module")
def runs():
    cfgs = [DistConfig(**{**TINY, **case}) for case in CASES.values()]
    return dict(zip(CASES, run_all(cfgs, WORLD, run_timeout_s=240)))


@pytest.fixture(scope="module")
def single():
    return train(DistConfig(**TINY))                                       # in process, world 1


def _close(a, b, atol):
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=name)


def test_allreduce_equals_single_process_full_batch(runs, single):
    for rank in range(WORLD):
        _close(runs["allreduce"][rank]["params"], single["params"], atol=1e-6)
    init = make_policy(DistConfig(**TINY))
    moved = min(float((single["params"][n] - p.detach()).abs().max())
                for n, p in init.named_parameters())
    assert moved > 1e-4                                                    # 100x the tolerance
    # the loss each rank logs is its share: the two add up to the full-batch loss
    for step in range(STEPS):
        total = sum(runs["allreduce"][r]["history"][step]["train/loss"] for r in range(WORLD))
        assert total == pytest.approx(single["history"][step]["train/loss"], abs=1e-5)


def test_lossless_compression_equals_allreduce(runs):
    for rank in range(WORLD):
        _close(runs["fp32"][rank]["params"], runs["allreduce"][rank]["params"], atol=0)


def test_sharded_equals_allreduce_adamw(runs):
    for case in ("sharded", "sharded_rr"):
        for rank in range(WORLD):
            _close(runs[case][rank]["params"], runs["allreduce"][rank]["params"], atol=1e-6)


def test_sharder_with_lossless_compression_equals_sharder(runs):
    for rank in range(WORLD):
        _close(runs["sharded_fp32"][rank]["params"], runs["sharded"][rank]["params"], atol=0)


def test_sharder_with_whole_tensor_shards_equals_the_compressed_exchange(runs):
    # one shard per tensor: the same records as comm.compressed_all_reduce, averaged in rank
    # order, then the sharder's AdamW, line for line torch's: bitwise the same parameters
    for rank in range(WORLD):
        _close(runs["sharded_seed_whole"][rank]["params"], runs["seed"][rank]["params"], atol=0)


def test_every_rank_holds_the_same_params(runs):
    for case, res in runs.items():
        _close(res[1]["params"], res[0]["params"], atol=0)


def test_lossy_exchanges_stay_near_allreduce(runs):
    ref = runs["allreduce"][0]["params"]
    for case in ("seed", "ddp_fp16", "powersgd", "sharded_seed_both"):
        got = runs[case][0]["params"]
        assert any(not torch.equal(got[n], ref[n]) for n in ref), case     # really lossy
        _close(got, ref, atol=0.01)                                        # 3 steps at lr 1e-3


def _numel(res):
    return sum(p.numel() for p in res["params"].values())


def test_bytes_by_hand(runs):
    n = _numel(runs["allreduce"][0])
    for m in runs["allreduce"][0]["history"]:
        assert m["comm/payload_bytes"] == m["comm/bytes"] == 4 * n         # fp32, ring at N=2
        assert m["comm/wchar_bytes"] >= 4 * n                              # gloo wrote at least it
    for m in runs["ddp_fp16"][0]["history"]:
        assert m["comm/bytes"] == 2 * n                                    # float16 bucket
    # fp32 message: 12 header + 4 crc; per tensor 26 + len(name) + 4 ndim + 4 numel
    params = runs["fp32"][0]["params"]
    msg = 16 + sum(26 + len(k) + 4 * p.dim() + 4 * p.numel() for k, p in params.items())
    for m in runs["fp32"][0]["history"]:
        assert m["comm/payload_bytes"] == msg
        assert m["comm/bytes"] == 8 + msg                                  # (N-1)(8 + max_len)
    assert wire.FORMAT_BYTES["fp32"] == 4
    # PowerSGD rank 1: vanilla all_reduce for 2 steps, then a (n, m) matrix travels as n + m
    # numbers when (n + m) * 1 * 2 < n * m (torch's min_compression_rate 2), else whole
    after = sum((p.shape[0] + p[0].numel()) if p.dim() > 1 and
                2 * (p.shape[0] + p[0].numel()) < p.numel() else p.numel()
                for p in params.values())
    hist = runs["powersgd"][0]["history"]
    assert [m["comm/bytes"] for m in hist] == [4 * n, 4 * n, 4 * after]
    assert after < n / 2
    # sharder: reduce + broadcast of every byte, 2 (N-1) * 4n over both ranks, 4n per rank
    assert [m["comm/bytes"] for m in runs["sharded"][0]["history"]] == [4 * n] * STEPS
    assert runs["sharded_rr"][0]["history"][1]["comm/bytes"] > 4 * n       # re-shard migrates
    # sharder + fp32 messages: each rank sends the other owner one message holding that
    # owner's shards (flat, ndim 1), plus the (N, N) length table all-gathered (2 x 16 B)
    tiny = make_policy(DistConfig(**TINY))
    shards = make_shards(list(tiny.named_parameters()),
                         default_max_shard_numel(n, WORLD))
    owner = assign("size_balanced", shards, WORLD)
    msg = [16 + sum(26 + len(s.name) + 4 + 4 * s.numel for s, o in zip(shards, owner) if o == r)
           for r in range(WORLD)]
    for m in runs["sharded_fp32"][0]["history"]:
        assert m["comm/reduce_bytes"] == (sum(msg) + 2 * 16) // WORLD
        assert m["comm/bytes"] == m["comm/reduce_bytes"] + 4 * n // WORLD  # + fp32 broadcast


def test_compressed_seed_sends_fewer_bytes(runs):
    n = _numel(runs["seed"][0])
    for m in runs["seed"][0]["history"]:
        assert m["comm/bytes"] < 4 * n / 4                                 # more than 4x smaller
    # in the sharder only the reduce shrinks: the fp32 parameter broadcast (2n B per rank at
    # N=2) stays, so a step sends more than half of the uncompressed sharder's 4n
    for m in runs["sharded_seed_whole"][0]["history"]:
        assert m["comm/reduce_bytes"] < 4 * n / 2 / 4                      # reduce > 4x smaller
        assert m["comm/bytes"] - m["comm/reduce_bytes"] == 2 * n           # broadcast, fp32
    # EF21-P broadcast with the seed preset: the broadcast shrinks as much as the reduce
    for m in runs["sharded_seed_both"][0]["history"]:
        assert m["comm/bytes"] - m["comm/reduce_bytes"] < 2 * n / 4
    # the tiny model's tensors are mostly under aggressive's dense_small (1024): e4m3, ~4x
    for m in runs["sharded_aggressive_rr"][0]["history"]:
        assert m["comm/reduce_bytes"] < 4 * n / 2 / 2


def test_metrics_and_summary(runs):
    h = runs["allreduce"][0]["history"]
    assert {"step", "train/loss", "comm/bytes", "comm/payload_bytes", "comm/wchar_bytes",
            "time/step_s"} <= set(h[0])
    assert "eval/accuracy" in h[-1] and "eval/accuracy" not in runs["allreduce"][1]["history"][-1]
    s = summary(h)
    assert s["comm/bytes_total"] == STEPS * s["comm/bytes_per_step"]
    assert 0.0 <= s["eval/accuracy"] <= 1.0
    g = runs["grpo"][0]["history"]
    assert len(g) == 2 and all("reward/mean" in m for m in g)


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="unknown exchange 'carrier_pigeon'; known: "):
        DistConfig(exchange="carrier_pigeon")
    with pytest.raises(ValueError, match="unknown compression preset 'tiny'"):
        DistConfig(exchange="compressed", preset="tiny")
    with pytest.raises(ValueError, match="unknown objective 'rlhf'"):
        DistConfig(objective="rlhf")
    with pytest.raises(ValueError, match="grad_clip=1.0 .* 'sharded'"):
        DistConfig(exchange="sharded", grad_clip=1.0)
    with pytest.raises(ValueError, match="grad_clip=1.0 .* 'sharded_compressed'"):
        DistConfig(exchange="sharded_compressed", grad_clip=1.0)
    with pytest.raises(ValueError, match="unknown compression preset 'tiny'"):
        DistConfig(exchange="sharded_compressed", preset="tiny")
    with pytest.raises(ValueError, match="unknown broadcast_preset 'tiny'"):
        DistConfig(exchange="sharded_compressed", broadcast_preset="tiny")
    with pytest.raises(ValueError, match="broadcast_preset='seed' .* not 'sharded'"):
        DistConfig(exchange="sharded", broadcast_preset="seed")
    with pytest.raises(ValueError, match="max_shard_numel must be >= 0, got -1"):
        DistConfig(exchange="sharded", max_shard_numel=-1)
    with pytest.raises(ValueError, match="batch_size=8 is not divisible by 3 ranks"):
        train(DistConfig(**TINY), rank=0, world=3)
    with pytest.raises(ValueError, match="exchange 'sharded' needs a process group"):
        train(DistConfig(**{**TINY, "exchange": "sharded"}))
    assert set(EXCHANGES) == {"allreduce", "compressed", "ddp_fp16_hook", "ddp_powersgd_hook",
                              "sharded", "sharded_compressed"}


def test_command_line_sets_every_kind_of_field():
    # the torchrun entry point: ints, floats, bools, strings and the "X | None" overrides
    from grpo_lab.distributed.train_dist import parse_args
    cfg = parse_args(["--exchange", "sharded_compressed", "--preset", "aggressive",
                      "--broadcast_preset", "seed", "--density_warmup", "0", "--beta1", "0",
                      "--momentum", "0.5", "--error_feedback", "false", "--steps", "5",
                      "--lr", "3e-4"])
    assert (cfg.exchange, cfg.preset, cfg.broadcast_preset) == ("sharded_compressed",
                                                                "aggressive", "seed")
    assert (cfg.density_warmup, cfg.beta1, cfg.momentum) == (0, 0.0, 0.5)
    assert (cfg.error_feedback, cfg.steps, cfg.lr) == (False, 5, 3e-4)
    assert parse_args([]) == DistConfig()                                  # defaults untouched
    with pytest.raises(ValueError, match="unknown exchange 'pigeon'"):
        parse_args(["--exchange", "pigeon"])
