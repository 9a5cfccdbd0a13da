"""The measurements behind the claims table (``grpo_lab.claims``): cheap, computed from the library.

Each function measures one thing a claim is about and returns plain numbers; ``LIVE`` is the
registry the table uses: a record per measurement with the function and the sentence it prints,
so ``claims.measure(n)`` is one lookup, never a ladder over claim numbers. Expensive or
multi-seed measurements (real gradients, gradient variance over 3 seeds) run in
``bench/bench_claims.py`` with the same functions and are quoted from its results file.

The arithmetic, once:

  * index coding (claim 3): a uniformly random k-of-n set holds log2 C(n, k) ~ n H(k/n) bits, so
    no coder averages fewer than n H(k/n) / k bits per index: 5.73 at 5% (5.6x against int32).
    Positions that cluster (a whole-model top-k, where a few tensors hold most of the gradient's
    mass) are not random, and a coder that finds the structure can go below it.
  * e4m3 (claim 2): 3 mantissa bits, so rounding moves a value by up to 2^-4 = 6.25% of it.
  * bytes per element (claim 16): fp32 4, fp16 2, an 8-bit format 1 (+ a 4-byte scale per block
    or tensor): -50% and -75% against fp32, whatever the link.
  * Adam memory (claim 6): 16 B/param either way: fp32 weights 4 + gradients 4 + two moments 8,
    or mixed precision 2 + 2 + fp32 master 4 + moments 8. ZeRO-3 divides it by N.
  * ZeRO traffic (claim 26, Rajbhandari et al. 2020, section 7): per rank and step, DDP's ring
    all-reduce sends 2 (N-1)/N of the gradient; ZeRO-1/2's reduce-scatter + all-gather the same;
    ZeRO-3 one more all-gather of the weights, 3 (N-1)/N: at most 1.5x DDP's. Never N-fold.
  * a baseline (claim 29, Williams 1992; DeepSeekMath eq. 3): E[b grad log pi] = 0 for a b that does
    not depend on the sample, so subtracting one leaves the gradient's mean and can only move its
    variance. The group mean includes the sample itself, which scales the mean by (G-1)/G.
"""
from __future__ import annotations

import inspect
import math
import random
import time
from typing import Callable, NamedTuple

import numpy as np
import torch

from grpo_lab.advantages import ADVANTAGES, group_stats
from grpo_lab.distributed import codecs, scaling
from grpo_lab.distributed.topology import CLUSTERS
from grpo_lab.distributed.wire import FORMAT_BYTES
from grpo_lab.loss import grpo_loss
from grpo_lab.model import GPT, GPTConfig

# Dense bf16 tensor-core peaks (no sparsity), from the vendor's data sheets: A100 SXM 312 TFLOPS,
# H100 SXM 989 TFLOPS (1979 "with sparsity").
GPU_PEAK_BF16 = {"A100 SXM": 312e12, "H100 SXM": 989e12}


# --------------------------------------------------------------------------- claims 20, 13, 11, 18

def relative_reward_gradient(rewards=(1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.0, 1.0),
                             group_ids=(0, 0, 0, 0, 1, 1, 1, 1), T: int = 3, seed: int = 0) -> dict:
    """Claim 20: R = sigma_g - mu_g for every member of group g, then every estimator's advantage
    of R and the gradient of ``grpo_loss`` (beta 0) w.r.t. the log-probs. Returns
    {"R" (N,), "advantages" {estimator: (N,)}, "grad" (N, T), "grad_grpo" (N, T): the same loss
    with GRPO's own advantage of the rewards, for contrast}."""
    r, g = torch.tensor(rewards, dtype=torch.float64), torch.tensor(group_ids)
    inv, _, mean, std = group_stats(r, g)                                  # per group (K,)
    R = (std - mean)[inv]                                                  # (N,) one value per group
    adv = {name: fn(R, g) for name, fn in ADVANTAGES.items()}              # each (N,)
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(len(r), T, generator=gen, dtype=torch.float64)       # (N, T) log-probs
    mask = torch.ones(len(r), T, dtype=torch.bool)                         # (N, T)
    grads = {}
    for key, a in (("grad", adv["grpo"]), ("grad_grpo", ADVANTAGES["grpo"](r, g))):
        logp = old.clone().requires_grad_(True)                            # (N, T) at pi = pi_old
        grpo_loss(logp, old, None, a, mask)[0].backward()
        grads[key] = logp.grad                                             # (N, T)
    return {"R": R, "advantages": adv, **grads}


