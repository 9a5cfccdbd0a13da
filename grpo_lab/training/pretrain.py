"""Supervised warm-up: the "base model" that GRPO starts from, through the one training loop.

DeepSeekMath runs GRPO on a model that already half-knows the task (an SFT model). The
toy equivalent: train the char-level GPT on task demonstrations ("12+34=" -> "46<eos>"),
with the loss on answer tokens only, and stop early so the policy is partly competent.

``pretrain`` writes a freshly initialised policy (seeded by ``cfg.seed``) to a temporary
base checkpoint and runs the trainer (trainer.train) on it with the preset ``pretrain_cpu``:
objective "pretrain" (step.py: cross-entropy on the answer tokens of demonstrations drawn
from one stream, random.Random(seed)), AdamW with weight decay 0.01, no clipping or warm-up,
cosine decay over ``steps`` stopped after ``stop_after``. The weights are those of the
hand-written loop this module held before, bit for bit (tests/test_pretrain.py keeps it as
the reference; 1800 default steps on one thread checked too). ``grpo-lab pretrain`` with the
defaults is the recipe of ``data/base_policy.safetensors``; that shipped file is not
re-made: neither loop reproduces its bytes today (float sums differ with the thread count and
the torch build over 1800 steps), and every figure was measured on it. ``--policy hf`` warms
up the tiny transformers model (hf.build_tiny) the same way (data/README.md has the command
that made ``data/hf_tiny``).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from grpo_lab.training.config import TrainConfig, preset
from grpo_lab.training.pretrain_config import PretrainConfig
from grpo_lab.policies.model import GPT, GPTConfig, save_policy
from grpo_lab.training.trainer import train


def fresh_policy(cfg: PretrainConfig):
    """The untrained policy ``cfg`` describes (torch seeded by ``cfg.seed`` first)."""
    torch.manual_seed(cfg.seed)
    if cfg.policy == "hf":                    # a tiny Llama-style model and its BPE tokenizer
        from grpo_lab.policies.hf import build_tiny
        return build_tiny(cfg.tasks.split(","), cfg.n_layer, cfg.n_head, cfg.n_embd,
                          cfg.block_size, cfg.seed)
    return GPT(GPTConfig(block_size=cfg.block_size, n_layer=cfg.n_layer, n_head=cfg.n_head,
                         n_embd=cfg.n_embd))


def save_any(policy, path, extra: dict | None = None) -> None:
    """A toy policy to one safetensors file (with ``extra`` metadata); a transformers policy
    to a folder (``extra`` beside it as grpo_lab_pretrain.json)."""
    if isinstance(policy, GPT):
        save_policy(policy, path, extra)
        return
    policy.save_pretrained(path)
    if extra is not None:
        (Path(path) / "grpo_lab_pretrain.json").write_text(json.dumps(extra, indent=1) + "\n")


def train_config(cfg: PretrainConfig, base: str, out_dir: str) -> TrainConfig:
    """The trainer's config for ``cfg``: the preset ``pretrain_cpu`` with its fields."""
    return preset("pretrain_cpu", policy=cfg.policy, task=cfg.tasks, base_checkpoint=base,
                  out_dir=out_dir, prompts_per_step=cfg.batch_size, lr=cfg.lr,
                  steps=cfg.stop_after or cfg.steps, schedule_steps=cfg.steps, seed=cfg.seed,
                  threads=cfg.threads or torch.get_num_threads())


def pretrain(cfg: PretrainConfig, progress: bool = True):
    """-> (the trained policy, history: one {"step", "sft/loss", "time/elapsed_s"} per step)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    with tempfile.TemporaryDirectory(prefix="grpo_lab_pretrain_") as tmp:
        base = str(Path(tmp) / ("init" if cfg.policy == "hf" else "init.safetensors"))
        save_any(fresh_policy(cfg), base)
        seen = {}
        rows = train(train_config(cfg, base, str(Path(tmp) / "run")), progress=progress,
                     on_step=lambda m, policy: seen.setdefault("policy", policy))
    history = [{"step": r["step"], "sft/loss": r["train/loss"],
                "time/elapsed_s": r["time/elapsed_s"]} for r in rows if r["step"] >= 0]
    return seen["policy"], history


def main(cfg: PretrainConfig) -> None:
    model, history = pretrain(cfg)
    extra = {"pretrain_config": vars(cfg), "final_sft_loss": history[-1]["sft/loss"]}
    save_any(model, cfg.out, extra)
    print(f"wrote {cfg.out} ({model.num_params():,} parameters, "
          f"final loss {history[-1]['sft/loss']:.3f}, {history[-1]['time/elapsed_s']:.0f} s)")
