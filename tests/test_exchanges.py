"""Every gradient exchange through the one trainer (objective supervised, a tiny policy) on 2
gloo processes (one spawn for every case), against single-process training on the full batch,
and the bytes each exchange counts against hand-computed values.

Byte convention (distributed/exchanges.py): ``comm/bytes`` is what one rank sends per step under
the collective's bandwidth-optimal algorithm; at 2 ranks a ring all_reduce of b bytes sends
2 (N-1)/N b = b, so fp32 all_reduce is 4 B x numel per rank per step.
"""
import pytest
import torch

from grpo_lab.training.config import check_records, TrainConfig, preset
from grpo_lab.distributed import wire
from grpo_lab.distributed.exchanges import EXCHANGES
from grpo_lab.distributed.shard_plan import assign, default_max_shard_numel, make_shards
from grpo_lab.policies.model import GPT, GPTConfig, load_policy, save_policy
from grpo_lab.training.report import comm_summary
from grpo_lab.training.trainer import spawn_train, train
from tolerance import mean_tol

WORLD, STEPS = 2, 3
# adam_eps=1e-6 as in tests/test_sharder.py: the attention key bias has an exactly-zero true
# gradient, so its computed gradient is rounding noise that differs between a full-batch and
# a split backward, and Adam divides it by eps. Adam's first steps move each weight by about
# lr * g / (|g| + eps): rounding in a tiny g is amplified in proportion to lr, so lr=1e-3.
TINY = dict(objective="supervised", prompts_per_step=8, steps=STEPS, lr=1e-3, adam_eps=1e-6,
            warmup_steps=0, weight_decay=0.01, grad_clip=0.0, eval_every=0, eval_size=20,
            time_budget_s=0.0, threads=1, kl={"beta": 0.0})


def ex(name, overlap=False, **blocks) -> dict:
    """A case's config overrides: the exchange and the settings blocks its kind reads."""
    return {"exchange": {"name": name, "overlap": overlap}, **blocks}


CASES = {
    "allreduce": ex("allreduce"),
    "fp32": ex("compressed", compression={"preset": "fp32"}),
    "fp8_topk5": ex("compressed", compression={"preset": "fp8_topk5"}),
    "ddp_fp16": ex("ddp_fp16_hook"),
    "powersgd": ex("ddp_powersgd_hook", powersgd={"rank": 1, "start": 2}),
    "sharded": ex("sharded", sharding={"policy": "size_balanced"}),
    "sharded_rr": ex("sharded", sharding={"policy": "importance_round_robin",
                                          "importance": "seed", "reshard_every": 2}),
    "grpo": ex("allreduce"),
    "sharded_fp32": ex("sharded_compressed", compression={"preset": "fp32"}),
    "sharded_topk_whole": ex("sharded_compressed", compression={"preset": "fp8_topk5"},
                             sharding={"max_shard_numel": 10**9}),
    "sharded_aggressive_rr": ex("sharded_compressed", compression={"preset": "aggressive"},
                                sharding={"policy": "importance_round_robin",
                                          "importance": "seed", "reshard_every": 2}),
    "sharded_topk_both": ex("sharded_compressed", compression={"preset": "fp8_topk5"},
                            sharding={"broadcast_preset": "fp8_topk5"}),
    "allreduce_overlap": ex("allreduce", overlap=True),
    "sharded_overlap": ex("sharded", overlap=True, sharding={"policy": "size_balanced"}),
}


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny") / "tiny.safetensors"
    save_policy(GPT(GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=16)), path)
    return str(path)


def tiny_cfg(base, out, **kw) -> TrainConfig:
    return preset("tiny_cpu", base_checkpoint=base, out_dir=str(out), **{**TINY, **kw})


