"""Overlapped (bucketed, hook-started) reduction == post-backward reduction, on 2 gloo processes.

One spawn runs both all-reductions on a tiny GPT (3 AdamW steps, 4 KiB buckets so there are
several): the first step's gradients and the final parameters must agree, and the ranks must
agree with each other. Another runs the sharder with and without ``overlap=True`` (4 steps
across a re-shard that moves owners, so the buckets are rebuilt). With 2 ranks a sum is a + b
in either order, so agreement is exact (bitwise); allclose leaves room for 3+ ranks' summation
order. Through the trainer: tests/test_exchanges.py. Timing lives in bench/bench_topology.py.
"""
import pytest
import torch

from grpo_lab.distributed.launch import spawn
from grpo_lab.distributed.overlap import OverlappedAllReduce
from grpo_lab.training.overlap_timing import (_batch, check_equivalence, lm_loss, measure_overlap,
                                              toy_policy)
from grpo_lab.distributed.sharder import ShardedOptimizer


@pytest.fixture(scope="module")
def runs():
    return check_equivalence(world=2, steps=3, bucket_bytes=4096)


def test_overlapped_gradients_equal_post_backward(runs):
    for rank in runs:
        assert rank["overlap"]["buckets"] > 3
        for name, g in rank["post"]["grads"].items():
            torch.testing.assert_close(rank["overlap"]["grads"][name], g, rtol=1e-6, atol=1e-7)


def test_training_unchanged_and_ranks_agree(runs):
    for rank in runs:
        for name, p in rank["post"]["params"].items():
            torch.testing.assert_close(rank["overlap"]["params"][name], p, rtol=1e-6, atol=1e-7)
    for name, p in runs[0]["overlap"]["params"].items():
        torch.testing.assert_close(runs[1]["overlap"]["params"][name], p, rtol=0, atol=0)


def test_bad_bucket_size_names_the_value(monkeypatch):
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 1)
    with pytest.raises(ValueError, match="bucket_bytes must be positive, got 0"):
        OverlappedAllReduce(torch.nn.Linear(2, 2), bucket_bytes=0)


def test_buckets_follow_backward_order(monkeypatch):
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))  # weight 64 B, bias 16 B
    red = OverlappedAllReduce(model, bucket_bytes=80)
    names = {p: n for n, p in model.named_parameters()}
    assert [[names[p] for p in b] for b in red.buckets] == [["1.bias", "1.weight"], ["0.bias", "0.weight"]]
    red.remove()


# ---- the sharder's reduce to owners, overlapped == post-backward ----

SHARDER = dict(lr=1e-2, eps=1e-6, policy="importance_round_robin", importance="seed",
               reshard_every=2, max_shard_numel=1024)


def _sharder_worker(rank, world, steps=4, bucket_bytes=16384):
    torch.set_num_threads(1)
    out = {}
    for overlap in (False, True):
        model, vocab = toy_policy(seed=0, tiny=True)
        opt = ShardedOptimizer(model.named_parameters(), overlap=overlap,
                               bucket_bytes=bucket_bytes, **SHARDER)
        metrics, owners = [], [list(opt.owner)]
        for step in range(steps):
            lm_loss(model, _batch(rank, step, vocab, 4, 12)).backward()
            if overlap and step == 0:                   # the same backward, reduced both ways
                red = opt.overlapped
                out["started_in_backward"] = red.next
                out["buckets"] = [(o, [s.index for s in ss]) for o, ss in red.buckets]
                grads = [p.grad for p in opt.params]
                out["grads"] = {"overlap": red.finish(), "post": opt._reduce(grads)}
            metrics.append({k: v for k, v in opt.step().items() if k != "time/step_s"})
            owners.append(list(opt.owner))
            opt.zero_grad()
        opt.remove_hooks()
        out[overlap] = {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
                        "metrics": metrics, "owners": owners}
    return out


@pytest.fixture(scope="module")
def sharder_runs():
    return spawn(_sharder_worker, 2, timeout_s=60, run_timeout_s=240)


def test_sharder_overlapped_reduce_gives_the_post_backward_gradients(sharder_runs):
    for rank in sharder_runs:
        assert rank["started_in_backward"] > 0                    # the hooks started buckets
        owners_per_group = [o for o, _ in rank["buckets"]]
        assert len(rank["buckets"]) > 3 and set(owners_per_group) == {0, 1}
        (got, comm), (ref, ref_comm) = rank["grads"]["overlap"], rank["grads"]["post"]
        assert comm == ref_comm                                   # (N-1) * M either way
        assert torch.equal(got, ref)                              # 2 ranks: a + b, bitwise


def test_sharder_training_and_metrics_unchanged_by_overlap(sharder_runs):
    for rank in sharder_runs:
        post, ovl = rank[False], rank[True]
        assert ovl["owners"] == post["owners"] and post["owners"][0] != post["owners"][-1]
        assert ovl["metrics"] == post["metrics"]                  # bytes, norms, shard/*
        for name, p in post["params"].items():
            assert torch.equal(ovl["params"][name], p), name
    for name, p in sharder_runs[0][True]["params"].items():
        assert torch.equal(sharder_runs[1][True]["params"][name], p), name


def test_sharder_overlap_options_name_the_problem(monkeypatch):
    import torch.distributed as dist
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="overlap=True overlaps the fp32 reduce only, but "
                                         "compression='fp32'"):
        ShardedOptimizer(model.named_parameters(), overlap=True, compression="fp32")
    with pytest.raises(ValueError, match="bucket_bytes must be positive, got -1"):
        from grpo_lab.distributed.overlap import OverlappedReduce
        OverlappedReduce(list(model.parameters()), [], [], bucket_bytes=-1)
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        measure_overlap(collective="gather")
