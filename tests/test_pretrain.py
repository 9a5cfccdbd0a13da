"""The supervised warm-up runs through the one training loop (pretrain.py, objective "pretrain",
preset pretrain_cpu): the same weights as the hand-written loop the shipped base policies were
made with, exact resume, and it learns."""
import math
import random

import pytest
import torch
import torch.nn.functional as F

from grpo_lab.training.config import preset
from grpo_lab.training.pretrain_config import PretrainConfig
from grpo_lab.policies.model import GPT, GPTConfig
from grpo_lab.policies.policy import get_policy_kind
from grpo_lab.training.pretrain import fresh_policy, pretrain, save_any, train_config
from grpo_lab.policies.engine import positions
from grpo_lab.training.step import demo_batch
from grpo_lab.tasks.task_data import load_eval
from grpo_lab.tasks import get_task, sample_examples
from grpo_lab.training.trainer import evaluate, train

TINY = dict(n_layer=1, n_head=2, n_embd=32, batch_size=8, threads=1)


def old_pretrain(cfg: PretrainConfig):
    """The loop data/base_policy.safetensors and data/base_mixture.safetensors were made with
    (pretrain.py before it ran through the trainer), kept as the reference."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    tasks = cfg.tasks.split(",")
    held_out = {ex.prompt for t in tasks for ex in load_eval(t)}
    if cfg.policy == "hf":
        from grpo_lab.policies.hf import build_tiny
        model = build_tiny(tasks, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.seed)
    else:
        model = GPT(GPTConfig(block_size=cfg.block_size, n_layer=cfg.n_layer,
                              n_head=cfg.n_head, n_embd=cfg.n_embd))
    # the optimizer the loop runs for this policy kind: fused for HF models (policy.PolicyKind
    # .fused_adamw, issue 22; fused vs the per-tensor loop: tests/test_fused_adamw.py)
    fused = get_policy_kind(cfg.policy).fused_adamw or None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, fused=fused)
    losses, records = [], [get_task(t) for t in tasks]
    for step in range(cfg.stop_after or cfg.steps):
        lr = cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / cfg.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, mask, tmask = demo_batch(sample_examples(records, cfg.batch_size, rng, held_out),
                                      model)
        logits, _ = model(ids, positions(mask), mask)                      # (B, T, V)
        loss = F.cross_entropy(logits[:, :-1][tmask[:, 1:]], ids[:, 1:][tmask[:, 1:]])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return model, losses


@pytest.mark.parametrize("policy,block", [("toy", 32), ("hf", 64)])
def test_the_loop_gives_the_old_loops_weights(policy, block):
    cfg = PretrainConfig(policy=policy, out="unused", block_size=block, steps=8, stop_after=6,
                         **TINY)
    ref, ref_losses = old_pretrain(cfg)
    new, history = pretrain(cfg, progress=False)
    assert [h["step"] for h in history] == list(range(6))
    # the same data order, schedule, optimizer and loss: the same weights, bit for bit
    for (name, a), (_, b) in zip(ref.named_parameters(), new.named_parameters()):
        assert torch.equal(a, b), name
    # the logged loss: a float32 mean there, a float32 sum / count here
    for a, b in zip(ref_losses, (h["sft/loss"] for h in history)):
        assert abs(a - b) <= 1e-6 * abs(a)


def test_the_preset_is_the_shipped_recipe():
    c = train_config(PretrainConfig(), "base.safetensors", "out")
    assert (c.objective, c.task, c.prompts_per_step, c.lr, c.weight_decay, c.grad_clip,
            c.warmup_steps, c.steps, c.schedule_steps, c.kl.beta, c.seed) == \
        ("pretrain", "addition,sort,reverse", 64, 2e-3, 0.01, 0.0, 0, 1800, 2000, 0.0, 0)
    assert train_config(PretrainConfig(), "b", "o") == preset("pretrain_cpu", base_checkpoint="b",
                                                               out_dir="o", threads=c.threads)


def test_a_resumed_warm_up_replays_the_stream_exactly(tmp_path):
    pc = PretrainConfig(steps=8, stop_after=6, **TINY)
    save_any(fresh_policy(pc), tmp_path / "init.safetensors")
    base = str(tmp_path / "init.safetensors")
    whole = train(train_config(pc, base, str(tmp_path / "a")), progress=False)
    half = train_config(pc, base, str(tmp_path / "b"))
    train(half.__class__(**{**vars(half), "steps": 3}), progress=False)
    resumed = train(half, resume=True, progress=False, allow_override=True)
    assert [h["train/loss"] for h in resumed[1:]] == [h["train/loss"] for h in whole[1:]]
    pa = load_policy_from_run(tmp_path / "a")
    pb = load_policy_from_run(tmp_path / "b")
    for (name, x), (_, y) in zip(pa.named_parameters(), pb.named_parameters()):
        assert torch.equal(x, y), name


def load_policy_from_run(out_dir):
    from grpo_lab.policies.policy import load_policy_any
    return load_policy_any(out_dir / "checkpoint.safetensors")


def test_the_warm_up_learns():
    """From random weights: the loss falls and greedy held-out accuracy rises above its start."""
    cfg = PretrainConfig(tasks="reverse", steps=300, stop_after=300, lr=3e-3, n_layer=2,
                         n_head=2, n_embd=48, batch_size=32, threads=1)
    held = load_eval("reverse")[:100]
    before = evaluate(fresh_policy(cfg), held, {"accuracy": 1.0}, 8)["eval/accuracy"]
    policy, history = pretrain(cfg, progress=False)
    after = evaluate(policy, held, {"accuracy": 1.0}, 8)["eval/accuracy"]
    first = sum(h["sft/loss"] for h in history[:10]) / 10
    last = sum(h["sft/loss"] for h in history[-10:]) / 10
    assert last < 0.5 * first, (first, last)
    assert after > before + 0.2, (before, after)


def test_schedule_steps_stretches_the_cosine_by_hand():
    from grpo_lab.training.trainer import learning_rate
    c = preset("pretrain_cpu", lr=2e-3, steps=1800, schedule_steps=2000)
    # no warm-up; factor 0.1 + 0.9 * (1 + cos(pi * step / 2000)) / 2, not over 1800 steps
    assert learning_rate(c, 0) == 2e-3
    assert learning_rate(c, 1000) == pytest.approx(2e-3 * 0.55, rel=1e-12)
    assert learning_rate(c, 1799) == pytest.approx(
        2e-3 * (0.1 + 0.45 * (1 + math.cos(math.pi * 1799 / 2000))), rel=1e-12)
    assert learning_rate(preset("pretrain_cpu", steps=1800, schedule_steps=0), 1799) == \
        pytest.approx(2e-3 * (0.1 + 0.45 * (1 + math.cos(math.pi * 1799 / 1800))), rel=1e-12)
    with pytest.raises(ValueError, match=r"schedule_steps must be >= 0, got -1"):
        preset("pretrain_cpu", schedule_steps=-1)
