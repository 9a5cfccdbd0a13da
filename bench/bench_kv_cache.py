"""Sampling speed with and without the KV cache, measured side by side in one run.

    python bench/bench_kv_cache.py [--threads 2] [--repeats 3]

Without the cache every new token re-runs the whole sequence (O(T^2) work for T tokens);
with it, one position per step. The policy is the default toy GPT (random weights, <eos>
suppressed so every completion runs to full length and both paths do the same work).
Prints tokens/s for both and their ratio; the ratio is the figure to report (this machine
is shared and noisy, absolute times are not).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpo_lab.policies.model import GPT, GPTConfig
from grpo_lab.algorithm.rollout import sample
from grpo_lab.tokenizer import EOS, encode


class NoStop(torch.nn.Module):
    """The policy with <eos> suppressed, so completions have exactly max_new_tokens."""

    def __init__(self, m: GPT):
        super().__init__()
        self.m, self.cfg = m, m.cfg

    def forward(self, *args, **kw):
        logits, cache = self.m(*args, **kw)
        logits[..., EOS] = float("-inf")
        return logits, cache


def tokens_per_s(model, prompts, G, new, use_cache, seed=0) -> float:
    t0 = time.perf_counter()
    r = sample(model, prompts, G, new, generator=torch.Generator().manual_seed(seed),
               use_cache=use_cache)
    dt = time.perf_counter() - t0
    return int(r.completion_mask.sum()) / dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--G", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = NoStop(GPT(GPTConfig(block_size=96)).eval())
    prompts = [encode(f"{a}+{b}=") for a, b in zip(range(10, 10 + args.prompts), range(50, 99))]
    print(f"policy: default toy GPT ({model.m.num_params():,} params), {args.prompts} prompts x "
          f"G={args.G}, torch {torch.__version__}, {args.threads} threads\n")
    print("| new tokens | with cache (tok/s) | without cache (tok/s) | speed-up |")
    print("|---|---|---|---|")
    for new in (8, 32, 64):
        tokens_per_s(model, prompts, args.G, new, True)                    # warm-up
        with_c, without = [], []
        for rep in range(args.repeats):                                    # interleaved
            with_c.append(tokens_per_s(model, prompts, args.G, new, True, rep))
            without.append(tokens_per_s(model, prompts, args.G, new, False, rep))
        ratios = [a / b for a, b in zip(with_c, without)]
        print(f"| {new} | {statistics.median(with_c):,.0f} | {statistics.median(without):,.0f} | "
              f"{statistics.median(ratios):.1f}x |")


if __name__ == "__main__":
    main()
