"""A TRL ``GRPOConfig`` file read by ``--config``: TRL's key names where grpo_lab has the same
setting (TRL 1.16.0's ``trl/trainer/grpo_config.py`` and the ``TrainingArguments`` it extends).

``RENAMED`` maps a TRL key to the grpo_lab field that means the same thing; ``CONVERTED`` maps
a TRL key whose values are spelled differently to a function (value -> {grpo_lab field:
value}); keys spelled alike in both (``temperature``, ``top_p``, ``top_k``, ``seed``,
``weight_decay``, ``warmup_steps``, ``report_to``) need nothing.
The batch keys are one computation (``batch``): TRL samples a *generation batch* of
``per_device_train_batch_size * gradient_accumulation_steps * processes`` completions per
optimizer step (``steps_per_generation`` defaults to the accumulation steps), that is
``generation batch / num_generations`` prompts: grpo_lab's ``prompts_per_step`` (global,
over every process; the file is read as written for one process). A TRL key in
``NO_EQUIVALENT`` is refused by name. docs/guide/methods.md ("A TRL GRPOConfig file") is the
table for people; a test checks that every key here is in it.

Settings the file does not give keep grpo_lab's defaults, which are not TRL's (TRL: lr 1e-6,
beta 0, loss_type "dapo", linear decay; grpo_lab: the preset's).
"""
from __future__ import annotations

RENAMED = {
    "learning_rate": "lr",
    "num_generations": "group_size",
    "max_completion_length": "max_new_tokens",
    "max_steps": "steps",
    "num_iterations": "mu",
    "epsilon_high": "clip.eps_high",
    "beta": "kl.beta",
    "top_entropy_quantile": "top_entropy.quantile",
    "entropy_coef": "entropy_bonus.coef",
    "max_grad_norm": "grad_clip",
    "adam_epsilon": "adam_eps",
    "output_dir": "out_dir",
    "save_steps": "ckpt_every",
    "off_policy_mask_threshold": "off_policy_mask.delta",
    "use_bias_correction_kl": "kl.bias_correction",
}


def _choice(key: str, table: dict):
    def convert(value):
        try:
            return table[value]
        except (KeyError, TypeError):                      # TypeError: a list, a dict
            raise ValueError(f"{key}={value!r} has no grpo_lab equivalent (these have: "
                             f"{', '.join(map(repr, table))})") from None
    return convert


CONVERTED = {
    # TRL: epsilon is the lower clip, and the upper one unless epsilon_high is given
    "epsilon": lambda v: {"clip.eps_low": v, "clip.eps_high": v},
    "loss_type": _choice("loss_type", {
        "grpo": {"loss.aggregation": "seq_mean_token_mean"},
        "dapo": {"loss.aggregation": "token_mean"},          # over the step's tokens, all ranks
        "dr_grpo": {"loss.aggregation": "dr_grpo"},          # constant: max_completion_length
        # TRL 1.16 _compute_loss: -clamp(coef_1, max=epsilon_high).detach() * A * logp, over
        # num_items_in_batch (the global tokens); epsilon_high is the cap: cispo_cap()
        "cispo": {"loss.policy": "cispo", "loss.aggregation": "token_mean"}}),
    "scale_rewards": _choice("scale_rewards", {
        "group": {"advantage": "grpo"}, True: {"advantage": "grpo"},
        "none": {"advantage": "mean_centred"}, False: {"advantage": "mean_centred"}}),
    "importance_sampling_level": _choice("importance_sampling_level", {
        "token": {"loss.ratio_level": "token"},
        "sequence": {"loss.ratio_level": "sequence"}}),
    "mask_truncated_completions": _choice("mask_truncated_completions", {
        True: {"overlong.rule": "mask"}, False: {"overlong.rule": "none"}}),
    "lr_scheduler_type": _choice("lr_scheduler_type", {"constant": {"lr_schedule": "constant"}}),
}

BATCH = ("per_device_train_batch_size", "gradient_accumulation_steps",
         "generation_batch_size", "steps_per_generation")

