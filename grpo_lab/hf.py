"""Any ``transformers`` causal LM with its tokenizer as a grpo_lab policy (policy.py's interface).

``HFPolicy`` wraps the model so that ``rollout.sample`` and ``rollout.completion_logprobs``
drive it exactly as they drive the toy GPT: left-padded prompts with explicit position ids
and a key mask (``attention_mask``), the prompt's KV cache (a transformers ``Cache``)
computed once and repeated for its G completions (``repeat_cache``), per-prompt generators
and the exponential race in the sampler, so an N-process run samples what one process does.
Tasks stay text in, text out: ``encode``/``decode`` are the tokenizer's.

Deviations from using the model as it ships, on purpose:
  * Dropout is switched off (config and modules): RL needs the sampling policy and the
    trained policy to agree (the ratio is 1 on the first update).
  * ``encode`` adds no special tokens (an answer is tokenized apart from its prompt, as it
    is sampled); ``hf_chat_template`` wraps a prompt as one user turn instead, which brings
    the model's own BOS and turn markers.
  * ``decode`` cuts at <eos> and strips surrounding whitespace (BPE tokenizers glue a space
    to the next word; the tasks' answers have none).
  * A tokenizer without a pad token pads with <eos>: safe here, because every mask is built
    from lengths, never from ``ids != pad``. Without an eos token sampling could never stop:
    that is an error.
Imported lazily (``policy.load_for``): grpo_lab itself never needs transformers.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn

from grpo_lab.checkpoint import REPO_ROOT, resolve_path
from grpo_lab.models import resolve as resolve_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop",
                  "attn_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob")


@dataclass
class HFPolicyConfig:
    """How an HFPolicy was built; ``vars()`` of it is a training checkpoint's model_config."""
    path: str                     # the folder or hub id it was loaded from
    block_size: int               # longest prompt + completion (max_position_embeddings)
    vocab_size: int               # rows of the output layer
    dtype: str = "float32"
    autocast: bool = False
    chat_template: bool = False
    trust_remote_code: bool = False
    gradient_checkpointing: int = 0  # k: checkpoint every k-th layer (True, from older runs, is 1)
    system_prompt: str = ""       # chat_template: a system turn before each prompt ("": none)


def transformers_module():
    try:
        import transformers
    except ImportError as e:
        raise ImportError('policy="hf" needs transformers and tokenizers: '
                          'pip install -e ".[hf]"') from e
    return transformers


def model_location(path: str | Path) -> str:
    """A local model folder (as given, or relative to the repository root), a model name of
    models.MODELS (its folder in the cache, ``grpo-lab model get NAME``), a ``.gguf`` file
    (converted once into the cache) or a hub id; a clear error naming ``path`` otherwise."""
    path = resolve_model(str(path))
    p = resolve_path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"model folder {str(p)!r} has no config.json: not a "
                                    f"transformers model (save one with save_pretrained)")
        return str(p)
    s = str(path)
    head = s.split("/")[0]
    hub_id = (s.count("/") == 1 and not s.startswith((".", "/", "~")) and not p.exists()
              and not Path(head).exists() and not (REPO_ROOT / head).exists())
    if not hub_id:
        raise FileNotFoundError(f"no transformers model folder at {s!r} (looked in {str(p)!r}); "
                                f"give a folder holding config.json and the tokenizer, or a "
                                f"hub id such as 'Qwen/Qwen2.5-0.5B-Instruct'")
    return s


def pad_and_eos(tokenizer, where: str) -> tuple[int, int]:
    """(pad id, eos id) of ``tokenizer``; pad falls back to eos; no eos is an error."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"the tokenizer of {where!r} has no eos token, so a completion could "
                         f"never stop; give it one (tokenizer.eos_token = ...; save_pretrained)")
    pad = tokenizer.pad_token_id
    return (eos if pad is None else pad), eos


class HFPolicy(nn.Module):
    """A transformers causal LM + tokenizer behind policy.Policy."""

    def __init__(self, model: nn.Module, tokenizer, cfg: HFPolicyConfig):
        super().__init__()
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.pad_id, self.eos_id = pad_and_eos(tokenizer, cfg.path)
        params = inspect.signature(model.forward).parameters      # transformers 5: "cache"
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def encode(self, text: str) -> list[int]:
        if self.cfg.chat_template:
            system = ([{"role": "system", "content": self.cfg.system_prompt}]
                      if self.cfg.system_prompt else [])
            ids = self.tokenizer.apply_chat_template(system + [{"role": "user", "content": text}],
                                                     add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if not isinstance(ids, list) else ids
            return list(ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    @staticmethod
    def repeat_cache(cache, G: int):
        """The prompts' Cache with each row repeated G times (in place): (B, ...) -> (B*G, ...)."""
        cache.batch_repeat_interleave(G)
        return cache

    def forward(self, idx: torch.Tensor, pos: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None, cache=None, return_hidden: bool = False):
        """Logits for ``idx`` (B, T) -> ((B, T, V), cache): the toy GPT's signature.

        pos: (B, T) position ids; key_mask: (B, Tk) bool over cached + new keys. A cache is
        built only in eval mode (sampling); a training forward keeps no KV cache.
        ``return_hidden`` adds the last hidden states (B, T, C) (embeddings.policy_embed)."""
        mask = None if key_mask is None else key_mask.long()              # (B, Tk)
        with torch.autocast(idx.device.type, torch.bfloat16, enabled=self.cfg.autocast):
            out = self.model(input_ids=idx, attention_mask=mask, position_ids=pos,
                             use_cache=not self.training, output_hidden_states=return_hidden,
                             **{self._cache_arg: cache})
        if return_hidden:
            return out.logits, getattr(out, self._cache_arg), out.hidden_states[-1]
        return out.logits, getattr(out, self._cache_arg)                   # (B, T, V)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, out_dir: str | Path) -> None:
        """Write the model and its tokenizer as a transformers folder (reloadable here)."""
        self.model.save_pretrained(str(out_dir))
        self.tokenizer.save_pretrained(str(out_dir))


