"""The dynamic gradient sharder: policies by hand, importance by hand, and sharded training on
2 and 3 gloo processes against single-process torch.optim.AdamW (one spawn per world size)."""
import math

import pytest
import torch
import torch.nn.functional as F

from grpo_lab.distributed.importance import (IMPORTANCE, get_importance, init_moments,
                                             update_moments)
from grpo_lab.distributed.launch import spawn
from grpo_lab.distributed.shard_plan import (ShardInfo, assign, default_max_shard_numel,
                                             hardware_capacity, imbalance, make_shards,
                                             rank_bytes)
from grpo_lab.distributed.sharder import ShardedOptimizer
from grpo_lab.policies.model import GPT, GPTConfig

# ---- policies on a hand-worked list: numel 4, 1, 3, 2, 5 (float32: 16, 4, 12, 8, 20 bytes) ----

SHARDS = [ShardInfo(i, f"s{i}", i, 0, n) for i, n in enumerate([4, 1, 3, 2, 5])]
IMP = [0.1, 0.9, 0.5, 0.7, 0.3]


def test_importance_round_robin_by_hand():
    # by score: s1 .9, s3 .7, s2 .5, s4 .3, s0 .1 -> dealt to ranks 0, 1, 0, 1, 0
    assert assign("importance_round_robin", SHARDS, 2, IMP) == [0, 0, 0, 1, 1]
    # no scores: dealt in index order
    assert assign("importance_round_robin", SHARDS, 2) == [0, 1, 0, 1, 0]


def test_size_balanced_by_hand():
    # LPT by bytes: s4 20 -> r0 [20, 0]; s0 16 -> r1 [20, 16]; s2 12 -> r1 [20, 28];
    # s3 8 -> r0 [28, 28]; s1 4 -> tie, lower rank r0 [32, 28]
    owner = assign("size_balanced", SHARDS, 2, IMP)
    assert owner == [1, 0, 1, 0, 0]
    assert rank_bytes(SHARDS, owner, 2, per_element=4) == [32, 28]


def test_importance_balanced_by_hand():
    # as size_balanced until the last shard: s1 meets equal loads [28, 28]; importance held is
    # r0: .3 + .7 = 1.0, r1: .1 + .5 = 0.6, so s1 goes to r1 (size_balanced put it on r0)
    assert assign("importance_balanced", SHARDS, 2, IMP) == [1, 1, 1, 0, 0]


def test_capacity_weighted_by_hand():
    # shares .75/.25; (load + bytes) / share: s4 26.7 vs 80 -> r0; s0 48 vs 64 -> r0;
    # s2 64 vs 48 -> r1; s3 58.7 vs 80 -> r0; s1 64 vs 64 -> tie, r0. Bytes 48:12 = 3:1.
    owner = assign("capacity_weighted", SHARDS, 2, IMP, capacities=[3.0, 1.0])
    assert owner == [0, 0, 1, 0, 0]
    assert rank_bytes(SHARDS, owner, 2, per_element=4) == [48, 12]


def test_hardware_capacity_by_hand():
    # 2*10 + 1*100 - 5*4 = 100 ; 2*5 + 1*50 - 5*2 = 50
    assert hardware_capacity([10, 5], [100, 50], [4, 2], alpha=2, beta=1, gamma=5) == [100, 50]
    with pytest.raises(ValueError, match="capacity of rank 1 is -"):
        hardware_capacity([10, 1], [100, 1], [4, 9])


def _toy_shards(n_ranks, max_numel=None):
    named = list(GPT(GPTConfig()).named_parameters())
    total = sum(p.numel() for _, p in named)
    return make_shards(named, max_numel or default_max_shard_numel(total, n_ranks)), total


@pytest.mark.parametrize("n_ranks", [2, 3, 4])
def test_policy_equivalences_on_toy_model(n_ranks):
    shards, _ = _toy_shards(n_ranks)
    lpt = assign("size_balanced", shards, n_ranks)
    # equal capacities and zero importance reduce both to plain LPT
    assert assign("capacity_weighted", shards, n_ranks, None, [2.5] * n_ranks) == lpt
    assert assign("importance_balanced", shards, n_ranks, [0.0] * len(shards)) == lpt


