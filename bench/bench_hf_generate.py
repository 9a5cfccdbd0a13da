"""Rollout throughput: grpo_lab's sampler (rollout.sample) vs transformers' ``model.generate``,
side by side in one run, on the same HF model, prompts, G, lengths and temperature.

Both sample B prompts x G completions of at most --max_new tokens at --temperature, top-k off,
stop a row at <eos>, and reuse a KV cache. grpo_lab runs the prompt once and repeats its cache
G times; ``generate`` repeats the prompt G times (num_return_sequences) and runs it B*G times.
Timed: wall time of the whole call, median of --repeats, the two interleaved so load drifts
hit both. Tokens: sampled tokens up to and with <eos> (what a GRPO step trains on).

    python bench/bench_hf_generate.py --threads 1                       # data/hf_tiny
    python bench/bench_hf_generate.py --random_width 512 --layers 8     # a bigger random model
    # SmolLM2, the sampler's levers (issue 22), generate also on bf16 weights (same precision)
    python bench/bench_hf_generate.py --model /work/models/smollm2-135m-instruct --chat_template \
        --prompts 8 --G 4 --max_new 32 --threads 1 --repeats 3 --draw inverse_cdf \
        --drop_finished --sample_dtype bfloat16
    # the lean decoder (policies/decoder.py) beside transformers' forward and generate
    python bench/bench_hf_generate.py --model /work/models/smollm2-135m-instruct --chat_template \
        --prompts 8 --G 4 --max_new 32 --threads 1 --repeats 3 --draw inverse_cdf \
        --drop_finished --decoders lean,transformers
    # ... and how much of each rollout is GEMMs (--gemm_share: the floor for the decode loop)
    python bench/bench_hf_generate.py --model /work/models/smollm2-135m-instruct --chat_template \
        --prompts 8 --G 4 --max_new 32 --threads 1 --repeats 3 --draw inverse_cdf \
        --drop_finished --gemm_share

The random model never learned to stop, so both sides then run every row to --max_new.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpo_lab.policies import engine
from grpo_lab.policies.hf import DTYPES, HFPolicy, HFPolicyConfig, load_hf_policy
from grpo_lab.algorithm.rollout import DRAWS, sample
from grpo_lab.training.step import prompt_generators
from grpo_lab.tasks.task_data import load_eval


def random_policy(tiny: HFPolicy, width: int, layers: int) -> HFPolicy:
    """A randomly initialised Llama of another size, with the tiny model's tokenizer."""
    import transformers as tf

    c = tf.LlamaConfig(vocab_size=tiny.cfg.vocab_size, hidden_size=width,
                       intermediate_size=8 * width // 3 // 8 * 8, num_hidden_layers=layers,
                       num_attention_heads=max(1, width // 64), num_key_value_heads=max(1, width // 128),
                       max_position_embeddings=tiny.cfg.block_size, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(c).eval()
    return HFPolicy(model, tiny.tokenizer, HFPolicyConfig("random", c.max_position_embeddings,
                                                          c.vocab_size))


class GemmMeter:
    """CPU seconds and FLOPs of every matrix product a rollout runs: ``F.linear`` (the
    prefill's and generate's nn.Linear layers, the lean decoder above 8 rows and its head)
    and ``small_gemm.linear_rows8`` (the lean decoder at up to 8 rows), each call timed
    with ``time.process_time`` while ``start``ed."""

    def __init__(self):
        from grpo_lab.policies import small_gemm
        self.mods = [(torch.nn.functional, "linear"), (small_gemm, "linear_rows8")]
        self.orig = [getattr(m, n) for m, n in self.mods]
        self.seconds, self.flops = 0.0, 0

    def _timed(self, fn):
        def run(x, w, *rest, **kw):
            t0 = time.process_time()
            y = fn(x, w, *rest, **kw)
            self.seconds += time.process_time() - t0
            self.flops += 2 * x.numel() // x.shape[-1] * w.shape[0] * w.shape[1]
            return y
        return run

    def start(self) -> None:
        self.seconds, self.flops = 0.0, 0
        for (m, n), fn in zip(self.mods, self.orig):
            setattr(m, n, self._timed(fn))

    def stop(self) -> None:
        for (m, n), fn in zip(self.mods, self.orig):
            setattr(m, n, fn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="data/hf_tiny")
    ap.add_argument("--random_width", type=int, default=0, help="0: the model as loaded")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--max_new", type=int, default=6)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--chat_template", action="store_true", help="prompts as one user turn")
    ap.add_argument("--warmup", type=int, default=2, help="rounds left out at the start")
    ap.add_argument("--draw", default="race", help="grpo_lab's token draw (rollout.DRAWS)")
    ap.add_argument("--drop_finished", action="store_true")
    ap.add_argument("--sample_dtype", default="",
                    help="grpo_lab samples with a copy of the weights in this dtype; generate "
                         "then runs on the fp32 model and on a copy in this dtype as well")
    ap.add_argument("--gemm_share", action="store_true",
                    help="also time every GEMM (F.linear, small_gemm) inside each rollout: "
                         "the CPU s and GFLOP of matrix products, the floor no decode loop "
                         "around them can go under")
    ap.add_argument("--compare_share", action="store_true",
                    help="also run grpo_lab's sampler with the prompts' common prefix "
                         "prefilled with each prompt (share_prefix=False)")
    ap.add_argument("--decoders", default="lean",
                    help="grpo_lab's decode paths to run, comma-separated (hf.DECODE_PATHS): "
                         "lean,transformers puts both beside generate")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    import transformers

    policy = load_hf_policy(a.model, chat_template=a.chat_template, sample_dtype=a.sample_dtype)
    if a.random_width:
        policy = random_policy(policy, a.random_width, a.layers)
    policy.eval()
    exs = load_eval("addition")[:a.prompts]
    ids = [policy.encode(e.prompt) for e in exs]
    tok = policy.tokenizer
    tok.padding_side = "left"
    batch = ({"input_ids": engine.left_pad(ids, policy.pad_id)[0],
              "attention_mask": engine.left_pad(ids, policy.pad_id)[1].long()}
             if a.chat_template else tok([e.prompt for e in exs], return_tensors="pt",
                                         padding=True, add_special_tokens=False))
    low = None
    if a.sample_dtype:
        import copy
        low = copy.deepcopy(policy.model).to(DTYPES[a.sample_dtype]).eval()

    def ours(rep, decoder="lean", share=True):
        policy.cfg.decoder = decoder
        r = sample(policy, ids, a.G, a.max_new, a.temperature,
                   generator=prompt_generators(0, rep, 0, range(len(ids))), draw=DRAWS[a.draw],
                   drop_finished=a.drop_finished, share_prefix=share)
        return int(r.completion_mask.sum())

    def theirs(rep, model=None):
        torch.manual_seed(rep)
        with torch.no_grad():
            out = (model or policy.model).generate(**batch, do_sample=True, temperature=a.temperature,
                                        top_k=0, top_p=1.0, max_new_tokens=a.max_new,
                                        num_return_sequences=a.G, eos_token_id=policy.eos_id,
                                        pad_token_id=policy.pad_id)
        new = out[:, batch["input_ids"].shape[1]:]                          # (N, <=max_new)
        stopped = (new == policy.eos_id).cumsum(1)
        return int(((stopped == 0) | ((stopped == 1) & (new == policy.eos_id))).sum())

    decoders = a.decoders.split(",")
    runs = [(f"grpo_lab sample, {d} decoder", lambda rep, d=d: ours(rep, d)) for d in decoders]
    if a.compare_share:
        runs += [(f"grpo_lab sample, {d} decoder, each prompt prefilled whole",
                  lambda rep, d=d: ours(rep, d, False)) for d in decoders]
        decoders = decoders * 2                    # grpo_lab's rows come first in the table
    runs.append(("transformers generate", theirs))
    if low is not None:
        runs.append((f"transformers generate, {a.sample_dtype} weights",
                      lambda rep: theirs(rep, low)))
    times = {name: [] for name, _ in runs}
    tokens = {k: [] for k in times}
    gemm = {k: [] for k in times}                      # (CPU s, GFLOP) of GEMMs per rollout
    meter = GemmMeter() if a.gemm_share else None
    for rep in range(a.repeats + a.warmup):                                 # warm-up rounds
        for name, fn in runs:
            if meter:
                meter.start()
            t0 = time.process_time()              # CPU seconds: the machine is shared
            n = fn(rep)
            t1 = time.process_time()
            if meter:
                meter.stop()
            if rep >= a.warmup:
                times[name].append(t1 - t0)
                tokens[name].append(n)
                if meter:
                    gemm[name].append((meter.seconds, meter.flops / 1e9))
    n_params = sum(p.numel() for p in policy.parameters())
    print(f"model {a.model if not a.random_width else f'random Llama {a.random_width}x{a.layers}'}"
          f" ({n_params:,} params), B={a.prompts} G={a.G} max_new={a.max_new} "
          f"T={a.temperature}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"threads {torch.get_num_threads()}, median of {a.repeats}")
    print("| sampler | CPU s per rollout (median) | tokens per rollout (mean) | tokens per CPU s |")
    print("|---|---|---|---|")
    rate = {}
    for k in times:
        med, tok_mean = statistics.median(times[k]), statistics.mean(tokens[k])
        rate[k] = tok_mean / med
        print(f"| {k} | {med:.4f} | {tok_mean:.1f} | {rate[k]:.0f} |")
    if meter:
        print("\n| sampler | GEMM CPU s per rollout (median) | GEMM GFLOP | GEMM GFLOP/s | "
              "GEMM share of the rollout | rollout without its GEMMs, CPU s |")
        print("|---|---|---|---|---|---|")
        for k in times:
            g_s = statistics.median(s for s, _ in gemm[k])
            g_f = statistics.median(f for _, f in gemm[k])
            med = statistics.median(times[k])
            print(f"| {k} | {g_s:.2f} | {g_f:.1f} | {g_f / g_s:.1f} | {g_s / med:.0%} | "
                  f"{med - g_s:.2f} |")
        half = statistics.median(times["transformers generate"]) * (
            statistics.mean(tokens[list(rate)[0]]) / statistics.mean(tokens["transformers generate"])) / 2
        print(f"2x generate's tokens per CPU s means grpo_lab's rollout (its token count) in "
              f"{half:.2f} CPU s; its GEMMs alone take "
              f"{statistics.median(s for s, _ in gemm[list(rate)[0]]):.2f} (timing each call "
              f"adds ~1 us a GEMM)")
    from grpo_lab.training.experiments import mean_ci
    for mine in list(rate)[:len(decoders)]:
        for k in list(rate)[len(decoders):]:
            per = [(tm / sm) / (tk / sk) for sm, tm, sk, tk in          # round by round
                   zip(times[mine], tokens[mine], times[k], tokens[k])]
            m, lo, hi = mean_ci(per)
            print(f"ratio {mine} / {k} (tokens/s): {rate[mine] / rate[k]:.2f} of the medians; "
                  f"per round {m:.2f} [{lo:.2f}, {hi:.2f}] (mean, 95% t-interval, "
                  f"{len(per)} rounds)")
    import os
    print(f"prompts' common prefix: {engine.shared_prefix(ids)} tokens (prefilled once "
          f"from {engine.SHARED_PREFIX_MIN}; prompts {min(map(len, ids))}-{max(map(len, ids))} "
          f"tokens)")
    print(f"grpo_lab: draw {a.draw}, drop_finished {a.drop_finished}, sample_dtype "
          f"{a.sample_dtype or 'float32'}; load average %.1f / %.1f / %.1f" % os.getloadavg())


if __name__ == "__main__":
    main()