def prompt_kv_bytes(cfg: GPTConfig | None = None, prompt_len: int = 6, completion_len: int = 4,
                    B: int = 16, G: int = 8, bytes_per_value: int = 4) -> dict:
    """Claim 13: KV-cache bytes of one rollout (B prompts x G completions) with the prompt's
    cache stored once per prompt ("shared") or once per completion ("copied", what
    ``rollout.sample`` does: ``repeat_interleave``). Per token: k and v, n_layer x n_embd each."""
    cfg = cfg or GPTConfig()
    per_token = 2 * cfg.n_layer * cfg.n_embd * bytes_per_value
    prompt_once = B * prompt_len * per_token
    completions = B * G * completion_len * per_token
    shared, copied = prompt_once + completions, G * prompt_once + completions
    return {"per_token": per_token, "shared": shared, "copied": copied,
            "saved": 1 - shared / copied, "bound": (G - 1) / G * prompt_len / (prompt_len + completion_len)}


def prompt_cache_storage(B: int = 16, G: int = 8, prompt_len: int = 6, seed: int = 0) -> dict:
    """Claim 13, measured on tensors: the toy's prompt cache, then G copies as ``rollout.sample``
    makes them (``repeat_interleave``) and G views (``expand``); bytes of storage each holds."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig()).eval()
    ids = torch.randint(1, model.cfg.vocab_size, (B, prompt_len))         # (B, Tp)
    with torch.no_grad():
        _, cache = model(ids)                                              # per layer (B, nh, Tp, hs)
    storage = lambda ts: sum(t.untyped_storage().nbytes() for t in ts)     # noqa: E731
    once = [t.contiguous() for kv in cache for t in kv]                    # own storage: k and v only
    copied = [t.repeat_interleave(G, 0) for t in once]                     # (B*G, nh, Tp, hs)
    viewed = [t[:, None].expand(-1, G, -1, -1, -1) for t in once]          # (B, G, nh, Tp, hs)
    return {"once": storage(once), "copied": storage(copied), "viewed": storage(viewed)}


def backward_rows(N: int = 32, group_sizes=(2, 4, 8, 16), T: int = 4, seed: int = 0) -> dict:
    """Claim 11: for N samples split into N/G groups, how many samples' log-probs receive a
    gradient from ``grpo_loss`` (distinct rewards, GRPO advantages): {G: rows}. Always N."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randperm(N, generator=gen).double()                         # (N,) distinct rewards
    out = {}
    for G in group_sizes:
        adv = ADVANTAGES["grpo"](r, torch.arange(N) // G)                  # (N,)
        logp = torch.zeros(N, T, dtype=torch.float64, requires_grad=True)  # (N, T)
        grpo_loss(logp, logp.detach(), None, adv, torch.ones(N, T, dtype=torch.bool))[0].backward()
        out[G] = int((logp.grad.abs().sum(1) > 0).sum())
    return out


def backward_time(sizes=((64, 2), (64, 8), (64, 32), (16, 8), (32, 8)), T: int = 10,
                  repeats: int = 5, seed: int = 0) -> dict:
    """Claim 11, timed: forward + backward of the toy policy and ``grpo_loss`` on N sequences of
    T tokens in groups of G (N/G groups), for each (N, G) of ``sizes`` -> {(N, G): median
    seconds over ``repeats``}, interleaved so machine load hits every size alike."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig())
    ids = torch.randint(1, model.cfg.vocab_size, (max(N for N, _ in sizes), T))  # (N_max, T)
    r = torch.rand(len(ids))                                               # (N_max,)
    times = {s: [] for s in sizes}
    model(ids)[0].sum().backward()                                         # warm-up, not timed
    model.zero_grad(set_to_none=True)
    for _ in range(repeats):
        for N, G in sizes:
            adv = ADVANTAGES["grpo"](r[:N], torch.arange(N) // G)         # (N,)
            t0 = time.perf_counter()
            logits, _ = model(ids[:N])                                     # (N, T, V)
            logp = torch.log_softmax(logits, -1).gather(2, ids[:N, :, None]).squeeze(2)  # (N, T)
            grpo_loss(logp, logp.detach(), None, adv, torch.ones(N, T, dtype=torch.bool))[0].backward()
            times[(N, G)].append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
    return {s: sorted(ts)[len(ts) // 2] for s, ts in times.items()}


def shard_work(m: int = 80, n: int = 320, k: int = 4, batch: int = 64, seed: int = 0) -> dict:
    """Claim 18: the weight gradient dW = X^T dY of a (m, n) layer split column-wise over k
    shards. Per shard: m n / k elements and 2 batch m n / k FLOPs; all shards together: the
    whole m n and 2 batch m n. ``equal``: the shards' blocks, put together, are the gradient."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(batch, m, generator=gen, dtype=torch.float64)         # (batch, m)
    dY = torch.randn(batch, n, generator=gen, dtype=torch.float64)        # (batch, n)
    cols = torch.arange(n).chunk(k)                                        # k column blocks
    blocks = [X.T @ dY[:, c] for c in cols]                                # each (m, n/k)
    per = [b.numel() for b in blocks]
    return {"per_shard_elements": per, "total_elements": sum(per), "full_elements": m * n,
            "per_shard_flops": 2 * batch * per[0], "total_flops": 2 * batch * sum(per),
            "equal": torch.allclose(torch.cat(blocks, 1), X.T @ dY)}


# --------------------------------------------------------------------------- claims 2, 3, 16

def real_gradients(steps: int = 1) -> list[dict]:
    """Real gradients of the toy policy (``trainer.record_gradients``: supervised steps from the
    base checkpoint), each split into named tensors. About 2 s for one."""
    from grpo_lab.trainer import record_gradients
    rec = record_gradients(steps=steps)
    out = []
    for flat in rec["grads"]:                                              # (numel,) per step
        named, off = {}, 0
        for name, shape in zip(rec["names"], rec["shapes"]):
            n = math.prod(shape)
            named[name], off = flat[off:off + n].view(shape), off + n
        out.append(named)
    return out


def real_gradient(steps: int = 1) -> dict:
    """The last of ``real_gradients(steps)``."""
    return real_gradients(steps)[-1]


def fp8_errors(named_grads: dict, fmt: str = "e4m3") -> dict:
    """Claim 2: relative L2 error ||fp8(g) - g|| / ||g|| of each tensor's round trip (one scale
    per tensor, compression.fp8_quantize). {name: error}; all-zero tensors are skipped."""
    from grpo_lab.distributed.compression import fp8_dequantize, fp8_quantize
    out = {}
    for name, g in named_grads.items():
        if float(g.norm()) > 0:
            codes, scales = fp8_quantize(g, fmt)
            out[name] = float((fp8_dequantize(codes, scales, fmt) - g.reshape(-1)).norm() / g.norm())
    return out


def index_bound(density: float = 0.05, n: int = 1_000_000) -> dict:
    """Claim 3: the fewest bits per index of a random k-of-n set, n H(k/n) / k, and the best
    ratio against int32 and int64; ``density_8to1``: the density where the bound is 4 bits."""
    bits = codecs.entropy_bound_bits(round(density * n), n)
    lo, hi = 1e-4, 0.5                                   # bound(d) = H(d)/d falls as d grows
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if codecs.entropy_bound_bits(round(mid * n), n) > 4.0 else (lo, mid)
    return {"bits": bits, "vs_int32": 32 / bits, "vs_int64": 64 / bits, "density_8to1": hi}


def topk_index_bits(named_grads: dict, density: float = 0.05,
                    codec_names=("huffman", "rice", "ans", "zstd")) -> dict:
    """Claim 3 on a real gradient: bits per index each codec actually produces for the top
    ``density`` positions by magnitude, chosen two ways:

      * "global": over the whole model at once (one index set over all n elements);
      * "per_tensor": each tensor's own top ``density`` (what the ``fp8_topk5`` protocol sends),
        bytes summed over tensors.

    -> {"global": {codec: bits}, "per_tensor": {codec: bits}, "bound": n H(d)/k bits (random
    positions), "share_top_tensor": the global top-k's share that falls in its busiest tensor}."""
    flat = torch.cat([g.reshape(-1) for g in named_grads.values()])       # (n,)
    n, k = flat.numel(), max(1, round(density * flat.numel()))
    idx = np.sort(torch.topk(flat.abs(), k).indices.numpy())                # (k,) global positions
    out = {"global": {c: codecs.index_cost(c, idx, n).bits_per_index for c in codec_names},
           "bound": codecs.entropy_bound_bits(k, n), "k": k, "n": n}
    sizes = [g.numel() for g in named_grads.values()]
    edges = np.cumsum([0] + sizes)
    out["share_top_tensor"] = float(np.bincount(np.searchsorted(edges, idx, "right") - 1,
                                                minlength=len(sizes)).max() / k)
    per = {c: 0 for c in codec_names}
    total_k = 0
    for g in named_grads.values():
        kt = max(1, round(density * g.numel()))
        it = np.sort(torch.topk(g.reshape(-1).abs(), kt).indices.numpy())   # (kt,) in this tensor
        total_k += kt
        for c in codec_names:
            per[c] += 8 * codecs.index_cost(c, it, g.numel()).nbytes
    out["per_tensor"] = {c: b / total_k for c, b in per.items()}
    return out


def format_savings(block: int = 128) -> dict:
    """Claim 16, arithmetic: fraction of bytes saved against fp32 per element
    (wire.FORMAT_BYTES); int8 and e4m3 are 1 byte, plus a 4-byte scale per ``block`` elements
    when scaled by block."""
    fp32 = FORMAT_BYTES["fp32"]
    return {"fp16": 1 - FORMAT_BYTES["fp16"] / fp32, "int8": 1 - 1 / fp32,
            "int8_block_scaled": 1 - (1 + 4 / block) / fp32, "e4m3": 1 - FORMAT_BYTES["e4m3"] / fp32}


def exchange_bytes(named_grads: dict, formats=("fp32", "fp16", "e4m3")) -> dict:
    """Claim 16, measured: the bytes of the message ``compression.Compressor`` produces for
    ``named_grads`` with every tensor sent dense in each format (wire headers and per-tensor
    scales included) -> {format: bytes}."""
    from grpo_lab.distributed.compression import CompressionConfig, Compressor
    return {f: len(Compressor(CompressionConfig(dense_fraction=1.0, dense_format=f)).encode(named_grads))
            for f in formats}


# --------------------------------------------------------------------------- claims 5, 6, 26, 28, 31

def cluster_figures() -> dict:
    """Claims 5 and 6 from the cost model (``distributed.scaling``): a 175B fp32 gradient on
    dgx_ib (128 nodes x 8 GPUs): the bandwidth floor of any all-reduce, the best modelled
    schedule, the ring's latency term; Adam memory (16 B/param) per GPU (GB) under ZeRO-3, and
    the write-up's own split of 2800 GB (fp32 weights, gradients, Adam moments)."""
    c = CLUSTERS["dgx_ib"](128)
    best = min(scaling.exchange_time(c, s, 175e9) for s in ("ring", "rhd", "tree", "dbtree", "hierarchical"))
    gb = lambda N, st: scaling.zero_memory(175e9, N, st) / 1e9             # noqa: E731
    return {"floor_fp32_s": scaling.bandwidth_floor(c, 175e9), "floor_bf16_s": scaling.bandwidth_floor(c, 175e9, 2.0),
            "best_fp32_s": best, "ring_latency_s": 2 * (c.size - 1) * c.alpha_inter,
            "mem_total_gb": gb(1, 0), "mem_zero3_4_gb": gb(4, 3), "mem_zero3_1024_gb": gb(1024, 3),
            "weights_fp32_gb": 4 * 175e9 / 1e9, "grads_fp32_gb": 4 * 175e9 / 1e9,
            "adam_moments_fp32_gb": 8 * 175e9 / 1e9}


def zero_traffic(ranks=(2, 8, 64, 1024)) -> dict:
    """Claim 26: bytes each rank sends per step, in units of one gradient's bytes, {N: {scheme:
    factor}}: DDP ring all-reduce 2 (N-1)/N; ZeRO-1/2 (reduce-scatter + all-gather) the same;
    ZeRO-3 3 (N-1)/N (ZeRO paper, section 7); and Adam state per rank as a fraction of one
    replica's, 1/N under ZeRO-3."""
    return {N: {"ddp": 2 * (N - 1) / N, "zero12": 2 * (N - 1) / N, "zero3": 3 * (N - 1) / N,
                "zero3_memory": scaling.zero_memory(1.0, N, 3) / scaling.zero_memory(1.0, N, 0)}
            for N in ranks}


def capacity(need_bytes: float = 1.2e12, gpus: int = 8, per_gpu_bytes: float = 80e9) -> dict:
    """Claim 28: what ``gpus`` cards of ``per_gpu_bytes`` hold together, against ``need_bytes``."""
    have = gpus * per_gpu_bytes
    return {"have_gb": have / 1e9, "need_gb": need_bytes / 1e9, "need_over_have": need_bytes / have}


def flops_vs_peak(claimed: float = 1.2e15) -> dict:
    """Claim 31: the claimed sustained FLOP/s over each GPU's dense bf16 peak (GPU_PEAK_BF16)."""
    return {gpu: claimed / peak for gpu, peak in GPU_PEAK_BF16.items()}


# --------------------------------------------------------------------------- claims 10, 21, 29, 30

def ratio_interval(ratios, level: float = 0.95) -> dict:
    """Claims 10 and 21 on one scale: per-seed ratios, their geometric mean and the t-interval
    of the mean log-ratio, exponentiated (a ratio's interval stays positive and symmetric in
    log: 2x and 0.5x are equally far from 1). PPO's samples over GRPO's: a 50-70% cut of
    samples is a ratio of 2.0-3.3x. -> {"ratios", "mean", "low", "high"}."""
    from grpo_lab.experiments import mean_ci
    ratios = [float(r) for r in ratios]
    if not ratios or min(ratios) <= 0:
        raise ValueError(f"ratios must be positive, got {ratios}")
    m, lo, hi = mean_ci([math.log(r) for r in ratios], level)
    return {"ratios": ratios, "mean": math.exp(m), "low": math.exp(lo), "high": math.exp(hi)}


def paired_ratio(numerators, denominators, level: float = 0.95) -> dict:
    """``ratio_interval`` of a_s / b_s over paired seeds s."""
    if len(numerators) != len(denominators):
        raise ValueError(f"paired ratios need one denominator per numerator, got {len(numerators)} "
                         f"numerators, {len(denominators)} denominators")
    return ratio_interval([a / b for a, b in zip(numerators, denominators)], level)


def _grad_moments(sums: torch.Tensor, sq: float, draws: int) -> dict:
    mean = sums / draws                                                    # (P,)
    var = (sq - draws * float(mean @ mean)) / (draws - 1)                  # trace of the covariance
    return {"var": var, "mean_sq": float(mean @ mean), "noise_to_signal": var / float(mean @ mean)}


def minus_group_mean(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """r_i - mean of r_i's group: (N,) -> (N,), the baseline without GRPO's division by std."""
    inv, _, mean, _ = group_stats(rewards, group_ids)                     # (N,), (K,)
    return rewards.double() - mean[inv]                                    # (N,)


BASELINES: dict[str, Callable] = {   # claim 29: advantage from (rewards (N,), group ids (N,))
    "none": lambda r, g: r.double(),                                       # REINFORCE, no baseline
    "group mean": minus_group_mean,
    "grpo": ADVANTAGES["grpo"],                                            # (r - mean) / std
}


def baseline_variance(seed: int = 0, prompts: int = 8, G: int = 8, draws: int = 16,
                      task: str = "addition", aggregation: str = "dr_grpo") -> dict:
    """Claim 29: the spread of the policy-gradient estimate with and without a group baseline.

    The base toy policy, ``prompts`` fixed prompts of ``task``; ``draws`` times: sample G
    completions per prompt, score them (the defaults' reward weights), and take the gradient of
    ``grpo_loss`` (beta 0, at pi = pi_old: the plain policy gradient) once per advantage of
    ``BASELINES`` on the same samples. -> {name: {"var": trace of the gradient's covariance over
    draws, "mean_sq": ||mean gradient||^2, "noise_to_signal": var / mean_sq, "scale_vs_none":
    the mean gradient projected on no-baseline's, over its norm^2}}. The GRPO row is divided by
    the group's std, so compare it by noise_to_signal, not var. ``aggregation`` "dr_grpo" sums
    tokens over a constant (DeepSeekMath's 1/|o_i| would make the baseline term depend on the
    sample's length, and so not vanish in expectation). About 0.2 s a draw of 64 samples."""
    from grpo_lab.config import preset
    from grpo_lab.policy import load_for
    from grpo_lab.rollout import completion_logprobs
    from grpo_lab.step import max_new_tokens, sample_and_score
    from grpo_lab.tasks import get_task
    if draws < 2:
        raise ValueError(f"draws must be >= 2 to estimate a variance, got {draws}")
    cfg = preset("defaults", task=task)
    torch.manual_seed(seed)
    policy = load_for(cfg)
    params = [p for p in policy.parameters() if p.requires_grad]
    rng = random.Random(seed)
    examples = [get_task(task).make(rng) for _ in range(prompts)]
    gen = torch.Generator().manual_seed(seed)
    sums = {b: torch.zeros(sum(p.numel() for p in params), dtype=torch.float64) for b in BASELINES}
    sq = {b: 0.0 for b in BASELINES}
    for _ in range(draws):
        s = sample_and_score(policy, examples, G, max_new_tokens(cfg), cfg.reward_weights,
                             temperature=cfg.temperature, generator=gen)
        logp = completion_logprobs(policy, s.rollout, cfg.temperature)    # (N, Tc)
        mask = s.rollout.completion_mask                                   # (N, Tc)
        for b, fn in BASELINES.items():
            adv = fn(s.rewards, s.rollout.prompt_index).float()            # (N,)
            loss = grpo_loss(logp, logp.detach(), None, adv, mask, aggregation=aggregation,
                             max_len=max_new_tokens(cfg))[0]
            flat = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params, retain_graph=True)])
            sums[b] += flat.double()                                       # (P,)
            sq[b] += float(flat.double() @ flat.double())
    out = {b: _grad_moments(sums[b], sq[b], draws) for b in BASELINES}
    for b in BASELINES:     # the mean gradient along no-baseline's: 1 unbiased, (G-1)/G group mean
        out[b]["scale_vs_none"] = float(sums[b] @ sums["none"] / (sums["none"] @ sums["none"]))
    return out


