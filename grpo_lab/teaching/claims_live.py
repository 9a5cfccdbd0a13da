"""``LIVE``: the registry of the cheap measurements the claims table computes when it is shown
(claims_table.measure): one function per measurement, ``() -> str``, the sentence it prints
(each takes at most about 2 s). The measurements are in claims_gradient (claims 11, 20, 29, 30, 32,
33), claims_formulas (38, 39, 40), claims_bytes (2, 3, 16), claims_systems (5, 6, 13, 15, 18, 26, 28, 31, 35) and claims_stats
(10, 21: paired ratios). Expensive or multi-seed measurements (real gradients, gradient variance
over 3 seeds) run in ``bench/bench_claims.py`` with the same functions and are quoted from its
results file.

The arithmetic, once:

  * index coding (claim 3): a uniformly random k-of-n set holds log2 C(n, k) ~ n H(k/n) bits, so
    no coder averages fewer than n H(k/n) / k bits per index: 5.73 at 5% (5.6x against int32).
    Positions that cluster (a whole-model top-k, where a few tensors hold most of the gradient's
    mass) are not random, and a coder that finds the structure can go below it.
  * e4m3 (claim 2): 3 mantissa bits, so rounding moves a value by up to 2^-4 = 6.25% of it.
  * bytes per element (claim 16): fp32 4, fp16 2, an 8-bit format 1 (+ a 4-byte scale per block
    or tensor): -50% and -75% against fp32, whatever the link.
  * Adam memory (claim 6): 16 B/param either way: fp32 weights 4 + gradients 4 + two moments 8,
    or mixed precision 2 + 2 + fp32 master 4 + moments 8. ZeRO-3 divides it by N. Formats cut it
    for any objective: bf16 weights 2 + gradients 2 + 8-bit Adam's moments 2 = 6 B/param.
  * 175B weights (claim 15): 2 B/param in bf16 = 350 GB before any gradient or activation.
  * index width (claim 3): torch.topk returns int64 indices, 64 bits: 8:1 needs 8 bits per index.
  * peaks (claim 31, data sheets, dense): H100 SXM bf16 989 TFLOPS, FP8 1,979; A100 SXM bf16 312.
  * ZeRO traffic (claim 26, Rajbhandari et al. 2020, section 7): per rank and step, DDP's ring
    all-reduce sends 2 (N-1)/N of the gradient; ZeRO-1/2's reduce-scatter + all-gather the same;
    ZeRO-3 one more all-gather of the weights, 3 (N-1)/N: at most 1.5x DDP's. Never N-fold.
  * a baseline (claim 29, Williams 1992; DeepSeekMath eq. 3): E[b grad log pi] = 0 for a b that does
    not depend on the sample, so subtracting one leaves the gradient's mean and can only move its
    variance. The group mean includes the sample itself, which scales the mean by (G-1)/G.
"""
from __future__ import annotations

from typing import Callable

from grpo_lab.teaching.claims_bytes import format_savings, fp8_errors, index_bound, real_gradient
from grpo_lab.teaching.claims_formulas import length_weight, mixed_group, mixed_unit_scores
from grpo_lab.teaching.claims_gradient import (backward_rows, clipped_surrogate, group_mean_gradient,
                                               optimizer_inputs, relative_reward_gradient)
from grpo_lab.teaching.claims_systems import (GPU_PEAK_BF16, GPU_PEAK_FP8, capacity, cluster_figures,
                                              flops_vs_peak, nvlink, prompt_kv_bytes, shard_work,
                                              zero_traffic)


def _fp8_text() -> str:
    e = sorted(fp8_errors(real_gradient()).values())
    return f"e4m3 round trip, {len(e)} tensors of a real gradient: {e[len(e) // 2]:.1%} median, {e[0]:.1%}-{e[-1]:.1%}"


def _index_text() -> str:
    b = index_bound()
    return (f"bound {b['bits']:.2f} bits/index at 5% = {b['vs_int32']:.1f}x vs int32 for random positions; "
            f"8:1 needs {b['density_8to1']:.0%} density")


def _index64_text(huffman_bits=(4.79, 4.92)) -> str:
    """Claim 3 against the indices torch.topk returns (their width read from torch): the quoted
    Huffman bits of a real gradient's whole-model top 5%, and the random-position bound."""
    import torch
    width = 8 * torch.topk(torch.ones(2), 1).indices.element_size()      # int64: 64 bits
    lo, hi = huffman_bits
    b = index_bound()
    return (f"against torch.topk's int{width} indices: Huffman {width / hi:.1f}-{width / lo:.1f}x, "
            f"random positions up to {width / b['bits']:.1f}x")


def _cluster_text() -> str:
    f = cluster_figures()
    return (f"175B fp32 on 1024 GPUs: floor {f['floor_fp32_s']:.2f} s (bf16 {f['floor_bf16_s']:.2f} s), "
            f"best schedule {f['best_fp32_s']:.3f} s; ring latency term {f['ring_latency_s'] * 1e3:.1f} ms")


def _memory_text() -> str:
    f = cluster_figures()
    return (f"fp32 weights {f['weights_fp32_gb']:.0f} + grads {f['grads_fp32_gb']:.0f} + Adam moments "
            f"{f['adam_moments_fp32_gb']:.0f} = {f['mem_total_gb']:.0f} GB (16 B/param); ZeRO-3 on 4 GPUs "
            f"{f['mem_zero3_4_gb']:.0f} GB, on 1024 {f['mem_zero3_1024_gb']:.2f} GB per GPU; bf16 weights and "
            f"grads with 8-bit Adam (6 B/param), ZeRO-3 on 4 GPUs: {f['mem_bf16_adam8_zero3_4_gb']:.1f} GB")


