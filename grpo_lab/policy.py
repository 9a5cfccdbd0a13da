"""The policy seam: what rollout, the objectives, evaluation and the trainer need from a policy.

A policy is a ``torch.nn.Module`` with this small surface (``Policy`` below spells it out):

    encode(text) -> ids, decode(ids) -> text   its tokenizer (tasks stay text in, text out)
    pad_id, eos_id                             ids the sampler writes after a stop / stops on
    cfg.block_size                             longest prompt + completion it can take
    forward(idx (B, T), pos (B, T), key_mask (B, Tk), cache) -> (logits (B, T, V), cache)
                                               left-padded batches: explicit positions and
                                               a key mask; a KV cache taken and returned
    repeat_cache(cache, G) -> cache            each prompt's cache repeated for its G
                                               completions (rows i*G..i*G+G-1 are prompt i)
    select_cache(cache, rows) -> cache         the cache's rows (the sampler drops finished ones)
    checkpointing                              the training forward keeps no KV cache
    forward(..., logits_to_keep=k, use_cache=b)  the head on the last k positions; a cache
                                               built in a training forward too (the update's
                                               prompt_once forward)

Two implementations: the toy char-level GPT (``model.GPT``, this file's ``load_toy``) and any
``transformers`` causal LM with its tokenizer (``hf.HFPolicy``, imported only when asked
for, so grpo_lab imports without transformers). Sampling (``rollout.sample``: per-prompt
generators, the exponential race, a KV cache shared by a prompt's G completions) and the
log-probs (``rollout.completion_logprobs``) are written once against this surface, so a
data-parallel run of either samples the same tokens on 1 or N processes.
Pick one with ``TrainConfig.policy`` ("toy" | "hf"); ``load_for(cfg)`` builds it.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch

POLICIES = ("toy", "hf")


class Policy(Protocol):
    """The interface (structural: nothing inherits from it)."""
    pad_id: int
    eos_id: int
    cfg: Any                      # .block_size: int, the longest sequence; vars() is JSON

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def repeat_cache(self, cache, G: int): ...
    def __call__(self, idx: torch.Tensor, pos: torch.Tensor | None = None,
                 key_mask: torch.Tensor | None = None, cache=None): ...


def load_for(cfg, path: str | None = None) -> torch.nn.Module:
    """The policy ``cfg`` names (``cfg.policy``), loaded from ``path`` (default
    ``cfg.base_checkpoint``) on the CPU, in training mode, with the config's memory levers:
    ``checkpoint_every`` (toy: ``GPT.checkpoint_every``; hf: transformers' activation
    checkpointing of every k-th layer, ``hf_gradient_checkpointing`` meaning k = 1) and
    ``autocast`` (toy only; hf has ``hf_autocast``)."""
    path = cfg.base_checkpoint if path is None else path
    if cfg.policy == "toy":
        from grpo_lab.model import load_policy
        model = load_policy(path)
        model.checkpoint_every, model.autocast = cfg.checkpoint_every, cfg.autocast
        return model
    from grpo_lab.hf import load_hf_policy     # lazy: transformers is an optional extra
    return load_hf_policy(path, dtype=cfg.hf_dtype, autocast=cfg.hf_autocast,
                          chat_template=cfg.hf_chat_template,
                          trust_remote_code=cfg.hf_trust_remote_code,
                          system_prompt=cfg.system_prompt,
                          gradient_checkpointing=cfg.checkpoint_every
                          or int(cfg.hf_gradient_checkpointing),
                          sample_dtype=cfg.hf_sample_dtype, lora_r=cfg.lora_r,
                          lora_alpha=cfg.lora_alpha)


def frozen(policy: torch.nn.Module) -> torch.nn.Module:
    """The reference policy: ``policy`` in eval mode with gradients off."""
    return policy.eval().requires_grad_(False)


def state_without_aliases(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` with each tied tensor kept once, under its first name
    (the toy GPT's ``lm_head.weight`` is ``wte.weight``; many HF models tie theirs too):
    safetensors refuses tensors that share memory, ``checkpoint.load_state_strict`` accepts
    the aliases' absence."""
    seen, out = set(), {}
    for k, v in module.state_dict().items():
        key = (v.data_ptr(), tuple(v.shape), v.stride()) if v.numel() else k
        if key not in seen:
            seen.add(key)
            out[k] = v
    return out