def optimizer_inputs() -> dict:
    """Claim 30: what ``torch.optim.Optimizer.step`` receives (besides the parameters and their
    .grad it already holds) against what the GRPO objective needs."""
    step = [p for p in inspect.signature(torch.optim.Optimizer.step).parameters if p != "self"]
    loss = [p for p, v in inspect.signature(grpo_loss).parameters.items() if v.default is inspect._empty]
    return {"optimizer_step": step, "grpo_loss": loss}


# --------------------------------------------------------------------------- the registry

class Live(NamedTuple):
    """A measurement the table computes when it is shown: ``run() -> str`` (one sentence with
    the numbers) and about how long it takes."""
    run: Callable[[], str]
    seconds: float


def _fp8_text() -> str:
    e = sorted(fp8_errors(real_gradient()).values())
    return f"e4m3 round trip, {len(e)} tensors of a real gradient: {e[len(e) // 2]:.1%} median, {e[0]:.1%}-{e[-1]:.1%}"


def _index_text() -> str:
    b = index_bound()
    return (f"bound {b['bits']:.2f} bits/index at 5% = {b['vs_int32']:.1f}x vs int32 for random positions; "
            f"8:1 needs {b['density_8to1']:.0%} density")


def _cluster_text() -> str:
    f = cluster_figures()
    return (f"175B fp32 on 1024 GPUs: floor {f['floor_fp32_s']:.2f} s (bf16 {f['floor_bf16_s']:.2f} s), "
            f"best schedule {f['best_fp32_s']:.2f} s; ring latency term {f['ring_latency_s'] * 1e3:.1f} ms")


