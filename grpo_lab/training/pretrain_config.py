"""``PretrainConfig``: the supervised warm-up's fields (``grpo-lab pretrain``, pretrain.py).

Its own module, as ``ppo_config`` and ``speed_config``, so the command line builds its flags
without loading the trainer.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from grpo_lab.registry import fields_nonnegative, fields_positive, lookup

BLOCK_SIZE_DRAWS = 1000
"""Demonstrations drawn per task (seeded) to find the longest one ``block_size`` must hold."""


@dataclass
class PretrainConfig:
    policy: str = "toy"
    """"toy": the char-level GPT, written as one safetensors file; "hf": a tiny Llama-style
    transformers model with a BPE tokenizer trained here (hf.build_tiny; no download),
    written as a transformers folder (out is then a folder, e.g. data/hf_tiny)."""
    tasks: str = "addition,sort,reverse"
    """Comma-separated tasks whose demonstrations the base policy is trained on."""
    out: str = "data/base_policy.safetensors"
    """Where to write the base policy."""
    steps: int = 2000
    """Length of the learning-rate schedule (cosine decay to 10% over this many steps)."""
    stop_after: int = 1800
    """Stop after this many steps, deliberately early, so the base is only partly
    competent (0 = run the whole schedule)."""
    batch_size: int = 64
    """Demonstrations per step."""
    lr: float = 2e-3
    """AdamW learning rate (cosine decay to 10%)."""
    n_layer: int = 3
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads."""
    n_embd: int = 80
    """Width of the residual stream."""
    block_size: int = 32
    """Longest sequence the policy handles."""
    seed: int = 0
    """Seed of initialisation and data order."""
    threads: int = 0
    """torch CPU threads (0 = torch's default)."""

    def __post_init__(self):
        from grpo_lab.policies.policy import POLICIES
        from grpo_lab.tasks import TASKS, countdown, word_problems  # noqa: F401 (they register their families)
        lookup(POLICIES, self.policy, "policy")
        if self.policy == "hf" and self.out.endswith(".safetensors"):
            raise ValueError(f"policy='hf' writes a transformers folder; out={self.out!r} "
                             f"names a file (e.g. --out data/hf_tiny)")
        fields_positive(self, "steps", "batch_size", "n_layer", "n_head", "n_embd", "block_size")
        fields_nonnegative(self, "threads")
        if not 0 <= self.stop_after <= self.steps:
            raise ValueError(f"stop_after must be in [0, steps={self.steps}], got {self.stop_after}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for t in self.tasks.split(","):
            lookup(TASKS, t, "task")
        if self.policy == "toy":
            self.check_block_size(TASKS)

    def check_block_size(self, tasks) -> None:
        """The toy's positions are learned up to ``block_size`` and it reads a token a
        character, so a demonstration (prompt + answer + <eos>) longer than that fails at step
        0: refused now, by the longest of ``BLOCK_SIZE_DRAWS`` seeded draws per task (a task
        whose rare prompts run longer still fails at its step). The hf policy is not checked:
        its rotary positions take any length."""
        rng = random.Random(0)
        ex = max((tasks[t].draw(rng) for t in self.tasks.split(",")
                  for _ in range(BLOCK_SIZE_DRAWS)), key=lambda e: len(e.prompt) + len(e.answer))
        need = len(ex.prompt) + len(ex.answer) + 1
        if need > self.block_size:
            raise ValueError(f"block_size={self.block_size} is shorter than the longest "
                             f"demonstration: {ex.prompt + ex.answer!r} + <eos> ({ex.task}) is "
                             f"{need} tokens; use --block_size {need} or more")
