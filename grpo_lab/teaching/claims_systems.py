"""Memory and cluster arithmetic for the claims table (claims 5, 6, 13, 15, 18, 26, 28, 31, 35): the
prompt's KV cache stored once or per completion (prompt_kv_bytes, prompt_cache_storage), the
work of a sharded weight gradient (shard_work), the cost model's figures for a 175B gradient
(cluster_figures), ZeRO traffic (Rajbhandari et al. 2020, section 7: zero_traffic), capacity
FLOP/s against data-sheet peaks, and the NVLink generation of each GPU. claims_live.py has the
arithmetic."""
from __future__ import annotations

import torch

from grpo_lab.distributed import scaling
from grpo_lab.distributed.topology import CLUSTERS
from grpo_lab.policies.model import GPT, GPTConfig


# Dense tensor-core peaks (no sparsity), from NVIDIA's data sheets. bf16: A100 SXM 312 TFLOPS,
# H100 SXM 989 TFLOPS (1979 "with sparsity"). FP8 (H100 only; the A100 has no FP8 units): H100 SXM
# 1979 TFLOPS (3958 "with sparsity").
GPU_PEAK_BF16 = {"A100 SXM": 312e12, "H100 SXM": 989e12}
GPU_PEAK_FP8 = {"H100 SXM": 1979e12}

# NVLink generation and per-GPU bandwidth (both directions together), from the data sheets:
# A100: NVLink 3, 12 links, 600 GB/s; H100 SXM: NVLink 4, 18 links, 900 GB/s (topology.py and
# scaling.LINKS model it as 450 GB/s per direction).
NVLINK = {"A100 SXM": {"generation": 3, "gb_s": 600}, "H100 SXM": {"generation": 4, "gb_s": 900}}


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
            "adam_moments_fp32_gb": 8 * 175e9 / 1e9,
            "weights_bf16_gb": 2 * 175e9 / 1e9,
            # bf16 weights 2 + bf16 gradients 2 + 8-bit Adam's two moments 1 + 1 = 6 B/param, ZeRO-3 on 4
            "mem_bf16_adam8_zero3_4_gb": (2 + 2 + 1 + 1) * 175e9 / 4 / 1e9}


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


def flops_vs_peak(claimed: float = 1.2e15, peaks: dict | None = None) -> dict:
    """Claim 31: the claimed sustained FLOP/s over each GPU's dense peak (default GPU_PEAK_BF16;
    pass GPU_PEAK_FP8 for FP8)."""
    return {gpu: claimed / peak for gpu, peak in (peaks or GPU_PEAK_BF16).items()}


def nvlink(gpu: str = "H100 SXM") -> dict:
    """Claim 35: the NVLink generation and per-GPU bandwidth (GB/s, both directions) of ``gpu``."""
    return NVLINK[gpu]