def no_dropout(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0


def load_hf_policy(path: str | Path, dtype: str = "float32", autocast: bool = False,
                   chat_template: bool = False, trust_remote_code: bool = False,
                   gradient_checkpointing: int = 0, system_prompt: str = "") -> HFPolicy:
    """An HFPolicy from a local folder (or a hub id: transformers downloads it on your
    machine), in training mode on the CPU, dropout off. ``gradient_checkpointing`` k > 0:
    activation checkpointing of layers 0, k, 2k, ... (transformers' ``every_n_layers``; True
    is 1, every layer), the toy GPT's ``checkpoint_every`` rule."""
    tf = transformers_module()
    tf.utils.logging.disable_progress_bar()             # no "Loading weights" bar per load
    where = model_location(path)
    if dtype not in DTYPES:
        raise ValueError(f"unknown hf_dtype {dtype!r}; known: {sorted(DTYPES)}")
    try:
        tokenizer = tf.AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code)
        config = tf.AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code)
        for name in DROPOUT_FIELDS:
            if isinstance(getattr(config, name, None), float):
                setattr(config, name, 0.0)
        model = tf.AutoModelForCausalLM.from_pretrained(
            where, config=config, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code)
    except OSError as e:
        raise FileNotFoundError(f"could not load a transformers model from {str(path)!r}: "
                                f"{e}") from None
    no_dropout(model)
    k = int(gradient_checkpointing)
    if k:
        enable = getattr(model, "activation_checkpointing_enable", None)   # transformers >= 5
        if enable is not None and "every_n_layers" in inspect.signature(enable).parameters:
            enable(every_n_layers=k)
        elif k == 1:                                    # the old name, every layer
            model.gradient_checkpointing_enable()
        else:
            raise ValueError(f"checkpointing every {k}-th layer needs transformers' "
                             f"every_n_layers (transformers >= 5.24); this one checkpoints "
                             f"every layer only: use checkpoint_every=1")
    block = getattr(model.config, "max_position_embeddings", None) or tokenizer.model_max_length
    cfg = HFPolicyConfig(str(path), int(block), int(model.get_output_embeddings().weight.shape[0]),
                         dtype, autocast, chat_template, trust_remote_code, k, system_prompt)
    return HFPolicy(model, tokenizer, cfg).train()


# ---- the offline test model: a tiny Llama-style model and a BPE tokenizer, built here

TINY_SPECIALS = ("<pad>", "<eos>")


def build_tiny_tokenizer(tasks: Sequence[str], vocab_size: int = 96, seed: int = 0):
    """A byte-pair tokenizer trained here (``tokenizers``, no download) on 4000 seeded task
    demonstrations: digits and punctuation stay single tokens, letters merge; <pad>=0,
    <eos>=1 -> a transformers tokenizer."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from grpo_lab.tasks import ALPHABET, sample_examples

    tf = transformers_module()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.Punctuation()])
    tok.decoder = decoders.Fuse()                        # tokens are substrings: concatenate
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(TINY_SPECIALS),
                                  initial_alphabet=list(ALPHABET), show_progress=False)
    exs = sample_examples(list(tasks), 4000, random.Random(seed))
    tok.train_from_iterator([t for e in exs for t in (e.prompt, e.answer)], trainer)
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def build_tiny(tasks: Sequence[str], n_layer: int = 3, n_head: int = 4, n_embd: int = 96,
               block_size: int = 64, seed: int = 0) -> HFPolicy:
    """A randomly initialised Llama-style model (RoPE, RMSNorm, SwiGLU, grouped-query
    attention, tied embeddings: Qwen2.5's shape in miniature) and its tokenizer."""
    tf = transformers_module()
    tokenizer = build_tiny_tokenizer(tasks, seed=seed)
    config = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=n_embd,
                            intermediate_size=8 * n_embd // 3 // 8 * 8, num_hidden_layers=n_layer,
                            num_attention_heads=n_head, num_key_value_heads=max(1, n_head // 2),
                            max_position_embeddings=block_size, tie_word_embeddings=True,
                            pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(config)
    cfg = HFPolicyConfig("<built by hf.build_tiny>", block_size, len(tokenizer))
    return HFPolicy(model, tokenizer, cfg).train()