@pytest.fixture(scope="module")
def runs(tiny_base, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    cfgs = [tiny_cfg(tiny_base, out / name, **case,
                     **(dict(objective="grpo", prompts_per_step=4, group_size=4, steps=2,
                             kl={"beta": 0.02}) if name == "grpo" else {}))
            for name, case in CASES.items()]
    return dict(zip(CASES, spawn_train(cfgs, WORLD, run_timeout_s=300)))


@pytest.fixture(scope="module")
def single(tiny_base, tmp_path_factory):
    seen = {}
    h = train(tiny_cfg(tiny_base, tmp_path_factory.mktemp("single")), progress=False,
              on_step=lambda m, p: seen.setdefault("p", p))                # in process, world 1
    return {"history": h, "params": {n: p.detach().clone() for n, p in seen["p"].named_parameters()}}


def _steps(res):
    return [m for m in res["history"] if m["step"] >= 0]


def _close(a, b, atol):
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=name)


def test_allreduce_equals_single_process_full_batch(runs, single, tiny_base):
    for rank in range(WORLD):
        _close(runs["allreduce"][rank]["params"], single["params"], atol=1e-6)
    init = load_policy(tiny_base)
    moved = min(float((single["params"][n] - p.detach()).abs().max())
                for n, p in init.named_parameters())
    assert moved > 1e-4                                                    # 100x the tolerance
    # every rank logs the global batch's loss (the ranks' shares summed)
    for rank in range(WORLD):
        for a, b in zip(_steps(runs["allreduce"][rank]), _steps(single)):
            # a mean of cross-entropy terms (positive: the result is their magnitude) over
            # at most 8 x 4 answer tokens, summed per rank then over ranks (tests/tolerance.py)
            tol = mean_tol(TINY["prompts_per_step"] * 4, b["train/loss"])
            assert a["train/loss"] == pytest.approx(b["train/loss"], rel=0, abs=tol)


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
        _close(runs["sharded_topk_whole"][rank]["params"], runs["fp8_topk5"][rank]["params"], atol=0)


def test_overlapped_reduction_trains_as_the_post_backward_one(runs):
    # buckets reduced during backward from grad hooks: at 2 ranks the same sums, bitwise
    for case, ref in (("allreduce_overlap", "allreduce"), ("sharded_overlap", "sharded")):
        for rank in range(WORLD):
            _close(runs[case][rank]["params"], runs[ref][rank]["params"], atol=0)
            for a, b in zip(_steps(runs[case][rank]), _steps(runs[ref][rank])):
                for k in ("train/loss", "grad/norm", "comm/bytes", "comm/payload_bytes"):
                    assert a[k] == b[k], (case, k)


def test_every_rank_holds_the_same_params(runs):
    for case, res in runs.items():
        _close(res[1]["params"], res[0]["params"], atol=0)


def test_lossy_exchanges_stay_near_allreduce(runs):
    ref = runs["allreduce"][0]["params"]
    for case in ("fp8_topk5", "ddp_fp16", "powersgd", "sharded_topk_both"):
        got = runs[case][0]["params"]
        assert any(not torch.equal(got[n], ref[n]) for n in ref), case     # really lossy
        _close(got, ref, atol=0.01)                                        # 3 steps at lr 1e-3


def _numel(res):
    return sum(p.numel() for p in res["params"].values())


