"""The policy seam: what rollout, the objectives, evaluation and the trainer need from a policy.

A policy is an ``engine.Engine`` (a ``torch.nn.Module``; ``Policy`` is its name here) with
this small surface, every hook declared there:

    encode(text) -> ids, decode(ids) -> text   its tokenizer (tasks stay text in, text out)
    unknown_chars(text) -> [chars]             what that tokenizer cannot read or write back
                                               (the setup's check of a run's tasks)
    pad_id, eos_id                             ids the sampler writes after a stop / stops on
    cfg.block_size                             longest prompt + completion it can take
    forward(idx (B, T), pos (B, T), key_mask (B, Tk), cache) -> (logits (B, T, V), cache)
                                               left-padded batches: explicit positions and
                                               a key mask; a KV cache taken and returned
    repeat_cache(cache, G) -> cache            each prompt's cache repeated for its G
                                               completions (rows i*G..i*G+G-1 are prompt i)
    select_cache(cache, rows) -> cache         the cache's rows (the sampler drops finished ones)
    start_decode(cache, G, max_new_tokens)     the decode's cache (default: repeat_cache)
    checkpointing                              the training forward keeps no KV cache
    reference()                                the frozen reference (hf with LoRA: adapters off)
    forward(..., logits_to_keep=k, use_cache=b)  the head on the last k positions; a cache
                                               built in a training forward too (the update's
                                               prompt_once forward)
    forward(idx, pos, key_mask (B, T, Tk), ...)  a whole attention mask, which key each query
                                               sees (the update's packed forward)

Two engines: the toy char-level GPT (``model.GPT``, this file's ``load_toy``) and any
``transformers`` causal LM with its tokenizer (``hf.HFPolicy``, imported only when asked
for, so grpo_lab imports without transformers). Sampling (``rollout.sample``: per-prompt
generators, the exponential race, a KV cache shared by a prompt's G completions) and the
log-probs (``rollout.completion_logprobs``) are written once against this surface, so a
data-parallel run of either samples the same tokens on 1 or N processes.
Pick one with ``TrainConfig.policy`` (a name in ``POLICIES``: "toy" | "hf"); ``load_for(cfg)``
builds it; ``load_policy_any(path)`` reads any saved policy or training checkpoint back.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Callable

import torch

from grpo_lab.checkpoint import (CKPT_TAG, load_state_strict, meta_field, read_tensors,
                                 resolve_path, state_without_aliases)  # noqa: F401
from grpo_lab.policies.engine import Engine
from grpo_lab.policies.hf_config import HFConfig
from grpo_lab.registry import lookup

Policy = Engine                   # the interface every policy kind implements (engine.py)


def _load_toy(cfg, path) -> torch.nn.Module:
    from grpo_lab.policies.model import load_policy
    model = load_policy(path)
    model.checkpoint_every, model.autocast = cfg.checkpoint_every, cfg.autocast
    return model


def hf_run_checkpoint(path) -> dict | None:
    """The model config of a policy="hf" run when ``path`` is its training checkpoint (the
    config names the model folder the run started from), else None; reads the header only."""
    if not str(path).endswith(".safetensors") or not resolve_path(path).is_file():
        return None
    from safetensors import safe_open
    try:
        with safe_open(str(resolve_path(path)), framework="pt") as f:
            meta = dict(f.metadata() or {})
    except Exception:                 # not readable: read_tensors names why, when it loads it
        return None
    model_config = meta_field(meta, "model_config", path) if meta.get("model_config") else {}
    return model_config if meta.get("format") == CKPT_TAG and "path" in model_config else None


def _load_hf(cfg, path) -> torch.nn.Module:
    """A transformers model folder (or hub id), or an HF run's training checkpoint: the folder it
    started from with the checkpoint's weights (a run started from another run)."""
    from grpo_lab.models import check_finite
    from grpo_lab.policies.hf import HFPolicy, add_lora, load_hf_policy   # lazy: an extra
    hf, run = cfg.hf, hf_run_checkpoint(path)
    run_lora = (run or {}).get("lora_r", 0)         # the run trained LoRA adapters, not weights
    policy = load_hf_policy(run["path"] if run else path, dtype=hf.dtype, autocast=hf.autocast,
                            chat_template=hf.chat_template,
                            trust_remote_code=hf.trust_remote_code,
                            system_prompt=cfg.system_prompt,
                            gradient_checkpointing=cfg.checkpoint_every
                            or int(hf.gradient_checkpointing),
                            sample_dtype=hf.sample_dtype,
                            lora_r=run_lora or hf.lora_r,
                            lora_alpha=run.get("lora_alpha", 0) if run_lora else hf.lora_alpha,
                            decoder=hf.decoder, seed=getattr(cfg, "seed", 0))
    if run:
        load_state_strict(policy, read_tensors(path)[0], path, prefix="policy.")
    if run_lora:       # what that run trained is W + (alpha / r) B A: this run starts from it,
        model = policy.model.merge_and_unload().requires_grad_(True)   # peft froze them
        if hf.lora_r:                                    # fresh adapters if this run has LoRA
            model = add_lora(model, hf.lora_r, hf.lora_alpha, getattr(cfg, "seed", 0))
        policy = HFPolicy(model, policy.tokenizer, replace(policy.cfg, lora_r=hf.lora_r,
                                                           lora_alpha=hf.lora_alpha)).train()
    check_finite(policy, str(path))        # NaN weights, named here rather than as "logp is nan"
    return policy