NO_EQUIVALENT = {
    # GRPOConfig
    "model_init_kwargs", "trust_remote_code", "router_aux_loss_coef", "disable_dropout",
    "remove_unused_columns", "num_generations_eval", "shuffle_dataset", "pad_to_multiple_of",
    "min_p", "generation_kwargs", "chat_template_kwargs", "repetition_penalty",
    "cache_implementation", "use_vllm", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode",
    "vllm_structured_outputs_regex", "vllm_server_base_url", "vllm_server_host",
    "vllm_server_port", "vllm_server_timeout", "vllm_group_port", "vllm_gpu_memory_utilization",
    "vllm_max_model_length", "vllm_tensor_parallel_size", "delta", "sapo_temperature_neg",
    "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg",
    "multi_objective_aggregation", "sync_ref_model",
    "ref_model_mixup_alpha", "ref_model_sync_steps",
    "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta",
    "entropy_target", "max_tool_calling_iterations", "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap", "log_completions",
    "log_multimodal", "num_completions_to_print", "log_unique_prompts",
    "log_completions_hub_repo", "use_transformers_continuous_batching",
    "transformers_continuous_batching_config", "use_transformers_paged", "max_prompt_length",
    # TrainingArguments
    "num_train_epochs", "per_device_eval_batch_size", "eval_strategy", "eval_steps",
    "logging_steps", "logging_strategy", "logging_dir", "save_strategy", "save_total_limit",
    "bf16", "fp16", "tf32", "gradient_checkpointing", "gradient_checkpointing_kwargs",
    "warmup_ratio", "adam_beta1", "adam_beta2", "optim", "lr_scheduler_kwargs",
    "push_to_hub", "hub_model_id", "run_name", "dataloader_num_workers", "ddp_timeout",
    "overwrite_output_dir", "do_train", "do_eval", "label_names", "data_seed",
    "deepspeed", "fsdp", "fsdp_config", "torch_compile", "use_cpu", "local_rank",
}
"""TRL keys with no grpo_lab setting (or none that means the same: ``num_train_epochs``
counts passes over a dataset, grpo_lab draws fresh prompts; ``delta`` is another formula).
TRL applies its vLLM IS keys only with ``use_vllm``, so a file's are refused with
``VLLM_IS``'s hint: the same modes are grpo_lab's ``tis.level`` under TRL's names, for a sampler
that differs from the trainer (``--rollout vllm``). ``reward_weights`` shares grpo_lab's name and
is read as grpo_lab's (the table says how they differ)."""

VLLM_IS = {"vllm_importance_sampling_correction": "tis.cap > 0",
           "vllm_importance_sampling_mode": "tis.level (TRL's four names)",
           "vllm_importance_sampling_clip_max": "tis.cap",
           "vllm_importance_sampling_cap": "tis.cap",
           "vllm_importance_sampling_clip_min": "tis.floor"}
"""TRL's vLLM IS keys -> the grpo_lab setting of the same meaning, named in their refusal."""


def batch(flat: dict) -> dict:
    """TRL's batch keys -> {"prompts_per_step": generation batch / num_generations} (one
    process); the rules TRL's GRPOConfig.__post_init__ checks, with its messages' numbers."""
    per_device = flat.get("per_device_train_batch_size", 8)                 # TRL's defaults
    accumulation = flat.get("gradient_accumulation_steps", 1)
    steps = flat.get("steps_per_generation")
    if steps is not None and steps != accumulation:
        raise ValueError(f"steps_per_generation={steps} with gradient_accumulation_steps="
                         f"{accumulation}: TRL then takes several optimizer steps per "
                         f"generation batch, which grpo_lab does not (mu repeats the whole "
                         f"batch); leave it out or make them equal")
    generation = flat.get("generation_batch_size") or per_device * accumulation
    group = flat.get("num_generations", 8)
    if generation % group:
        raise ValueError(f"generation batch {generation} (per_device_train_batch_size "
                         f"{per_device} x gradient_accumulation_steps {accumulation}) is not a "
                         f"multiple of num_generations {group}")
    return {"prompts_per_step": generation // group}


def cispo_cap(flat: dict) -> str | None:
    """Under ``loss_type: cispo`` TRL caps the IS weight at ``epsilon_high`` itself (not 1 +
    epsilon_high), and ``epsilon_high`` defaults to ``epsilon``: -> the TRL key that gives the
    cap (grpo_lab's ``clip.cispo_cap``), None where neither is given (grpo_lab's default 5.0,
    TRL's recommended value, stays). CISPO reads no other clip value, so the other key of the
    two is not read, as in TRL."""
    if flat.get("loss_type") != "cispo":
        return None
    return next((k for k in ("epsilon_high", "epsilon") if k in flat), None)


def translate(flat: dict) -> tuple[dict, dict]:
    """A config file's flat {key: value} -> (the same with TRL's keys as grpo_lab's, {grpo_lab
    key: the TRL key it came from}); a TRL key with no equivalent raises, naming them all."""
    refused = sorted(k for k in flat if k in NO_EQUIVALENT)
    if refused:
        hint = "".join(f"; {k} is TRL's, applied with use_vllm only: grpo_lab's {VLLM_IS[k]} "
                       f"with --rollout vllm" for k in refused if k in VLLM_IS)
        raise ValueError(f"TRL GRPOConfig key{'s' * (len(refused) > 1)} with no grpo_lab "
                         f"equivalent: {', '.join(refused)} (the table: docs/guide/methods.md, "
                         f"'A TRL GRPOConfig file'){hint}")
    out, came_from = {}, {}

    def put(key, value, source):
        if key in out:
            raise ValueError(f"{key} is given twice: by {came_from.get(key, key)} and by "
                             f"{source}: give it once")
        out[key], came_from[key] = value, source

    cap = cispo_cap(flat)
    for key, value in flat.items():
        if flat.get("loss_type") == "cispo" and key in ("epsilon", "epsilon_high"):
            if key == cap:
                put("clip.cispo_cap", value, key)
        elif key in RENAMED:
            put(RENAMED[key], value, key)
        elif key in CONVERTED:
            for k, v in CONVERTED[key](value).items():
                if not (key == "epsilon" and k == "clip.eps_high" and "epsilon_high" in flat):
                    put(k, v, key)
        elif key not in BATCH:
            put(key, value, key)
    if any(k in flat for k in BATCH):
        for k, v in batch(flat).items():
            put(k, v, "+".join(k for k in BATCH if k in flat))
    return out, came_from
