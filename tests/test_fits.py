"""fits.py: the state formula against the tensors real exchanges hold (exact), the transient
estimate's arithmetic by hand, and bad input."""
import pytest
import torch

from grpo_lab.distributed import fits
from grpo_lab.distributed.exchanges import AdamW, ExchangeConfig, make_exchange, trainable
from grpo_lab.policies.memory import tensor_bytes
from grpo_lab.policies.model import GPT, GPTConfig


def _held(model, optimizer_tensors):
    """Bytes of weights + gradients + optimizer moments, as the process holds them."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return tensor_bytes(list(model.parameters())) + tensor_bytes(grads) + \
        tensor_bytes(optimizer_tensors)


def test_replicated_state_is_the_formula_exactly():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=16))
    ex = make_exchange(model, ExchangeConfig(), AdamW(lr=1e-3))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    ex.reduce()
    ex.step()
    moments = [v for st in ex.state_dict()["state"].values() for k, v in st.items()
               if k in ("exp_avg", "exp_avg_sq")]
    P = sum(p.numel() for p in model.parameters())
    assert _held(model, moments) == fits.state_bytes(P, P, 1, "replicated") == 16 * P


def test_lora_state_counts_the_frozen_base_once():
    from grpo_lab.policies.hf import load_hf_policy
    policy = load_hf_policy("data/hf_tiny", lora_r=4)
    ex = make_exchange(policy, ExchangeConfig(), AdamW(lr=1e-3))
    for _, p in trainable(policy):
        p.grad = torch.ones_like(p)
    ex.reduce()
    ex.step()
    moments = [v for st in ex.state_dict()["state"].values() for k, v in st.items()
               if k in ("exp_avg", "exp_avg_sq")]
    P = sum(p.numel() for p in policy.parameters())
    T = sum(p.numel() for _, p in trainable(policy))
    assert 0 < T < P
    assert _held(policy, moments) == fits.state_bytes(P, T, 1, "replicated")   # 4P + 12T


def _sharder_worker(rank, world):
    from grpo_lab.distributed.sharder import ShardedOptimizer
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=16))
    opt = ShardedOptimizer(trainable(model), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    moments = [t for st in opt.state.values() for t in (st.exp_avg, st.exp_avg_sq)]
    return {"held": _held(model, moments), "moments": tensor_bytes(moments),
            "P": sum(p.numel() for p in model.parameters())}


def test_the_sharders_moments_split_over_the_ranks():
    """ZeRO-2-like: every rank keeps the weights and the gradients, the owners the moments: the
    ranks' moments add up to 8 P, and the mean rank holds the formula's 4 P + 4 P + 8 P / N."""
    from grpo_lab.distributed.launch import spawn
    got = spawn(_sharder_worker, 2, timeout_s=60, run_timeout_s=240)
    P = got[0]["P"]
    assert sum(g["moments"] for g in got) == 8 * P
    assert all(0 < g["moments"] < 8 * P for g in got)                    # both own a part
    assert sum(g["held"] for g in got) / 2 == fits.state_bytes(P, P, 2, "sharder")


def test_transient_terms_by_hand():
    s = fits.Shape(params=1e9, layers=10, hidden=1000, vocab=50_000, kv_dim=100)
    got = fits.peak_bytes(s, world=4, holding="fsdp2", tokens=100, rollout_tokens=1000)
    state = 16e9 / 4
    assert got["state"] == state
    # update: state + two gathered blocks (2 x 4 P / L) + tokens x (34 h L + 4 V)
    assert got["update"] == state + 2 * 4e9 / 10 + 100 * (34 * 1000 * 10 + 4 * 50_000)
    # rollout: state + the whole model gathered once (4 P) + the KV cache (2 L d_kv x 2 B a token)
    assert got["rollout"] == state + 4e9 + 1000 * 2 * 10 * 100 * 2
    assert got["peak"] == max(got["update"], got["rollout"])
    ck = fits.peak_bytes(s, 4, "replicated", 100, 1000, checkpointing=True)
    assert ck["update"] == 16e9 + 100 * (2 * 1000 * 10 + 34 * 1000 + 4 * 50_000)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="holding 'zero3' is not one of"):
        fits.state_bytes(10, 10, 2, "zero3")
    with pytest.raises(ValueError, match="trainable=20"):
        fits.state_bytes(10, 20, 2, "replicated")


def test_the_table_has_every_model_and_holding():
    table = fits.fits_table()
    for name in fits.SHAPES:
        assert sum(line.startswith(f"| {name} |") for line in table.splitlines()) == 4