def _weights_text() -> str:
    f = cluster_figures()
    return f"175B bf16 weights alone: {f['weights_bf16_gb']:.0f} GB (2 B/param)"


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
    fp8 = "; ".join(f"{r:.2f}x the {gpu} dense FP8 peak ({GPU_PEAK_FP8[gpu] / 1e12:,.0f} TFLOPS)"
                    for gpu, r in flops_vs_peak(peaks=GPU_PEAK_FP8).items())
    return fp8 + "; " + "; ".join(f"{r:.2f}x the {gpu} dense bf16 peak ({GPU_PEAK_BF16[gpu] / 1e12:.0f} TFLOPS)"
                                  for gpu, r in flops_vs_peak().items())


def _nvlink_text() -> str:
    h, a = nvlink("H100 SXM"), nvlink("A100 SXM")
    return (f"H100 SXM: NVLink {h['generation']}, {h['gb_s']} GB/s per GPU; NVLink {a['generation']} is the "
            f"A100's ({a['gb_s']} GB/s)")


def _group_gradient_text() -> str:
    m = group_mean_gradient()
    agree = "within 1e-12" if m["max_diff"] < 1e-12 else f"only to {m['max_diff']:.1e}"
    return (f"G = {m['G']} sampled {m['T']}-token completions, free logits: -{m['T']} x the gradient of grpo_loss "
            f"(advantages r - mean r, ratio 1) equals (1/G) sum_i (r_i - mean r) grad log pi(o_i) {agree}; "
            f"the loss is {m['loss'] + 0.0:.1f}, its gradient is not")           # + 0.0: never "-0.0"


def _clip_text() -> str:
    c = clipped_surrogate()
    return (f"grpo_loss on one token, {c['cases']} cases (ratio 0.55-1.55, A = +1 and -1): -min(ratio A, "
            f"clip(ratio, 0.8, 1.2) A) {'within 1e-12' if c['max_diff'] < 1e-12 else 'NOT matched'}; gradient zero "
            f"{'exactly' if c['zero_grad_where_clipped'] else 'NOT only'} where the clip acts")


def _optimizer_text() -> str:
    o = optimizer_inputs()
    return (f"Optimizer.step({', '.join(o['optimizer_step'])}) vs grpo_loss({', '.join(o['grpo_loss'])}): "
            f"the rewards' advantages and old log-probs never reach an optimizer")


def _units_text() -> str:
    m = mixed_unit_scores()
    imp = "; ".join(f"loss x {s:g}: small {v['small']:,.2f}, large {v['large']:,.2f}" for s, v in m["importance"].items())
    first = lambda d: max(d, key=d.get)                                   # noqa: E731
    hpm = "; ".join(f"in {u}: node {first(v)} first" for u, v in m["hpm"].items())
    job = "; ".join(f"{j} job: node {min(v, key=v.get)} faster ({v['A'] * 1e3:.2f} vs {v['B'] * 1e3:.2f} ms, A vs B)"
                    for j, v in m["time_s"].items())
    return (f"0.7 var + 0.3 norm, a small fluctuating and a large steady gradient: {imp}; HPM (weights 1) for node A "
            f"(100 TFLOPS, 3,000 GB/s) and B (200 TFLOPS, 1,500 GB/s): {hpm}; {job}")


def _length_text() -> str:
    w = length_weight()
    per = lambda agg: ", ".join(f"{n} tokens {v[0]:.4f}" for n, v in w[agg].items())   # noqa: E731
    return (f"d loss / d log pi per token, A = 1, one completion each of 4, 16, 64 tokens: GRPO's 1/|o| mean "
            f"{per('seq_mean_token_mean')} (summed: {w['seq_mean_token_mean'][4][1]:.4f} each); Dr. GRPO's "
            f"constant {per('dr_grpo')}")


def _mixed_text() -> str:
    m = mixed_group()
    fmt = lambda xs: ", ".join(f"{x:+.2f}" for x in xs)                  # noqa: E731
    return (f"rewards 0.9, 0.7 (easy prompt) and 0.3, 0.1 (hard prompt): GRPO advantages by prompt {fmt(m['by_prompt'])}; "
            f"in one group {fmt(m['one_group'])}: {len(m['flips'])} of 4 signs flip; one prompt's group of equal "
            f"rewards: {fmt(m['equal'])}")


LIVE: dict[str, Callable[[], str]] = {
    "mixed_unit_scores": _units_text,
    "length_weight": _length_text,
    "mixed_group": _mixed_text,
    "fp8_errors": _fp8_text,
    "index_bound": _index_text,
    "cluster_figures": _cluster_text,
    "adam_memory": _memory_text,
    "backward_rows": _rows_text,
    "prompt_kv_bytes": _kv_text,
    "format_savings": _format_text,
    "shard_work": _shard_text,
    "relative_reward_gradient": _relative_text,
    "zero_traffic": _zero_text,
    "capacity": _capacity_text,
    "flops_vs_peak": _flops_text,
    "index_int64": _index64_text,
    "weights_175b": _weights_text,
    "nvlink": _nvlink_text,
    "group_mean_gradient": _group_gradient_text,
    "clipped_surrogate": _clip_text,
    "optimizer_inputs": _optimizer_text,
}