@pytest.mark.parametrize("n_ranks", [2, 3, 4])
def test_size_balanced_memory_on_default_toy_model(n_ranks):
    shards, total = _toy_shards(n_ranks)
    per_rank = rank_bytes(shards, assign("size_balanced", shards, n_ranks), n_ranks)  # Adam, 8 B
    assert sum(per_rank) == 8 * total
    assert max(per_rank) <= 8 * total / n_ranks * 1.05
    assert imbalance(per_rank) <= 1.05
    whole, _ = _toy_shards(n_ranks, max_numel=total)                     # no splitting (ZeRO)
    assert imbalance(per_rank) <= imbalance(rank_bytes(whole, assign("size_balanced", whole,
                                                                        n_ranks), n_ranks))


def test_make_shards_cuts_near_equal_contiguous_blocks():
    shards = make_shards([("a", torch.zeros(2, 5)), ("b", torch.zeros(3))], max_shard_numel=4)
    # 10 elements, ceil(10/4) = 3 blocks, cuts at 10*j//3 = 0, 3, 6, 10
    assert [(s.name, s.param, s.start, s.numel, s.nbytes) for s in shards] == [
        ("a[0:3]", 0, 0, 3, 12), ("a[3:6]", 0, 3, 3, 12), ("a[6:10]", 0, 6, 4, 16), ("b", 1, 0, 3, 12)]


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown shard policy 'fastest'"):
        assign("fastest", SHARDS, 2)
    with pytest.raises(ValueError, match="6 ranks but only 5 shards"):
        assign("size_balanced", SHARDS, 6)
    with pytest.raises(ValueError, match="'empty.weight' has zero elements"):
        make_shards([("w", torch.zeros(3)), ("empty.weight", torch.zeros(0, 4))], 8)
    for bad in (0, float("nan"), float("inf")):             # inf: ceil(3 / inf) = 0 blocks
        with pytest.raises(ValueError, match=f"max_shard_numel must be >= 1, got {bad}"):
            make_shards([("w", torch.zeros(3))], bad)
    with pytest.raises(ValueError, match="importance of shard 2 \\(s2\\) is -1.0"):
        assign("importance_balanced", SHARDS, 2, [0, 0, -1, 0, 0])
    with pytest.raises(ValueError, match="3 capacities for 2 ranks"):
        assign("capacity_weighted", SHARDS, 2, None, [1, 1, 1])
    with pytest.raises(ValueError, match="capacity of rank 0 is 0.0"):
        assign("capacity_weighted", SHARDS, 2, None, [0, 1])
    with pytest.raises(ValueError, match="unknown importance score 'magic'"):
        get_importance("magic")


# ---- importance by hand ----

def test_moments_and_scores_by_hand():
    m = init_moments(2)
    update_moments(m, torch.tensor([1.0, 3.0]), decay=0.5)               # mean = g, var = 0
    assert m.mean.tolist() == [1.0, 3.0] and m.var.tolist() == [0.0, 0.0]
    g = torch.tensor([3.0, 1.0])
    update_moments(m, g, decay=0.5)   # delta [2,-2]; mean [2,2]; var .5*(0 + .5*4) = [1,1]
    assert m.mean.tolist() == [2.0, 2.0] and m.var.tolist() == [1.0, 1.0] and m.steps == 2
    assert IMPORTANCE["seed"](m, g) == pytest.approx(0.7 * 1 + 0.3 * math.sqrt(10), abs=1e-6)
    assert IMPORTANCE["norm"](m, g) == pytest.approx(math.sqrt(10), abs=1e-6)
    assert IMPORTANCE["variance"](m, g) == 1.0
    assert IMPORTANCE["snr"](m, g) == pytest.approx(4.0, abs=1e-6)       # mean(4) / 1


def test_moments_equal_explicit_exponential_weights():
    # the recursion is exactly the weighted mean/variance with weights d^(T-1), (1-d) d^(T-k)
    d, G = 0.8, torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    m = init_moments(5)
    for g in G:
        update_moments(m, g, d)
    T = len(G)
    w = torch.tensor([d ** (T - 1)] + [(1 - d) * d ** (T - k) for k in range(2, T + 1)],
                     dtype=torch.float64)[:, None]                        # (T, 1), sums to 1
    mu = (w * G.double()).sum(0)                                          # (5,)
    torch.testing.assert_close(m.mean.double(), mu, atol=1e-6, rtol=0)
    torch.testing.assert_close(m.var.double(), (w * (G.double() - mu) ** 2).sum(0), atol=1e-6, rtol=0)


# ---- sharded training == single-process AdamW, on 2 and 3 gloo processes ----