@dataclass(frozen=True)
class PolicyKind:
    """A kind of policy ``TrainConfig.policy`` can name, with what config.py checks as fields."""
    name: str
    load: Callable                # (cfg, path) -> policy, on the CPU, in training mode
    file_based: bool              # base_checkpoint is a grpo_lab .safetensors file (else a folder/hub id)
    own_autocast: bool            # autocast=True is its lever (hf has hf.autocast instead)
    description: str = ""
    fused_adamw: bool = False     # the trainer's AdamW runs fused (exchanges.AdamW.fused): hf on,
                                  # toy off (its exact tests compare against a per-tensor Adam)


POLICIES: dict[str, PolicyKind] = {
    "toy": PolicyKind("toy", _load_toy, True, True, "the char-level GPT (model.py)"),
    "hf": PolicyKind("hf", _load_hf, False, False, "a transformers causal LM (hf.py)",
                     fused_adamw=True),
}


def get_policy_kind(name: str) -> PolicyKind:
    return lookup(POLICIES, name, "policy")


def load_for(cfg, path: str | None = None) -> torch.nn.Module:
    """The policy ``cfg`` names (``cfg.policy``), loaded from ``path`` (default
    ``cfg.base_checkpoint``) on the CPU, in training mode, with the config's memory levers:
    ``checkpoint_every`` (toy: ``GPT.checkpoint_every``; hf: transformers' activation
    checkpointing of every k-th layer, ``hf.gradient_checkpointing`` meaning k = 1) and
    ``autocast`` (toy only; hf has ``hf.autocast``)."""
    return get_policy_kind(cfg.policy).load(cfg, cfg.base_checkpoint if path is None else path)


def load_policy_any(path):
    """A policy from a policy file (``model.save_policy``), a transformers model folder
    (hf.py), or a training checkpoint of either (a PPO run's with its critic, critic.py)."""
    from grpo_lab.policies.model import GPT, model_config, policy_from_tensors

    if resolve_path(path).is_dir():
        from grpo_lab.policies.hf import load_hf_policy
        return load_hf_policy(path)
    tensors, meta = read_tensors(path)
    if meta.get("format") != CKPT_TAG:
        return policy_from_tensors(tensors, meta, path)
    hf = meta_field(meta, "model_config", path)
    if "path" in hf:                                   # an HF run: hf.HFPolicyConfig
        from grpo_lab.policies.hf import load_hf_policy
        keep = ("dtype", "autocast", "chat_template", "trust_remote_code", "system_prompt",
                "lora_r", "lora_alpha")                # as the run asked and what it trained
        policy = load_hf_policy(hf["path"], **{k: hf[k] for k in keep if k in hf})
        load_state_strict(policy, tensors, path, prefix="policy.")
        return policy
    policy = GPT(model_config(meta, path, "model_config"))
    if any(k.startswith("policy.value_head.") for k in tensors):   # a PPO run's critic
        from grpo_lab.policies.model import ValueHead, ValueNetwork
        policy.value_head = (ValueHead(policy.cfg.n_embd) if "policy.value_head.proj.weight"
                             in tensors else ValueNetwork(GPT(policy.cfg)))
    load_state_strict(policy, tensors, path, prefix="policy.")
    return policy


def frozen(policy: torch.nn.Module) -> torch.nn.Module:
    """The reference policy: ``policy`` in eval mode with gradients off."""
    return policy.eval().requires_grad_(False)


def check_policy(cfg) -> None:
    """The policy kind ``cfg.policy`` names against the config: the hf fields only with
    policy="hf", a system prompt only with a chat template, the base checkpoint's kind,
    autocast, and what an exchange that shards the weights cannot sample from."""
    kind = get_policy_kind(cfg.policy)
    if cfg.hf.lora_r and cfg.policy != "hf":
        raise ValueError(f"hf.lora_r={cfg.hf.lora_r} adds LoRA adapters to a transformers "
                         f"model: it needs policy='hf' (policy={cfg.policy!r})")
    if cfg.policy != "hf":                     # every hf field is read by policy="hf" only
        given = {f.name: getattr(cfg.hf, f.name) for f in fields(HFConfig)
                 if getattr(cfg.hf, f.name) != f.default}
        if given:
            name, value = next(iter(given.items()))
            raise ValueError(f"hf.{name}={value!r} configures a transformers model, but "
                             f"policy={cfg.policy!r} does not read it: set policy='hf' or "
                             f"drop it")
    if cfg.system_prompt and not (cfg.policy == "hf" and cfg.hf.chat_template):
        raise ValueError(f"system_prompt={cfg.system_prompt[:40]!r}... is a system turn of "
                         f"a chat template: it needs policy='hf' with hf.chat_template=True "
                         f"(policy={cfg.policy!r}, hf.chat_template="
                         f"{cfg.hf.chat_template}); a preset's own prompt is dropped with "
                         f"system_prompt=''")
    if (not kind.file_based and cfg.base_checkpoint.endswith(".safetensors")
            and hf_run_checkpoint(cfg.base_checkpoint) is None):
        raise ValueError(f"policy='hf' loads a transformers model folder or hub id, but "
                         f"base_checkpoint={cfg.base_checkpoint!r} is a grpo_lab file "
                         f"(a toy policy: policy='toy'), not an HF run's training "
                         f"checkpoint")
    if cfg.autocast and not kind.own_autocast:
        raise ValueError("autocast=True is the toy policy's training-forward autocast; "
                         "for policy='hf' set hf.autocast=True (every forward)")
    if cfg.hf.sample_dtype and cfg.exchange.kind.shards_parameters:
        raise ValueError(f"hf.sample_dtype={cfg.hf.sample_dtype!r} samples from a copy of "
                         f"the whole model, but exchange {cfg.exchange.name!r} keeps 1/N of "
                         f"the weights per rank: leave hf.sample_dtype empty "
                         f"(fsdp2.param_dtype gathers the weights in another dtype instead)")