def test_bytes_by_hand(runs, tiny_base):
    n = _numel(runs["allreduce"][0])
    for m in _steps(runs["allreduce"][0]):
        assert m["comm/payload_bytes"] == m["comm/bytes"] == 4 * n         # fp32, ring at N=2
        assert m["comm/wchar_bytes"] >= 4 * n                              # gloo wrote at least it
    for m in _steps(runs["ddp_fp16"][0]):
        assert m["comm/bytes"] == 2 * n                                    # float16 bucket
    # fp32 message: 12 header + 4 crc; per tensor 26 + len(name) + 4 ndim + 4 numel
    params = runs["fp32"][0]["params"]
    msg = 16 + sum(26 + len(k) + 4 * p.dim() + 4 * p.numel() for k, p in params.items())
    for m in _steps(runs["fp32"][0]):
        assert m["comm/payload_bytes"] == msg
        assert m["comm/bytes"] == 8 + msg                                  # (N-1)(8 + max_len)
    assert wire.FORMAT_BYTES["fp32"] == 4
    # PowerSGD rank 1: vanilla all_reduce for 2 steps, then a (n, m) matrix travels as n + m
    # numbers when (n + m) * 1 * 2 < n * m (torch's min_compression_rate 2), else whole
    after = sum((p.shape[0] + p[0].numel()) if p.dim() > 1 and
                2 * (p.shape[0] + p[0].numel()) < p.numel() else p.numel()
                for p in params.values())
    hist = _steps(runs["powersgd"][0])
    assert [m["comm/bytes"] for m in hist] == [4 * n, 4 * n, 4 * after]
    assert after < n / 2
    # sharder: reduce + broadcast of every byte, 2 (N-1) * 4n over both ranks, 4n per rank
    assert [m["comm/bytes"] for m in _steps(runs["sharded"][0])] == [4 * n] * STEPS
    assert _steps(runs["sharded_rr"][0])[1]["comm/bytes"] > 4 * n       # re-shard migrates
    # sharder + fp32 messages: each rank sends the other owner one message holding that
    # owner's shards (flat, ndim 1), plus the (N, N) length table all-gathered (2 x 16 B)
    tiny = load_policy(tiny_base)
    shards = make_shards(list(tiny.named_parameters()),
                         default_max_shard_numel(n, WORLD))
    owner = assign("size_balanced", shards, WORLD)
    msg = [16 + sum(26 + len(s.name) + 4 + 4 * s.numel for s, o in zip(shards, owner) if o == r)
           for r in range(WORLD)]
    for m in _steps(runs["sharded_fp32"][0]):
        assert m["comm/reduce_bytes"] == (sum(msg) + 2 * 16) // WORLD
        assert m["comm/bytes"] == m["comm/reduce_bytes"] + 4 * n // WORLD  # + fp32 broadcast


def test_compressed_topk_sends_fewer_bytes(runs):
    n = _numel(runs["fp8_topk5"][0])
    for m in _steps(runs["fp8_topk5"][0]):
        assert m["comm/bytes"] < 4 * n / 4                                 # more than 4x smaller
    # in the sharder only the reduce shrinks: the fp32 parameter broadcast (2n B per rank at
    # N=2) stays, so a step sends more than half of the uncompressed sharder's 4n
    for m in _steps(runs["sharded_topk_whole"][0]):
        assert m["comm/reduce_bytes"] < 4 * n / 2 / 4                      # reduce > 4x smaller
        assert m["comm/bytes"] - m["comm/reduce_bytes"] == 2 * n           # broadcast, fp32
    # EF21-P broadcast with the fp8_topk5 preset: the broadcast shrinks as much as the reduce
    for m in _steps(runs["sharded_topk_both"][0]):
        assert m["comm/bytes"] - m["comm/reduce_bytes"] < 2 * n / 4
    # the tiny model's tensors are mostly under aggressive's dense_small (1024): e4m3, ~4x
    for m in _steps(runs["sharded_aggressive_rr"][0]):
        assert m["comm/reduce_bytes"] < 4 * n / 2 / 2


def test_metrics_and_summary(runs):
    h = runs["allreduce"][0]["history"]
    assert {"step", "train/loss", "comm/bytes", "comm/payload_bytes", "comm/wchar_bytes",
            "time/step_s", "grad/norm"} <= set(h[1])
    assert "eval/accuracy" in h[-1] and "eval/accuracy" not in runs["allreduce"][1]["history"][-1]
    s = comm_summary(h)
    assert s["comm/bytes_total"] == STEPS * s["comm/bytes_per_step"]
    assert 0.0 <= s["eval/accuracy"] <= 1.0
    g = _steps(runs["grpo"][0])
    assert len(g) == 2 and all("reward/mean" in m and "loss/kl" in m for m in g)
    empty = comm_summary([{"step": -1, "eval/accuracy": 0.5}])   # evaluated, no step taken
    assert empty["comm/bytes_per_step"] is None and empty["comm/bytes_total"] == 0


