"""What fits where: the bytes one rank holds in a GRPO run, for each way the exchange holds the
weights, and which models fit on which GPU.

The state (exact: ``state_bytes``; tests/test_fits.py checks it against the tensors a real
exchange holds after a step), fp32 master weights and AdamW as grpo_lab trains (bf16 autocast
on GPUs computes in bf16 but keeps fp32 weights), P parameters of which T train (T = P; with
LoRA the adapters), N ranks:

    replicated (allreduce, compressed, the DDP hooks)   4 P + 4 T + 8 T        (+ 4 T residual: compressed)
    sharder (ZeRO-2-like: importance-aware owners)      4 P + 4 T + 8 T / N
    FSDP2 (ZeRO-3: fully_shard)                         (4 P + 4 T + 8 T) / N  + what is gathered

A frozen LoRA base counts 4 P (fp32) or 2 P (``hf.dtype`` bfloat16) and no gradient or moment.

The transient part (an estimate, labelled as such in every table):

  * the update's activations per token (Korthikanti et al. 2022, sec. 4, 16-bit activations,
    fused attention so no scores are kept): about 34 h bytes a layer, so 34 h L a token; with
    activation checkpointing every layer the input alone, 2 h a layer, plus one layer whole;
    the fp32 logits of the tokens (4 V bytes a token; the chosen-token log-prob keeps them for
    its backward);
  * the rollout's KV cache: 2 L d_kv bytes a token in bf16 (keys and values, d_kv = kv heads x
    head dim), for every row and position;
  * FSDP2 gathers one block's weights ahead of the one it runs (2 x 4 P / L), or the whole
    model once per step for the rollout (4 P), whichever the exchange does.

Deviations: optimizer and allocator fragmentation, CUDA context (~0.5-1 GB) and the reference
model (beta > 0 without LoRA: another 2-4 P) are left out; the table says so.
"""
from __future__ import annotations

from typing import NamedTuple


class Shape(NamedTuple):
    """A decoder's size: parameters, layers, hidden width, vocabulary, kv width (heads x dim)."""
    params: float
    layers: int
    hidden: int
    vocab: int
    kv_dim: int


SHAPES = {   # from each model's published config.json
    "Qwen2.5-0.5B": Shape(0.494e9, 24, 896, 151_936, 128),
    "Qwen2.5-1.5B": Shape(1.54e9, 28, 1536, 151_936, 256),
    "Qwen2.5-7B": Shape(7.62e9, 28, 3584, 152_064, 512),
    "Qwen2.5-14B": Shape(14.7e9, 48, 5120, 152_064, 1024),
    "Qwen2.5-32B": Shape(32.8e9, 64, 5120, 152_064, 1024),
    "Llama-3.1-70B": Shape(70.6e9, 80, 8192, 128_256, 1024),
}
HOLDINGS = ("replicated", "sharder", "fsdp2")


def state_bytes(params: float, trainable: float, world: int, holding: str,
                residual: bool = False, base_bytes: int = 4) -> float:
    """Bytes of weights, gradients and AdamW moments one rank holds (the formulas above).
    ``base_bytes``: bytes per frozen parameter (4 fp32, 2 bf16) when ``trainable < params``."""
    if holding not in HOLDINGS:
        raise ValueError(f"holding {holding!r} is not one of {HOLDINGS}")
    if world < 1 or not 0 < trainable <= params:
        raise ValueError(f"need world >= 1 and 0 < trainable <= params, got world={world}, "
                         f"trainable={trainable}, params={params}")
    frozen = params - trainable
    weights = 4 * trainable + base_bytes * frozen
    grads, moments = 4 * trainable, 8 * trainable
    extra = 4 * trainable if residual else 0
    if holding == "replicated":
        return weights + grads + moments + extra
    if holding == "sharder":
        return weights + grads + moments / world + extra
    return (weights + grads + moments) / world + extra


def peak_bytes(shape: Shape, world: int, holding: str, tokens: int, rollout_tokens: int,
               lora_params: float = 0.0, checkpointing: bool = False,
               gather_rollout: bool = True) -> dict:
    """Per-rank bytes of one step -> {"state", "update", "rollout", "peak"}: ``tokens`` the
    update's tokens on this rank at once (rows x length of a micro-batch), ``rollout_tokens``
    the KV cache's (rows x positions)."""
    P, L, h = shape.params, shape.layers, shape.hidden
    T = lora_params or P
    state = state_bytes(P, T, world, holding)
    per_layer = 2 * h if checkpointing else 34 * h
    acts = tokens * (per_layer * L + (34 * h if checkpointing else 0) + 4 * shape.vocab)
    gathered_block = 2 * 4 * P / L if holding == "fsdp2" else 0
    update = state + gathered_block + acts
    kv = rollout_tokens * 2 * L * shape.kv_dim * 2
    full_copy = 4 * P if (holding == "fsdp2" and gather_rollout) else gathered_block
    rollout = state + full_copy + kv
    return {"state": state, "update": update, "rollout": rollout, "peak": max(update, rollout)}


def fits_table(gpus=(24, 80, 141), world: int = 8, tokens: int = 8 * 1024,
               rollout_tokens: int = 64 * 1536, checkpointing: bool = True) -> str:
    """Markdown: per-rank peak GB for every model and holding on ``world`` ranks, and which of
    ``gpus`` (GB of memory) it fits, full fine-tuning and LoRA (rank 16 on the 7 linear layers
    of every block, counted as r (h + h) each: an underestimate for the MLP's wider layers; the
    frozen base in fp32, grpo_lab's default: ``hf.dtype bfloat16`` halves it)."""
    rows = ["| model | holding | full FT peak GB | fits | LoRA peak GB | fits |",
            "|---|---|---|---|---|---|"]
    variants = (("replicated", "replicated", True), ("sharder", "sharder", True),
                ("fsdp2, rollout gathered once", "fsdp2", True),
                ("fsdp2, gathered block by block", "fsdp2", False))
    for name, s in SHAPES.items():
        lora = 16 * 2 * s.hidden * 7 * s.layers           # 7 linear layers a block, r (in + out)
        for label, holding, once in variants:
            kw = dict(checkpointing=checkpointing, gather_rollout=once)
            full = peak_bytes(s, world, holding, tokens, rollout_tokens, **kw)["peak"] / 1e9
            lo = peak_bytes(s, world, holding, tokens, rollout_tokens, lora_params=lora,
                            **kw)["peak"] / 1e9
            fit = lambda gb: ", ".join(f"{g}" for g in gpus if gb <= g) or "none"  # noqa: E731
            rows.append(f"| {name} | {label} | {full:,.1f} | {fit(full)} | {lo:,.1f} | "
                        f"{fit(lo)} |")
    return "\n".join(rows)
