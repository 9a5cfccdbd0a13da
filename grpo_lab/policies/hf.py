"""Any ``transformers`` causal LM with its tokenizer as a grpo_lab policy (policy.py's interface).

``HFPolicy`` wraps the model so that ``rollout.sample`` and ``rollout.completion_logprobs``
drive it exactly as they drive the toy GPT: left-padded prompts with explicit position ids
and a key mask (``attention_mask``), the prompt's KV cache (a transformers ``Cache``)
computed once and repeated for its G completions (``repeat_cache``; a prefix every prompt
of the batch shares, such as a chat template's system turn, once for the whole batch:
``engine.prefill_shared``), per-prompt generators
and the exponential race in the sampler, so an N-process run samples what one process does.
Tasks stay text in, text out: ``encode``/``decode`` are the tokenizer's.

Deviations from using the model as it ships, on purpose:
  * Dropout is switched off (config and modules): RL needs the sampling policy and the
    trained policy to agree (the ratio is 1 on the first update).
  * ``encode`` adds no special tokens (an answer is tokenized apart from its prompt, as it
    is sampled); ``hf.chat_template`` wraps a prompt as one user turn instead, which brings
    the model's own BOS and turn markers.
  * ``decode`` cuts at <eos> and strips surrounding whitespace (BPE tokenizers glue a space
    to the next word; the tasks' answers have none).
  * A tokenizer without a pad token pads with <eos>: safe here, because every mask is built
    from lengths, never from ``ids != pad``. Without an eos token sampling could never stop:
    that is an error.
  * ``sample_dtype`` (e.g. bfloat16): forwards in eval mode without gradients (sampling,
    evaluation, a frozen reference) run a copy of the model in that dtype, refreshed from the
    master weights whenever one of them changed (tensor version counters); the trainer's
    forward keeps the master dtype (with ``autocast`` if set). The sampler's log-probs then
    differ from the trainer's by the rounding of bf16 weights (tests/test_speed_levers.py
    bounds it; BENCHMARKS.md section 15); the ratio of the first update is not exactly 1.
    It pays only where bf16 matmuls are native (AVX-512 BF16, AMX, GPUs): on an AVX2 CPU
    they run 4-9x slower than fp32.
  * ``lora_r`` > 0: the model is wrapped by ``peft`` (LoRA, Hu et al. 2021, on every linear
    layer but the head, dropout 0); only the adapters train. The reference policy is the
    same model with its adapters off (``AdaptersOff``), so beta > 0 keeps no second model.
  * ``decoder`` "lean" (the default): the sampler's one-token forwards of a Llama-style model
    (fp32 or the bf16 sampling copy, LoRA adapters included; not fp32 under autocast) run
    ``decoder.LlamaDecoder``, the model's arithmetic without transformers' per-call
    machinery, on its own static KV cache (``start_decode``); the prefill, the update and
    every other forward stay transformers'.
    Its logits equal transformers' within the dtype's rounding, so a token may differ where
    a draw falls within that rounding of a boundary; 1 and N processes still sample alike.
Imported lazily (``policy.load_for``): grpo_lab itself never needs transformers.
"""
from __future__ import annotations

import copy
import inspect
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn
from safetensors import SafetensorError
from torch.nn.attention import SDPBackend, sdpa_kernel

from grpo_lab.models import resolve as resolve_model
from grpo_lab.paths import REPO_ROOT, resolve_path
from grpo_lab.policies.engine import Engine
from grpo_lab.policies.hf_config import DECODE_PATHS, DTYPES, HFConfig
from grpo_lab.registry import lookup

