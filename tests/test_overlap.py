"""Overlapped (bucketed, hook-started) reduction == post-backward reduction, on 2 gloo processes.

One spawn runs both reductions on a tiny GPT (3 AdamW steps, 4 KiB buckets so there are
several): the first step's gradients and the final parameters must agree, and the ranks must
agree with each other. With 2 ranks a sum is a + b in either order, so agreement is exact;
allclose leaves room for 3+ ranks' summation order. Timing lives in bench/bench_topology.py.
"""
import pytest
import torch

from grpo_lab.distributed.overlap import OverlappedAllReduce, check_equivalence


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
