"""``HFConfig``: the settings of a policy="hf" run (``TrainConfig.hf``, ``--hf.dtype``), apart
from hf.py so that building a config loads neither the engine nor the model resolver.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_lab.registry import fields_nonnegative, lookup

DECODE_PATHS = {"lean": "decoder.LlamaDecoder where the model allows it",
                "transformers": "the model's forward with transformers' DynamicCache"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

@dataclass
class HFConfig:
    """``TrainConfig.hf``: how a policy="hf" run loads and runs its transformers model
    (``--hf.dtype`` on the command line)."""
    dtype: str = "float32"
    """Dtype the weights are loaded and trained in ("float32", "bfloat16", "float16").
    bfloat16 halves memory but AdamW then updates bf16 weights, which keep about 3
    significant digits: a step of lr 1e-6 on a weight of 1e-2 rounds to no change. To train,
    keep float32 weights and set autocast."""
    autocast: bool = False
    """Run every forward under torch.autocast to bfloat16 (mixed precision: weights and AdamW
    stay in dtype); log-probs are computed in float32 either way."""
    chat_template: bool = False
    """Wrap each prompt in the tokenizer's chat template as one user turn, with the
    generation prompt (for instruct models)."""
    trust_remote_code: bool = False
    """Let transformers run model code shipped with the checkpoint (off: only architectures
    transformers itself implements)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward (less memory, about a third more compute per
    training forward): checkpoint_every=1; checkpoint_every=k > 1 checkpoints every k-th
    layer instead."""
    sample_dtype: str = ""
    """Sample (and evaluate, and run a frozen reference) with a copy of the weights in this
    dtype ("bfloat16": 2-5x faster matmuls on CPUs with AVX-512 BF16/AMX), refreshed from the
    master weights after each update ("": the master weights)."""
    lora_r: int = 0
    """Train LoRA adapters of this rank on every linear layer but the head (peft; pip install
    -e ".[lora]") instead of every weight (0: full fine-tuning). The reference policy (beta >
    0) is then the model with its adapters off: no second copy."""
    lora_alpha: int = 0
    """LoRA scale numerator: adapters add (alpha / r) * B A x (0: alpha = 2 * lora_r)."""
    decoder: str = "lean"
    """The sampler's one-token forwards: "lean" (``decoder.py``: stacked projections and a
    static KV cache, for Llama-style models in float32 or a bf16 sampling copy, LoRA adapters
    included; others fall back) or "transformers" (the model's own forward with its
    DynamicCache)."""

    def __post_init__(self):
        lookup(DTYPES, self.dtype, "hf.dtype")
        lookup(DECODE_PATHS, self.decoder, "hf.decoder")
        if self.sample_dtype:
            lookup(DTYPES, self.sample_dtype, "hf.sample_dtype")
        fields_nonnegative(self, "lora_r", "lora_alpha")
        if self.lora_alpha and not self.lora_r:
            raise ValueError(f"hf.lora_alpha={self.lora_alpha} scales LoRA adapters, but "
                             f"hf.lora_r is 0 (full fine-tuning, no adapters): set hf.lora_r too")