def _memory_text() -> str:
    f = cluster_figures()
    return (f"fp32 weights {f['weights_fp32_gb']:.0f} + grads {f['grads_fp32_gb']:.0f} + Adam moments "
            f"{f['adam_moments_fp32_gb']:.0f} = {f['mem_total_gb']:.0f} GB (16 B/param); ZeRO-3 on 4 GPUs "
            f"{f['mem_zero3_4_gb']:.0f} GB, on 1024 {f['mem_zero3_1024_gb']:.2f} GB per GPU")


def _rows_text() -> str:
    rows = backward_rows()
    return (f"samples receiving a gradient, N = 32: {', '.join(f'G={G}: {n}' for G, n in rows.items())} "
            f"({', '.join(f'{32 // G}' for G in rows)} baselines)")


def _kv_text() -> str:
    k, s = prompt_kv_bytes(), prompt_kv_bytes(prompt_len=200, completion_len=1000)
    return (f"toy rollout (16 x 8, prompt 6, completion 4): {k['copied']:,} -> {k['shared']:,} B "
            f"({k['saved']:.0%} saved); prompt 200, completion 1000: {s['saved']:.0%}")


def _format_text() -> str:
    f = format_savings()
    return f"fp16 {f['fp16']:.0%} fewer bytes, 8-bit {f['int8']:.0%} ({f['int8_block_scaled']:.1%} with a scale per 128)"