CFG = GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=16)
# eps=1e-6, not torch's 1e-8: the attention key bias has an exactly-zero true gradient (softmax
# ignores a shift shared by all keys), so its computed gradient is float rounding noise
# (~1e-11) that differs between a full-batch and a split backward; Adam divides it by eps.
HP = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1)
STEPS, RESHARD_EVERY = 6, 2
# every case migrates: it starts under `start`, switches to `policy` before the first re-shard
CASES = {
    "importance_round_robin": dict(start="size_balanced"),
    "size_balanced": dict(start="importance_round_robin"),
    "importance_balanced": dict(start="size_balanced"),
    "capacity_weighted": dict(start="size_balanced", capacities=[3.0, 1.0, 1.0]),
}


def _batch():
    t = torch.randint(0, CFG.vocab_size, (6, 17), generator=torch.Generator().manual_seed(1))
    return t[:, :-1], t[:, 1:]                                            # (6, 16) each


def _loss(model, x, y):
    logits, _ = model(x)                                                  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _train_worker(rank, world):
    x, y = _batch()
    b = x.shape[0] // world
    out = {}
    for policy, case in CASES.items():
        torch.manual_seed(0)
        model = GPT(CFG)
        caps = case.get("capacities")
        opt = ShardedOptimizer(model.named_parameters(), policy=case["start"], importance="seed",
                               reshard_every=RESHARD_EVERY, **HP)
        shards, owners, metrics = opt.shards, [list(opt.owner)], []
        for step in range(STEPS):
            _loss(model, x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]).backward()
            if step == RESHARD_EVERY - 1:
                opt.policy, opt.capacities = policy, caps and caps[:world]
            metrics.append(opt.step())
            owners.append(list(opt.owner))
            opt.zero_grad()
        out[policy] = {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
                       "metrics": metrics, "owners": owners,
                       "numel": [s.numel for s in shards], "policy_now": opt.policy}
    # lossless compression inside the sharder, both ways: fp32 gradient messages point to
    # point to each owner, and the owners' master - replica differences broadcast in fp32,
    # across a re-shard (masters migrate; the gradient residuals are the sender's and stay)
    torch.manual_seed(0)
    model = GPT(CFG)
    opt = ShardedOptimizer(model.named_parameters(), policy="importance_balanced",
                           importance="seed", reshard_every=RESHARD_EVERY, compression="fp32",
                           broadcast_compression="fp32", **HP)
    metrics, owners = [], [list(opt.owner)]
    for step in range(STEPS):
        _loss(model, x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]).backward()
        metrics.append(opt.step())
        owners.append(list(opt.owner))
        opt.zero_grad()
    out["compressed_fp32"] = {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
                              "metrics": metrics, "owners": owners}
    # a moved shard's score moves with it: a re-shard right after a re-shard reads the same
    # scores, so the same policy assigns the same owners and moves nothing
    moved = opt.reshard(policy="importance_round_robin")["shard/moved"]
    scores = list(opt.global_scores)
    again = opt.reshard()
    out["reshard_twice"] = (moved, scores, list(opt.global_scores), again["shard/moved"])
    return out


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(0)
    model = GPT(CFG)
    opt = torch.optim.AdamW(model.parameters(), **HP)
    x, y = _batch()
    for _ in range(STEPS):
        _loss(model, x, y).backward()                                    # full-batch mean
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def runs(request):
    world = request.param
    return world, spawn(_train_worker, world, timeout_s=60, run_timeout_s=240)


def test_sharded_adamw_matches_single_process(runs, reference):
    world, results = runs
    ref = reference
    for rank, res in enumerate(results):
        for policy in CASES:
            got = res[policy]["params"]
            for name, p in ref.items():
                torch.testing.assert_close(got[name], p, atol=1e-6, rtol=0,
                                           msg=f"{policy}, world {world}, rank {rank}, {name}")


def test_sharder_with_lossless_compression_matches_single_process(runs, reference):
    world, results = runs
    for rank, res in enumerate(results):
        for name, p in reference.items():
            torch.testing.assert_close(res["compressed_fp32"]["params"][name], p, atol=1e-6,
                                       rtol=0, msg=f"world {world}, rank {rank}, {name}")
    r = results[0]["compressed_fp32"]
    numel = results[0]["size_balanced"]["numel"]
    total = sum(numel)
    for step, m in enumerate(r["metrics"]):
        # fp32 messages hold every gradient byte plus headers: just over the fp32 floors
        assert 4 * total * (world - 1) < m["comm/reduce_bytes"] < 4 * total * (world - 1) * 1.05
        if (step + 1) % RESHARD_EVERY:
            assert 8 * total * (world - 1) < m["comm/bytes"] < 8 * total * (world - 1) * 1.05
        assert sum(m["shard/opt_state_bytes"]) == 12 * total             # + 4 B master weights
        moved = [i for i, (a, b) in enumerate(zip(r["owners"][step], r["owners"][step + 1]))
                 if a != b]
        # Adam's two moments, importance mean and var, master weights: 5 x 4 B per element
        assert m["shard/migrated_bytes"] == sum(20 * numel[i] + 16 for i in moved)
    assert r["metrics"][RESHARD_EVERY - 1]["shard/moved"] > 0