UPDATE_ATTENTION: SDPBackend | None = SDPBackend.MATH
"""sdpa's kernel in a bf16 (autocast) forward with gradients on the CPU, the update's: the
math kernel, whose backward is autograd's over its matmuls and softmax, where the CPU flash
kernel's bf16 backward took ~17 ms a layer at SmolLM2's packed update shape (8 x 9 heads x 160
x 64), 9x its forward: the update 0.2 s less a step on an AMX Xeon (BENCHMARKS section 34);
both land within bf16 rounding of float64 attention. The math kernel keeps each layer's
(B, heads, T, Tk) scores for the backward, so it runs up to ``MATH_MAX_T`` queries and keys
only (SmolLM2 at B 8 x 160: ~0.45 GB more peak memory). None: sdpa picks (flash on the CPU)."""
MATH_MAX_T = 256
"""The most positions (queries, and keys with a cache's) a forward under ``UPDATE_ATTENTION``
has."""
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
    sample_dtype: str = ""        # dtype of the copy that eval-mode no-grad forwards run ("": none)
    lora_r: int = 0               # LoRA rank (0: full fine-tuning)
    lora_alpha: int = 0           # LoRA scale numerator (0: 2 * lora_r)
    decoder: str = "lean"         # the sampler's one-token forwards (HFConfig.decoder)


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