def _shard_text() -> str:
    w = shard_work()
    return (f"80 x 320 layer, k = 4: {w['per_shard_elements'][0]:,} elements per shard, "
            f"{w['total_elements']:,} in all (= m n = {w['full_elements']:,})")


def _relative_text() -> str:
    m = relative_reward_gradient()
    return (f"R per member {[round(float(x), 3) for x in m['R']]}: advantage max |A| "
            f"{max(float(a.abs().max()) for a in m['advantages'].values())}, gradient max {float(m['grad'].abs().max())}")


def _zero_text() -> str:
    z = zero_traffic()
    return ("bytes sent per rank per step, x one gradient: " + "; ".join(
        f"N={N}: DDP {v['ddp']:.2f}, ZeRO-3 {v['zero3']:.2f}" for N, v in z.items() if N in (2, 1024))
        + f"; ZeRO-3 memory at N=1024: {z[1024]['zero3_memory']:.4f} of a replica")


def _capacity_text() -> str:
    c = capacity()
    return f"8 x 80 GB = {c['have_gb']:.0f} GB < {c['need_gb']:.0f} GB: {c['need_over_have']:.3f}x too little"


def _flops_text() -> str:
    return "; ".join(f"{r:.2f}x the {gpu} dense bf16 peak ({GPU_PEAK_BF16[gpu] / 1e12:.0f} TFLOPS)"
                     for gpu, r in flops_vs_peak().items())


def _optimizer_text() -> str:
    o = optimizer_inputs()
    return (f"Optimizer.step({', '.join(o['optimizer_step'])}) vs grpo_loss({', '.join(o['grpo_loss'])}): "
            f"the rewards' advantages and old log-probs never reach an optimizer")


LIVE: dict[str, Live] = {
    "fp8_errors": Live(_fp8_text, 2.0),
    "index_bound": Live(_index_text, 0.01),
    "cluster_figures": Live(_cluster_text, 0.01),
    "adam_memory": Live(_memory_text, 0.01),
    "backward_rows": Live(_rows_text, 0.05),
    "prompt_kv_bytes": Live(_kv_text, 0.01),
    "format_savings": Live(_format_text, 0.0),
    "shard_work": Live(_shard_text, 0.01),
    "relative_reward_gradient": Live(_relative_text, 0.05),
    "zero_traffic": Live(_zero_text, 0.0),
    "capacity": Live(_capacity_text, 0.0),
    "flops_vs_peak": Live(_flops_text, 0.0),
    "optimizer_inputs": Live(_optimizer_text, 0.0),
}