def test_a_moved_shard_keeps_its_score(runs):
    world, results = runs
    for rank, res in enumerate(results):
        moved, scores, rescored, moved_again = res["reshard_twice"]
        assert moved > 0 and min(scores) > 0, (world, rank)
        assert rescored == scores and moved_again == 0, (world, rank)


def test_params_moved_enough_for_the_check_to_mean_something(reference):
    ref = reference
    torch.manual_seed(0)
    init = GPT(CFG)
    moved = min(float((ref[n] - p.detach()).abs().max()) for n, p in init.named_parameters())
    assert moved > 1e-4                                                  # 100x the tolerance


def test_reshard_migrates_state_and_counts_its_bytes(runs):
    world, results = runs
    for policy in CASES:
        r = results[0][policy]
        owners, numel = r["owners"], r["numel"]
        assert r["policy_now"] == policy
        for step, m in enumerate(r["metrics"]):
            before, after = owners[step], owners[step + 1]
            moved = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
            # each moved shard carries exp_avg, exp_avg_sq, importance mean, var (4 x 4 B per
            # element) and two int64 step counters
            assert m["shard/migrated_bytes"] == sum(16 * numel[i] + 16 for i in moved)
            assert m["shard/moved"] == len(moved)
            if (step + 1) % RESHARD_EVERY:
                assert not moved
        assert r["metrics"][RESHARD_EVERY - 1]["shard/migrated_bytes"] > 0, policy


def test_measured_memory_and_comm_bytes(runs):
    world, results = runs
    for policy in CASES:
        metrics = results[0][policy]["metrics"]
        total = sum(results[0][policy]["numel"])
        for m in metrics:
            assert sum(m["shard/opt_state_bytes"]) == 8 * total           # state split, not copied
            assert sum(m["shard/grad_bytes"]) == 4 * total
            assert m["shard/imbalance"] == pytest.approx(
                max(m["shard/opt_state_bytes"]) * world / (8 * total))
        plain = [m for i, m in enumerate(metrics) if (i + 1) % RESHARD_EVERY]
        # reduce + broadcast of every gradient/parameter byte: 2 (N-1) M, as DDP's all_reduce
        assert {m["comm/bytes"] for m in plain} == {2 * (world - 1) * 4 * total}
    for m in results[0]["size_balanced"]["metrics"][RESHARD_EVERY - 1:]:
        assert max(m["shard/opt_state_bytes"]) <= 8 * total / world * 1.05
    caps = CASES["capacity_weighted"]["capacities"][:world]
    last = results[0]["capacity_weighted"]["metrics"][-1]["shard/opt_state_bytes"]
    for r in range(world):                                               # bytes follow capacity
        assert abs(last[r] / sum(last) - caps[r] / sum(caps)) < 0.05, (r, last)


def test_every_rank_reports_the_same_metrics(runs):
    world, results = runs
    for policy in CASES:
        keys = ["shard/opt_state_bytes", "shard/grad_bytes", "comm/bytes", "shard/migrated_bytes"]
        for res in results[1:]:
            for a, b in zip(results[0][policy]["metrics"], res[policy]["metrics"]):
                assert [a[k] for k in keys] == [b[k] for k in keys]


# ---- one rank in this process: the AdamW arithmetic itself, and errors raised at construction ----

@pytest.fixture
def one_rank_group():
    import torch.distributed as dist
    from grpo_lab.distributed.launch import free_port
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_one_rank_is_bitwise_torch_adamw(one_rank_group):
    x, y = _batch()
    torch.manual_seed(0)
    ref = GPT(CFG)
    torch.manual_seed(0)
    model = GPT(CFG)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.8, 0.99), eps=1e-8,
                                weight_decay=0.3)
    opt = ShardedOptimizer(model.named_parameters(), lr=1e-2, betas=(0.8, 0.99), eps=1e-8,
                           weight_decay=0.3, max_shard_numel=100, importance="norm",
                           policy="importance_balanced", reshard_every=2)
    for _ in range(3):
        for m, o in ((ref, ref_opt), (model, opt)):
            _loss(m, x, y).backward()
            o.step()
            o.zero_grad()
    for (name, p), q in zip(ref.named_parameters(), model.parameters()):
        assert torch.equal(p, q), name                                     # same ops, same order