def test_bad_options_are_named(tiny_base, tmp_path):
    def checked(name, overlap=False, **blocks):
        return check_records(TrainConfig(**ex(name, overlap, **blocks)))
    with pytest.raises(ValueError, match="unknown exchange 'carrier_pigeon'; known: "):
        checked("carrier_pigeon")
    with pytest.raises(ValueError, match="unknown compression.preset 'tiny'"):
        checked("compressed", compression={"preset": "tiny"})
    with pytest.raises(ValueError, match="unknown objective 'rlhf'"):
        check_records(TrainConfig(objective="rlhf"))
    with pytest.raises(ValueError, match="unknown sharding.broadcast_preset 'tiny'"):
        checked("sharded_compressed", sharding={"broadcast_preset": "tiny"})
    with pytest.raises(ValueError, match="broadcast_preset='fp8_topk5' .* not 'sharded'"):
        checked("sharded", sharding={"broadcast_preset": "fp8_topk5"})
    with pytest.raises(ValueError, match="sharding.max_shard_numel must be finite and >= 0, got -1"):
        checked("sharded", sharding={"max_shard_numel": -1})
    with pytest.raises(ValueError, match="overlap=True .* 'allreduce' and 'sharded' only, not "
                                         "'sharded_compressed'"):
        checked("sharded_compressed", overlap=True, compression={"preset": "fp32"})
    with pytest.raises(ValueError, match="overlap=True .* not 'ddp_fp16_hook'"):
        checked("ddp_fp16_hook", overlap=True)
    with pytest.raises(ValueError, match="unknown sharding.policy 'fair'"):
        checked("sharded", sharding={"policy": "fair"})
    with pytest.raises(ValueError, match="unknown sharding.importance 'magic'"):
        checked("sharded", sharding={"importance": "magic"})
    with pytest.raises(ValueError, match="sharding.policy='importance_balanced' re-shards by "
                                         "importance every 5 steps, but sharding.importance=None"):
        checked("sharded", sharding={"policy": "importance_balanced", "reshard_every": 5})
    with pytest.raises(ValueError, match=r"compression\.preset='dgc': the compression block is "
                                         r"read by exchange 'compressed' or 'sharded_compressed', "
                                         r"not by 'allreduce'"):      # the run would ignore it
        checked("allreduce", compression={"preset": "dgc"})
    with pytest.raises(ValueError, match=r"powersgd\.rank=4: .* 'ddp_powersgd_hook', not by "
                                         r"'ddp_fp16_hook'"):
        checked("ddp_fp16_hook", powersgd={"rank": 4})
    with pytest.raises(ValueError, match="exchange 'sharded' needs a process group"):
        train(tiny_cfg(tiny_base, tmp_path, exchange={"name": "sharded"}), progress=False)
    assert set(EXCHANGES) == {"allreduce", "compressed", "ddp_fp16_hook", "ddp_powersgd_hook",
                              "sharded", "sharded_compressed", "fsdp2"}     # fsdp2: test_fsdp.py


def test_command_line_sets_every_kind_of_field():
    # ints, floats, bools, strings, the "X | None" overrides and the dotted sub-config flags
    from grpo_lab.cli import build_parser, overrides
    args = build_parser().parse_args([
        "train", "--exchange.name", "sharded_compressed", "--compression.preset", "aggressive",
        "--sharding.broadcast_preset", "fp8_topk5", "--compression.density_warmup", "0",
        "--compression.beta1", "0", "--compression.momentum", "0.5",
        "--compression.error_feedback", "false", "--steps", "5", "--lr", "3e-4"])
    cfg = preset("tiny_cpu", **overrides(args, TrainConfig))
    x = cfg.compression
    assert (cfg.exchange.name, x.preset, cfg.sharding.broadcast_preset) == \
        ("sharded_compressed", "aggressive", "fp8_topk5")
    assert (x.density_warmup, x.beta1, x.momentum) == (0, 0.0, 0.5)
    assert (x.error_feedback, cfg.steps, cfg.lr) == (False, 5, 3e-4)
    assert preset("tiny_cpu", **overrides(build_parser().parse_args(["train"]), TrainConfig)) \
        == preset("tiny_cpu")                                              # preset untouched
    with pytest.raises(ValueError, match="unknown exchange 'pigeon'"):
        preset("tiny_cpu", exchange={"name": "pigeon"})
