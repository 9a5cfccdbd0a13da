"""``PretrainConfig``: the supervised warm-up's fields (``grpo-lab pretrain``, pretrain.py).

Its own module, as ``ppo_config`` and ``speed_config``, so the command line builds its flags
without loading the trainer.
"""
from __future__ import annotations

from dataclasses import dataclass

from grpo_lab.registry import fields_positive, lookup


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
        if not 0 <= self.stop_after <= self.steps:
            raise ValueError(f"stop_after must be in [0, steps={self.steps}], got {self.stop_after}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for t in self.tasks.split(","):
            lookup(TASKS, t, "task")
