"""Fused AdamW (``exchanges.AdamW.fused``, the HF policy's default) takes the same steps as
torch's per-tensor loop up to float rounding; the toy keeps the per-tensor loop (its exact
equivalence tests compare against the sharder's own Adam); an HF run's checkpoint holds the
fused setting, so a resumed run steps the same optimizer (tests/test_hf.py: resume is exact)."""
import pytest
import torch

from grpo_lab.checkpoint import read_training_checkpoint
from grpo_lab.training.config import preset
from grpo_lab.distributed.exchanges import AdamW, ExchangeConfig, make_exchange
from grpo_lab.policies.model import GPT, GPTConfig
from grpo_lab.policies.policy import POLICIES
from grpo_lab.training.trainer import train
from tolerance import mean_tol

STEPS, LR = 6, 1e-2


def run_adamw(fused: bool):
    """STEPS AdamW steps (weight decay, clipping) of a toy GPT on seeded gradients whose scale
    moves over three decades -> (model, optimizer state, largest |weight change| of a step)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=16))
    ex = make_exchange(model, ExchangeConfig(), AdamW(lr=LR, weight_decay=0.1, grad_clip=1.0,
                                                      fused=fused))
    gen = torch.Generator().manual_seed(1)
    biggest = 0.0
    for s in range(STEPS):
        ex.zero_grad()
        before = [p.detach().clone() for p in model.parameters()]
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen) * 10.0 ** (s % 3 - 2)
        ex.reduce()
        ex.step()
        biggest = max([biggest] + [float((p.detach() - b).abs().max())
                                   for p, b in zip(model.parameters(), before)])
    return model, ex.state_dict(), biggest


def test_fused_adamw_takes_the_per_tensor_loops_steps():
    loop, loop_state, step_loop = run_adamw(False)
    fused, fused_state, _ = run_adamw(True)
    assert fused_state["param_groups"][0]["fused"] is True            # really the fused kernel
    assert loop_state["param_groups"][0]["fused"] is None
    # per step a weight sums itself, its decay and lr * m_hat / (sqrt(v_hat) + eps), and that
    # update carries about ten roundings: error <= STEPS * eps * (3 |w| + 10 |step|)
    for (name, a), b in zip(loop.named_parameters(), fused.parameters()):
        tol = mean_tol(STEPS, 3 * float(a.detach().abs().max()) + 10 * step_loop)
        assert float((a - b).abs().max()) <= tol, name
    for i, st in loop_state["state"].items():
        for k in ("exp_avg", "exp_avg_sq"):            # convex sums of STEPS gradient terms
            a, b = st[k], fused_state["state"][i][k]
            assert float((a - b).abs().max()) <= mean_tol(3 * STEPS, float(a.abs().max())), (i, k)
        assert float(st["step"]) == float(fused_state["state"][i]["step"]) == STEPS
    moved = max(float((a - b).abs().max()) for a, b in
                zip(loop.parameters(), GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4,
                                                     block_size=16)).parameters()))
    assert moved > 1e-3                                                    # the steps did move


def test_the_policy_record_picks_fused_adamw_for_hf_only():
    assert POLICIES["hf"].fused_adamw and not POLICIES["toy"].fused_adamw


@pytest.mark.parametrize("policy", ["toy", "hf"])
def test_a_runs_checkpoint_holds_its_adamw_kind(policy, tmp_path):
    if policy == "hf":
        pytest.importorskip("transformers")
        c = preset("hf_tiny_cpu", out_dir=str(tmp_path), threads=1, steps=1, prompts_per_step=2,
                   group_size=2, eval_every=0, eval_size=0, time_budget_s=0.0)
    else:
        c = preset("quick", out_dir=str(tmp_path), threads=1, steps=1, prompts_per_step=2,
                   group_size=2, eval_every=0, eval_size=0, time_budget_s=0.0)
    train(c, progress=False)
    groups = read_training_checkpoint(tmp_path / "checkpoint.safetensors")["optim"]["param_groups"]
    assert [g["fused"] for g in groups] == [True if policy == "hf" else None]