class HFPolicy(Engine):
    """A transformers causal LM + tokenizer: an engine.Engine."""

    def __init__(self, model: nn.Module, tokenizer, cfg: HFPolicyConfig):
        super().__init__()
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.pad_id, self.eos_id = pad_and_eos(tokenizer, cfg.path)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model   # peft
        params = inspect.signature(base.forward).parameters       # transformers 5: "cache"
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        object.__setattr__(self, "_copy", None)     # the sample_dtype copy: not a submodule
        object.__setattr__(self, "_copied", None)   # master weights' (data_ptr, version) then
        object.__setattr__(self, "_leans", {})      # sample_dtype -> decoder.LlamaDecoder or
                                                    # False, built on first use

    def encode(self, text: str) -> list[int]:
        if self.cfg.chat_template:
            if not getattr(self.tokenizer, "chat_template", None):   # transformers' own error
                raise ValueError(f"hf.chat_template=True wraps each prompt in the tokenizer's "
                                 f"chat template, but the tokenizer of {self.cfg.path!r} has "
                                 f"none (a base model): set hf.chat_template=False, or give "
                                 f"it one (tokenizer.chat_template = ...; save_pretrained)")
            system = ([{"role": "system", "content": self.cfg.system_prompt}]
                      if self.cfg.system_prompt else [])
            ids = self.tokenizer.apply_chat_template(system + [{"role": "user", "content": text}],
                                                     add_generation_prompt=True, tokenize=True)
            return list(ids if isinstance(ids, list) else ids["input_ids"])
        return self.encode_plain(text)

    def encode_plain(self, text: str) -> list[int]:
        """``text`` as tokens, never wrapped in the chat template (an environment's
        observation in the middle of the model's turn: agents/episodes.py)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def unknown_chars(self, text: str) -> list[str]:
        """The characters of ``text`` the tokenizer does not give back (each encoded alone,
        no special tokens): a BPE without byte fallback drops them silently (data/hf_tiny
        drops 'W'); a byte-level one (SmolLM2, Qwen) gives back every character."""
        tok = self.tokenizer
        return sorted(c for c in set(text)
                      if tok.decode(tok.encode(c, add_special_tokens=False)) != c)

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

    @staticmethod
    def select_cache(cache, rows: torch.Tensor):
        """Keep the Cache's rows ``rows`` (n,) long (in place): (N, ...) -> (n, ...)."""
        cache.batch_select_indices(rows)               # a transformers Cache or a StaticCache
        return cache

    def lean_decoder(self):
        """``decoder.LlamaDecoder`` for the model that samples (the ``sample_dtype`` copy where
        there is one, else this model), or None where transformers' forward runs the decode
        steps (``cfg.decoder`` "transformers", fp32 sampling under autocast, an architecture
        ``decoder.DECODERS`` does not know)."""
        if self.cfg.decoder != "lean" or (self.cfg.autocast and not self.cfg.sample_dtype):
            return None
        key = self.cfg.sample_dtype                 # one decoder per model that samples
        if key not in self._leans:
            from grpo_lab.policies.decoder import decoder_for
            self._leans[key] = decoder_for(self.sampling_copy() if key else self.model) or False
        return self._leans[key] or None

    def start_decode(self, cache, G: int, max_new_tokens: int):
        """The prompts' cache (B rows) -> the decode cache of B*G rows: a
        ``decoder.StaticCache`` with room for ``max_new_tokens`` columns when the lean decoder
        applies, else transformers' Cache repeated (``repeat_cache``)."""
        lean = self.lean_decoder()
        return self.repeat_cache(cache, G) if lean is None else lean.start(cache, G, max_new_tokens)

    @property
    def checkpointing(self) -> bool:
        """The training forward recomputes activations (and keeps no KV cache)."""
        return bool(self.cfg.gradient_checkpointing)

    def sampling_copy(self) -> nn.Module:
        """The model in ``cfg.sample_dtype``, its weights those of the master model now: a
        weight is copied again only when its tensor changed (an optimizer step bumps the
        version counter of every weight it updates; frozen LoRA base weights never do)."""
        now = [(p.data_ptr(), p._version) for p in self.model.parameters()]
        if self._copy is None:
            object.__setattr__(self, "_copy", copy.deepcopy(self.model).to(
                DTYPES[self.cfg.sample_dtype]).eval().requires_grad_(False))
            object.__setattr__(self, "_copied", [None] * len(now))
            head = self._copy.get_output_embeddings()
            if head is not None:
                head.register_forward_pre_hook(_contiguous_input)
        with torch.no_grad():
            for c, p, v, old in zip(self._copy.parameters(), self.model.parameters(), now,
                                    self._copied):
                if v != old:
                    c.copy_(p)
        object.__setattr__(self, "_copied", now)
        return self._copy

    def forward(self, idx: torch.Tensor, pos: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None, cache=None, return_hidden: bool = False,
                logits_to_keep: int = 0, use_cache: bool | None = None):
        """Logits for ``idx`` (B, T) -> ((B, T, V), cache): the toy GPT's signature.

        pos: (B, T) position ids; key_mask: (B, Tk) bool over cached + new keys, or (B, T, Tk)
        bool, which keys each query sees (engine.packed_logits; an attention implementation
        that takes boolean masks: sdpa, transformers' default). A cache is built in eval mode
        (sampling) or when ``use_cache``; a training forward keeps none.
        ``logits_to_keep`` k > 0: the head on the last k positions only -> (B, k, V).
        ``return_hidden`` adds the last hidden states (B, T, C) (embeddings.policy_embed)."""
        lean = self._leans.get(self.cfg.sample_dtype)
        if lean and not self.training and not torch.is_grad_enabled():
            from grpo_lab.policies.decoder import StaticCache              # loaded with lean
            if isinstance(cache, StaticCache):                            # start_decode's cache
                logits = lean.step(idx[:, 0], pos[:, 0], key_mask, cache)  # (B, V)
                return logits[:, None], cache                             # one new token a row
        mask = None if key_mask is None else key_mask.long()              # (B, Tk)
        if key_mask is not None and key_mask.dim() == 3:   # who sees whom (packed_logits):
            mask = key_mask[:, None]     # (B, 1, T, Tk) bool; transformers takes 4-D as given
        model = self.model
        if self.cfg.sample_dtype and not self.training and not torch.is_grad_enabled():
            model = self.sampling_copy()
        keys = idx.shape[1] if key_mask is None else key_mask.shape[-1]   # cached + new
        kernel = (sdpa_kernel(UPDATE_ATTENTION) if UPDATE_ATTENTION and self.cfg.autocast
                  and torch.is_grad_enabled() and idx.device.type == "cpu"
                  and max(idx.shape[1], keys) <= MATH_MAX_T else nullcontext())  # the update's
        with torch.autocast(idx.device.type, torch.bfloat16, enabled=self.cfg.autocast), kernel:
            out = model(input_ids=idx, attention_mask=mask, position_ids=pos,
                        use_cache=not self.training if use_cache is None else use_cache,
                        output_hidden_states=return_hidden, logits_to_keep=logits_to_keep,
                        **{self._cache_arg: cache})
        if return_hidden:
            return out.logits, getattr(out, self._cache_arg), out.hidden_states[-1]
        return out.logits, getattr(out, self._cache_arg)                   # (B, T|k, V)

    def reference(self) -> "AdaptersOff":
        """The reference policy of a LoRA run: this model with its adapters off."""
        if not self.cfg.lora_r:
            raise ValueError("reference() is the LoRA run's adapters-off model; without "
                             "lora_r the reference is a frozen copy (policy.frozen)")
        return AdaptersOff(self)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, out_dir: str | Path) -> None:
        """Write the model and its tokenizer as a transformers folder (reloadable here)."""
        self.model.save_pretrained(str(out_dir))
        self.tokenizer.save_pretrained(str(out_dir))


