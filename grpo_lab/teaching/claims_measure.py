"""The measurements behind the claims table (``grpo_lab.teaching.claims``): cheap, computed from the library.

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

# the measurements live in modules of one idea; every name stays importable from here:
# claims_gradient (claims 11, 20, 29, 30, 32, 33), claims_bytes (2, 3, 16), claims_systems (5, 6,
# 13, 15, 18, 26, 28, 31, 35), claims_stats (10, 21: paired ratios) and claims_live (the LIVE registry)
from grpo_lab.teaching.claims_bytes import (exchange_bytes, format_savings, fp8_errors,  # noqa: F401
                                            index_bound, real_gradient, real_gradients, topk_index_bits)
from grpo_lab.teaching.claims_gradient import (BASELINES, _grad_moments, backward_rows,  # noqa: F401
                                               backward_time, baseline_variance, clipped_surrogate,
                                               group_mean_gradient, minus_group_mean, optimizer_inputs,
                                               relative_reward_gradient)
from grpo_lab.teaching.claims_live import (LIVE, Live, _capacity_text, _cluster_text,  # noqa: F401
                                           _clip_text, _group_gradient_text, _index64_text, _nvlink_text,
                                           _weights_text,
                                           _flops_text, _format_text, _fp8_text, _index_text, _kv_text,
                                           _memory_text, _optimizer_text, _relative_text, _rows_text,
                                           _shard_text, _zero_text)
from grpo_lab.teaching.claims_stats import paired_ratio, ratio_interval  # noqa: F401
from grpo_lab.teaching.claims_systems import (GPU_PEAK_BF16, GPU_PEAK_FP8, NVLINK,  # noqa: F401
                                              capacity, cluster_figures, flops_vs_peak, nvlink,
                                              prompt_cache_storage, prompt_kv_bytes,
                                              shard_work, zero_traffic)
