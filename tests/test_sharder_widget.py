"""The sharder explorer and the replay under it, driven without a browser.

A hand-made recording keeps this fast: two 'parameters', gradients chosen so the importance
ranking flips half-way, which makes importance_round_robin move shards when it re-shards.
"""
import pytest
import torch

from grpo_lab.distributed.replay import replay_sharding
from grpo_lab.distributed.shard_plan import assign, imbalance, rank_bytes
from grpo_lab.teaching.widgets.sharder import sharder_explorer

STEPS = 8


def _recording():
    # parameter a: 12 elements, b: 4; shards of 4 -> a[0:4] a[4:8] a[8:12] b
    grads = torch.zeros(STEPS, 16)
    for t in range(STEPS):
        grads[t, :4] = 1.0 if t < 4 else 0.01                             # a[0:4] loud, then quiet
        grads[t, 8:12] = 0.01 if t < 4 else 1.0                           # a[8:12] the reverse
        grads[t, 4:8] = 0.1
        grads[t, 12:] = 0.05
    return {"names": ["a", "b"], "shapes": [(3, 4), (4,)], "grads": grads}


def test_replay_by_hand():
    r = replay_sharding(_recording(), "importance_round_robin", 2, reshard_every=4,
                        score="norm", max_shard_numel=4)
    assert [s.numel for s in r["shards"]] == [4, 4, 4, 4]
    # no scores at the start: dealt in index order
    assert r["owner"][0] == [0, 1, 0, 1]
    # step 3 (first re-shard): norms 2, 0.2, 0.02, 0.1 -> order s0, s1, s3, s2 -> ranks 0,1,0,1
    assert r["scores"][3] == pytest.approx([2.0, 0.2, 0.02, 0.1])
    assert r["owner"][3] == [0, 1, 1, 0]
    # two shards moved: 16 B per element (Adam + moments) + 16 B of counters each
    assert r["moved"][3] == 2 and r["migrated_bytes"][3] == 2 * (16 * 4 + 16)
    # step 7: norms 0.02, 0.2, 2, 0.1 -> order s2, s1, s3, s0 -> s2 r0, s1 r1, s3 r0, s0 r1
    assert r["owner"][7] == [1, 1, 0, 0]
    for t in range(STEPS):
        assert r["loads"][t] == rank_bytes(r["shards"], r["owner"][t], 2)
        assert r["imbalance"][t] == imbalance(r["loads"][t])
        assert sum(r["migrated_bytes"][t] for t in range(STEPS) if (t + 1) % 4) == 0


def test_size_balanced_never_moves():
    r = replay_sharding(_recording(), "size_balanced", 2, reshard_every=2, max_shard_numel=4)
    assert sum(r["migrated_bytes"]) == 0 and set(r["imbalance"]) == {1.0}


def test_controls_drive_the_data():
    box, parts = sharder_explorer(_recording(), plots=False)
    d = parts["data"]
    assert d["step"] == STEPS - 1 and len(d["owner"]) == STEPS
    parts["ranks"].value = 3
    assert len(parts["data"]["loads_now"]) == 3
    parts["policy"].value = "size_balanced"
    assert parts["data"]["total_migrated"] == 0
    assert parts["data"]["owner_now"] == assign("size_balanced", parts["data"]["shards"], 3)
    parts["policy"].value = "importance_round_robin"
    parts["interval"].value = 4
    parts["score"].value = "norm"
    assert parts["data"]["reshards"] >= 1 and parts["data"]["total_migrated"] > 0
    parts["interval"].value = 0                                           # never re-shard
    assert parts["data"]["total_migrated"] == 0
    parts["step"].value = 2
    assert parts["summary"].value.startswith("step 2:")


def test_plots_build(capsys):
    box, parts = sharder_explorer(_recording(), plots=True)
    parts["ranks"].value = 2
    assert "display.Image object" in capsys.readouterr().out   # a PNG, whatever the backend
