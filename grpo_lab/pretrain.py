"""Supervised warm-up: the "base model" that GRPO starts from.

DeepSeekMath runs GRPO on a model that already half-knows the task (an SFT model). The
toy equivalent: train the char-level GPT on task demonstrations ("12+34=" -> "46<eos>"),
with the loss on answer tokens only, and stop early so the policy is partly competent.
``grpo-lab pretrain`` with the defaults reproduces ``data/base_policy.safetensors``;
``--policy hf`` warms up the tiny transformers model (hf.build_tiny) through the same loop
(data/README.md has the command that made ``data/hf_tiny``).
"""
from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from grpo_lab.config import PretrainConfig
from grpo_lab.model import GPT, GPTConfig, save_policy
from grpo_lab.rollout import positions
from grpo_lab.step import demo_batch
from grpo_lab.task_data import load_eval
from grpo_lab.tasks import sample_examples


def pretrain(cfg: PretrainConfig, progress: bool = True) -> tuple[GPT, list[dict]]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    tasks = cfg.tasks.split(",")
    held_out = {ex.prompt for t in tasks for ex in load_eval(t)}
    if cfg.policy == "hf":                    # the same loop through policy.py's interface
        from grpo_lab.hf import build_tiny
        model = build_tiny(tasks, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.seed)
    else:
        model = GPT(GPTConfig(block_size=cfg.block_size, n_layer=cfg.n_layer,
                              n_head=cfg.n_head, n_embd=cfg.n_embd))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    history = []
    t0 = time.perf_counter()
    for step in tqdm(range(cfg.stop_after or cfg.steps), desc="pretrain", disable=not progress):
        lr = cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / cfg.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, mask, tmask = demo_batch(sample_examples(tasks, cfg.batch_size, rng, held_out),
                                      model)
        logits, _ = model(ids, positions(mask), mask)                      # (B, T, V)
        # position t predicts token t+1: shift the targets left by one
        loss = F.cross_entropy(logits[:, :-1][tmask[:, 1:]], ids[:, 1:][tmask[:, 1:]])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        history.append({"step": step, "sft/loss": loss.item(), "time/elapsed_s":
                        time.perf_counter() - t0})
    return model, history


def main(cfg: PretrainConfig) -> None:
    model, history = pretrain(cfg)
    extra = {"pretrain_config": vars(cfg), "final_sft_loss": history[-1]["sft/loss"]}
    if cfg.policy == "hf":
        model.save_pretrained(cfg.out)
        (Path(cfg.out) / "grpo_lab_pretrain.json").write_text(json.dumps(extra, indent=1) + "\n")
    else:
        save_policy(model, cfg.out, extra)
    print(f"wrote {cfg.out} ({model.num_params():,} parameters, "
          f"final loss {history[-1]['sft/loss']:.3f}, {history[-1]['time/elapsed_s']:.0f} s)")