def test_ef21p_broadcast_masters_follow_adamw_and_replicas_receive_top_k(one_rank_group):
    # EF21-P: the owner's master weights take exact AdamW steps on the gradients computed at
    # the replicas; the replicas move only where the compressed difference was sent
    from grpo_lab.distributed.compression import CompressionConfig
    x, y = _batch()
    torch.manual_seed(0)
    model = GPT(CFG)
    torch.manual_seed(0)
    shadow = GPT(CFG)                                                   # torch AdamW on masters
    density = 0.01
    opt = ShardedOptimizer(model.named_parameters(), max_shard_numel=10**9, **HP,
                           broadcast_compression=CompressionConfig(dense_fraction=0.0,
                                                                   density=density))
    ref_opt = torch.optim.AdamW(shadow.parameters(), **HP)
    for step in range(3):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        _loss(model, x, y).backward()
        for p, q in zip(model.parameters(), shadow.parameters()):
            q.grad = p.grad.clone()                                     # gradient at the replica
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        for (name, p), q in zip(model.named_parameters(), shadow.parameters()):
            master = opt.state[opt.shard_index[name]].master
            assert torch.equal(master, q.detach().reshape(-1)), (step, name)
            moved = int((p.detach() != before[name]).sum())
            assert 0 < moved <= max(1, round(density * p.numel())), (step, name, moved)
            sent = p.detach() != before[name]                         # sent: replica == master
            torch.testing.assert_close(p.detach()[sent], q.detach()[sent], rtol=0, atol=1e-7)
    lag = max(float((p.detach() - q.detach()).abs().max())
              for p, q in zip(model.parameters(), shadow.parameters()))
    assert lag > 1e-4                                                   # the rest is still owed


def test_optimizer_construction_errors(one_rank_group):
    model = GPT(CFG)
    with pytest.raises(ValueError, match="unknown shard policy 'fastest'"):
        ShardedOptimizer(model.named_parameters(), policy="fastest")
    with pytest.raises(ValueError, match="unknown importance score 'magic'"):
        ShardedOptimizer(model.named_parameters(), importance="magic")
    with pytest.raises(ValueError, match="'head.bias' has zero elements"):
        ShardedOptimizer([("w", torch.nn.Parameter(torch.zeros(3))),
                          ("head.bias", torch.nn.Parameter(torch.zeros(0)))])
    with pytest.raises(ValueError, match="unknown compression preset 'tiny'"):
        ShardedOptimizer(model.named_parameters(), compression="tiny")
    with pytest.raises(ValueError, match="unknown compression preset 'tiny'"):
        ShardedOptimizer(model.named_parameters(), broadcast_compression="tiny")
    with pytest.raises(ValueError, match="re-shards by importance every 5 steps, but importance=None"):
        ShardedOptimizer(model.named_parameters(), policy="importance_round_robin", reshard_every=5)
    nan = float("nan")
    for kw, msg in ((dict(lr=nan), "lr must be finite and >= 0, got nan"),
                    (dict(eps=-1e-8), "eps must be finite and >= 0, got -1e-08"),
                    (dict(weight_decay=nan), "weight_decay must be finite and >= 0, got nan"),
                    (dict(grad_clip=-1.0), "grad_clip must be finite and >= 0, got -1.0"),
                    (dict(grad_clip=nan), "grad_clip must be finite and >= 0, got nan"),
                    (dict(betas=(1.0, 0.999)), "betas\\[0\\] must be in \\[0, 1\\), got 1.0"),
                    (dict(importance="seed", importance_decay=1.0),
                     "importance_decay must be in \\[0, 1\\), got 1.0"),
                    (dict(reshard_every=nan), "reshard_every must be a whole number >= 0 .*, got nan"),
                    (dict(reshard_every=2.5), "reshard_every must be a whole number >= 0 .*, got 2.5"),
                    (dict(reshard_every=-1), "reshard_every must be a whole number >= 0 .*, got -1")):
        with pytest.raises(ValueError, match=msg):
            ShardedOptimizer(model.named_parameters(), **kw)
    opt = ShardedOptimizer(model.named_parameters(), policy="size_balanced")
    with pytest.raises(ValueError, match="'importance_balanced' ranks shards by importance"):
        opt.reshard(policy="importance_balanced")