def _contiguous_input(module: nn.Module, args: tuple) -> tuple:
    """The sampling copy's head gets its input contiguous. transformers hands it the last
    position's hidden states as a slice, (B, 1, C) with the stride of (B, T, C); with a weight
    that requires no gradient torch's CPU matmul then runs a batched product against the
    weight expanded B times, copying it: 1,123 CPU ms for SmolLM2's bf16 head at B = 8 against
    9.3 contiguous on an AMX Xeon (BENCHMARKS section 33). Same products, each row's sums
    unchanged in value up to rounding order."""
    x = args[0]
    return args if x.is_contiguous() else (x.contiguous(), *args[1:])


class AdaptersOff(Engine):
    """An HFPolicy with its LoRA adapters disabled for each forward: the base model, which is
    the reference policy of a LoRA run, with no second copy of the weights. Call it without
    gradients (its parameters are the trained policy's)."""

    def __init__(self, policy: HFPolicy):
        super().__init__()
        self.policy = policy
        self.pad_id, self.eos_id, self.cfg = policy.pad_id, policy.eos_id, policy.cfg
        self.repeat_cache, self.select_cache = policy.repeat_cache, policy.select_cache

    @property
    def checkpointing(self) -> bool:
        return self.policy.checkpointing

    def forward(self, *args, **kw):
        with self.policy.model.disable_adapter():
            return self.policy(*args, **kw)


def add_lora(model: nn.Module, r: int, alpha: int = 0, seed: int = 0) -> nn.Module:
    """``model`` wrapped by peft with rank-``r`` LoRA adapters on every linear layer but the
    output head, scale alpha / r (alpha 0: 2r), dropout 0; only the adapters train. peft draws
    the A matrices from torch's global generator: drawn here under ``seed`` (the run's), so two
    runs with one seed start from the same adapters and the caller's generator is untouched."""
    if r < 1:
        raise ValueError(f"lora_r must be >= 1 to add adapters, got {r}")
    dims = [(min(m.in_features, m.out_features), n) for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and m is not model.get_output_embeddings()]
    if dims and r > min(dims)[0]:
        d, name = min(dims)
        raise ValueError(f"lora_r={r} is above the rank of layer {name!r} ({d}: min(in, out) "
                         f"features): a rank-{r} adapter there costs more than the weight it "
                         f"adapts and adds nothing; use lora_r <= {d} (typical: 8-64)")
    try:
        import peft
    except ImportError as e:
        raise ImportError('lora_r > 0 needs peft: pip install -e ".[lora]"') from e
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha or 2 * r, lora_dropout=0.0,
                          target_modules="all-linear", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peft.get_peft_model(model, cfg)


