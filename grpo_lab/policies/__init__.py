"""Policies: what rollout, the objectives and the trainer need from a language model.

``policy`` (the seam every policy meets), ``model`` (the toy char-level GPT with a KV cache),
``hf`` (any ``transformers`` causal LM, LoRA through ``peft``), ``memory`` (what a forward and
backward allocate, measured).
"""