def no_dropout(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0


def load_hf_policy(path: str | Path, dtype: str = "float32", autocast: bool = False,
                   chat_template: bool = False, trust_remote_code: bool = False,
                   gradient_checkpointing: int = 0, system_prompt: str = "",
                   sample_dtype: str = "", lora_r: int = 0, lora_alpha: int = 0,
                   decoder: str = "lean", seed: int = 0) -> HFPolicy:
    """An HFPolicy from a local folder (or a hub id: transformers downloads it on your
    machine), in training mode on the CPU, dropout off. ``gradient_checkpointing`` k > 0:
    activation checkpointing of layers 0, k, 2k, ... (transformers' ``every_n_layers``; True
    is 1, every layer), the toy GPT's ``checkpoint_every`` rule. ``sample_dtype``: the dtype
    of the copy eval-mode forwards run (module docstring); ``lora_r`` > 0: LoRA adapters."""
    tf = transformers_module()
    tf.utils.logging.disable_progress_bar()             # no "Loading weights" bar per load
    where = model_location(path)
    for name, d in (("hf.dtype", dtype), ("hf.sample_dtype", sample_dtype or "float32")):
        lookup(DTYPES, d, name)
    lookup(DECODE_PATHS, decoder, "hf.decoder")
    step = "the tokenizer"
    try:
        tokenizer = tf.AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code)
        step = "the config"
        config = tf.AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code)
        for name in DROPOUT_FIELDS:
            if isinstance(getattr(config, name, None), float):
                setattr(config, name, 0.0)
        step = "the weights"
        model, info = tf.AutoModelForCausalLM.from_pretrained(
            where, config=config, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code,
            output_loading_info=True)
    except OSError as e:
        raise FileNotFoundError(f"could not load a transformers model from {str(path)!r}: "
                                f"{e}") from None
    except (ValueError, RuntimeError, SafetensorError) as e:
        # transformers' own messages (no tokenizer file, a corrupt safetensors header, a
        # tensor of another shape) name neither the folder nor what was being read
        raise ValueError(f"could not load {step} of {str(path)!r}: {type(e).__name__}: "
                         f"{e}") from e
    missing = info["missing_keys"]
    if missing:                 # transformers only logs these and starts them random
        raise ValueError(f"the weights in {str(path)!r} do not fit its config's "
                         f"{type(model).__name__}: {len(missing)} of its tensors are not in "
                         f"the checkpoint ({', '.join(sorted(missing)[:3])}, ...) and would "
                         f"start random; its config.json and its weights are of different "
                         f"models")
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
    vocab = int(model.get_output_embeddings().weight.shape[0])
    if lora_r:
        model = add_lora(model, lora_r, lora_alpha, seed)
    cfg = HFPolicyConfig(str(path), int(block), vocab, dtype, autocast, chat_template,
                         trust_remote_code, k, system_prompt, sample_dtype, lora_r, lora_alpha,
                         decoder)
    return HFPolicy(model, tokenizer, cfg).train()


# ---- the offline test model: a tiny Llama-style model and a BPE tokenizer, built here

TINY_SPECIALS = ("<pad>", "<eos>")


def build_tiny_tokenizer(tasks: Sequence[str], vocab_size: int = 96, seed: int = 0):
    """A byte-pair tokenizer trained here (``tokenizers``, no download) on 4000 seeded task
    demonstrations: digits and punctuation stay single tokens, letters merge; <pad>=0,
    <eos>=1 -> a transformers tokenizer."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from grpo_lab.tasks import ALPHABET, get_task, sample_examples

    tf = transformers_module()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.Punctuation()])
    tok.decoder = decoders.Fuse()                        # tokens are substrings: concatenate
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(TINY_SPECIALS),
                                  initial_alphabet=list(ALPHABET), show_progress=False)
    exs = sample_examples([get_task(t) for t in tasks], 4000, random.Random(seed))
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
