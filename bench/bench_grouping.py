"""Grouping + advantage overhead per GRPO step, as a fraction of the step's time.

Goal: TF-IDF K-means grouping at 256 prompts costs under 5% of a training step.

One step (the denominator) is the trainer's own GRPO step (trainer.train on
trainer.setup's policy, prompt source and grouper: the loop every run uses), on the toy
policy GPT(GPTConfig()) with random init (saved to a temporary base checkpoint): sample G
completions for each of P prompts of the task mixture (KV cache), rewards, group ids,
advantages, the loss forward, backward, gradient clipping and an AdamW step, with beta = 0
(no reference policy) and reward weights partial 1.0 + format 0.1 (a random policy earns
no accuracy). Its time is the interval between the loop's ``on_step`` calls. Default
P = 256 prompts x G = 4 completions (1024 rows): G = 8 doubles the step on 2 cores and would
only lower the ratios. The results file records how many completions stopped (<eos>)
before ``max_new_tokens`` and their mean length (the step's own completion/ metrics): a
trained policy that stops early has a shorter step, so the ratios would be larger. The
grouping timings run on one more batch collected by the same step (``collect``) with the
trained policy.

Measured in the same run, each timed ``--reps`` times (median reported):
  * embed, uncached: ``tfidf_embed`` fitted on the step's prompts (what
    ``kmeans_semantic`` does when given no embeddings);
  * embed, cached:   ``cached(fit_tfidf(mixture))`` after a warm-up pass: the prompts come
    from a fixed set, so each vector is computed once and looked up after;
  * K-means (k clusters, k-means++) with n_init=4 (default) and 1, and the purity each
    reaches against the task labels on 10 random batches (cheaper must not mean worse unseen);
  * Reclusterer assign (nearest centroid between re-fits; a re-fit costs one K-means);
  * advantages for both combine options; diagnostics (optional logging) separately.

Wall and process CPU time are both reported. On a shared machine, run with ``--threads 1``:
a one-thread step's CPU time counts its work honestly (two spinning threads on busy cores
were measured at 2-4x the CPU time), and the results add a pessimistic idle-machine bound.

    PYTHONPATH=. .venv/bin/python bench/bench_grouping.py --threads 1   # ~25 s; writes
                                                                         # bench/RESULTS_grouping.md
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from grpo_lab.training.config import TrainConfig
from grpo_lab.algorithm.embeddings import cached, fit_tfidf, tfidf_embed
from grpo_lab.algorithm.advantages import grouped_advantages, reward_group_diagnostics
from grpo_lab.algorithm.grouping import PromptBatch, cluster_diagnostics, kmeans_semantic
from grpo_lab.policies.model import GPT, GPTConfig, save_policy
from grpo_lab.algorithm.reclustering import Reclusterer
from grpo_lab.tasks.task_data import load_mixture
from grpo_lab.training.trainer import setup, train


def timed(fn, reps: int):
    """-> ((median wall seconds, median process CPU seconds), last result).

    CPU time (all threads of this process) is reported next to wall time because the
    machine may be shared: contention inflates wall time, mostly of the multi-threaded step.
    """
    wall, cpu, out = [], [], None
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return (statistics.median(wall), statistics.median(cpu)), out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=256, help="prompts per step")
    ap.add_argument("--G", type=int, default=4, help="completions per prompt")
    ap.add_argument("--k", type=int, default=7, help="K-means clusters (7 task families)")
    ap.add_argument("--steps", type=int, default=3, help="timed GRPO steps (after 1 warm-up)")
    ap.add_argument("--reps", type=int, default=10, help="repetitions of each grouping timing")
    ap.add_argument("--max-new-tokens", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads for the step (0: torch's default); 1 makes the step's "
                         "CPU time an honest count of its work on a shared machine")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_grouping.md")))
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    pool = load_mixture()
    model = GPT(GPTConfig())                                               # random init
    tmp = Path(tempfile.mkdtemp(prefix="bench_grouping_"))
    save_policy(model, tmp / "random_init.safetensors")
    cfg = TrainConfig(task="mixture", base_checkpoint=str(tmp / "random_init.safetensors"),
                      out_dir=str(tmp / "run"), steps=args.steps + 2, time_budget_s=0.0,
                      prompts_per_step=args.prompts, group_size=args.G,
                      max_new_tokens=args.max_new_tokens, temperature=1.0,
                      reward_weights={"partial": 1.0, "format": 0.1}, kl={"beta": 0.0}, lr=1e-4,
                      warmup_steps=0, lr_schedule="constant", eval_size=0, eval_every=0,
                      ckpt_every=10 ** 9, seed=args.seed, threads=args.threads)
    marks = []                       # (wall, CPU, metrics, policy) as each step ends

    def on_step(metrics, policy):
        marks.append((time.perf_counter(), time.process_time(), metrics, policy))

    load_before = os.getloadavg()[0]
    train(cfg, progress=False, on_step=on_step)     # step 0 warms up; the last one writes the
    ends = marks[:args.steps + 1]                   # checkpoint before its mark: not timed
    step = (statistics.median(b[0] - a[0] for a, b in zip(ends, ends[1:])),
            statistics.median(b[1] - a[1] for a, b in zip(ends, ends[1:])))
    last = ends[-1][2]                                                     # its metrics
    run = setup(cfg)                                # one more batch, from the trained policy
    batch = run.objective.collect(marks[-1][3], cfg, cfg.steps, run.ctx)
    r, rewards = batch.scored.rollout, batch.scored.rewards               # (N,) rows
    shutil.rmtree(tmp, ignore_errors=True)

    prompts = [e.prompt for e in batch.scored.examples]
    tasks = [e.task for e in batch.scored.examples]
    embed_fixed = cached(fit_tfidf([e.prompt for e in pool]))
    embed_fixed([e.prompt for e in pool])                                  # fill the cache
    t_embed, X_unc = timed(lambda: tfidf_embed(prompts), args.reps)
    t_embed_c, X = timed(lambda: embed_fixed(prompts), args.reps)
    t_km, ids = timed(lambda: kmeans_semantic(PromptBatch(prompts, embeddings=X), args.k,
                                              seed=args.seed), args.reps)
    t_km1, _ = timed(lambda: kmeans_semantic(PromptBatch(prompts, embeddings=X), args.k,
                                             seed=args.seed, n_init=1), args.reps)
    purity = {n: [] for n in (1, 4)}                                       # quality of each
    for s in range(10):                                                    # on 10 batches
        ex = random.Random(1000 + s).sample(pool, args.prompts)
        b = PromptBatch([e.prompt for e in ex], embeddings=embed_fixed([e.prompt for e in ex]))
        for n in purity:
            g = kmeans_semantic(b, args.k, seed=s, n_init=n)
            purity[n].append(cluster_diagnostics(b.prompts, g, [e.task for e in ex])["group/purity"])
    rc = Reclusterer(k=args.k, every=10, seed=args.seed)
    rc.refit(X)
    t_assign, _ = timed(lambda: rc.assign(X), args.reps)
    t_adv, _ = timed(lambda: grouped_advantages(ids, r.prompt_index, rewards, "cluster"), args.reps)
    t_adv_p, _ = timed(lambda: grouped_advantages(ids, r.prompt_index, rewards,
                                                  "within_prompt_pooled_std"), args.reps)
    t_diag, diag = timed(lambda: {**reward_group_diagnostics(rewards, ids[r.prompt_index]),
                                  **cluster_diagnostics(prompts, ids, tasks, X)}, args.reps)
    add = lambda *ts: tuple(map(sum, zip(*ts)))                             # (wall, cpu)
    t_unc = add(t_embed, t_km, t_adv)
    t_cached = add(t_embed_c, t_km, t_adv)
    t_recl = add(t_embed_c, tuple(x / 10 for x in t_km),                   # re-fit every 10
                 tuple(9 * x / 10 for x in t_assign), t_adv)              # steps, amortised
    load_after = os.getloadavg()[0]
    share = lambda t: f"{100 * t[0] / step[0]:.2f}% | {100 * t[1] / step[1]:.2f}%"

    rows = [
        ("GRPO step (trainer: sample + rewards + advantages + loss + backward + AdamW)", step),
        ("TF-IDF embed, uncached (fit on the step's prompts)", t_embed),
        ("TF-IDF embed, cached (fixed fit, lookup)", t_embed_c),
        (f"K-means k={args.k}, n_init=4 (default)", t_km),
        (f"K-means k={args.k}, n_init=1", t_km1),
        ("Reclusterer.assign (between re-fits)", t_assign),
        ("advantages, combine=cluster (grpo)", t_adv),
        ("advantages, combine=within_prompt_pooled_std", t_adv_p),
        ("diagnostics (reward groups + cluster quality; optional logging)", t_diag),
    ]
    ratios = [
        ("uncached embed + K-means + advantages", t_unc),
        ("cached embed + K-means + advantages", t_cached),
        ("cached embed + K-means n_init=1 + advantages", add(t_embed_c, t_km1, t_adv)),
        ("cached embed + Reclusterer (re-fit every 10 steps, amortised) + advantages", t_recl),
    ]
    cmd = "PYTHONPATH=. " + " ".join([".venv/bin/python", "bench/bench_grouping.py"]
                                     + (argv if argv is not None else sys.argv[1:]))
    lines = [
        "# Grouping overhead per GRPO step", "", "```", cmd, "```", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}.", "",
        f"Step: {args.prompts} prompts x G={args.G} = {args.prompts * args.G} rows from the task "
        f"mixture, max_new_tokens={args.max_new_tokens}, toy GPT ({model.num_params():,} params, "
        f"random init, beta 0); {100 * last['completion/stopped_frac']:.0f}% of completions "
        f"emitted <eos>, mean length {last['completion/mean_len']:.1f} tokens (last timed "
        f"step); "
        f"median of {args.steps} steps. Grouping timings: median of {args.reps} "
        f"repetitions. Load average (1 min) {load_before:.1f} before, {load_after:.1f} after: "
        f"above {os.cpu_count()} means other processes shared the CPUs, which inflates the "
        f"multi-threaded step's wall time most; the CPU-time share is the steadier figure.", "",
        "| part | wall (ms) | CPU (ms) | share of step, wall | share, CPU |",
        "|---|---:|---:|---:|---:|",
        *[f"| {name} | {t[0] * 1e3:.2f} | {t[1] * 1e3:.2f} | {share(t)} |" for name, t in rows],
        "", "| grouping + advantages per step | wall (ms) | CPU (ms) | share, wall | share, CPU "
        "| goal < 5% (both) |", "|---|---:|---:|---:|---:|---|",
        *[f"| {name} | {t[0] * 1e3:.2f} | {t[1] * 1e3:.2f} | {share(t)} | "
          f"{'met' if max(t[0] / step[0], t[1] / step[1]) < 0.05 else 'NOT met'} |"
          for name, t in ratios],
        "", f"Idle-machine bound: if the step's CPU time spread perfectly over all "
        f"{os.cpu_count()} cores, a step would take {step[1] / os.cpu_count() * 1e3:.0f} ms and "
        f"the uncached grouping (one thread, its CPU time) {100 * t_unc[1] * os.cpu_count() / step[1]:.2f}% "
        f"of it, the cached one {100 * t_cached[1] * os.cpu_count() / step[1]:.2f}%, the "
        f"Reclusterer path {100 * t_recl[1] * os.cpu_count() / step[1]:.2f}% (pessimistic: no "
        f"real step scales perfectly).",
        "", "Purity against the task labels over 10 random batches (min / mean): "
        + ", ".join(f"n_init={n}: {min(v):.3f} / {np.mean(v):.3f}" for n, v in purity.items())
        + ".",
        "", "Diagnostics on the last step's K-means groups: "
        + ", ".join(f"`{k}` = {v:.3f}" for k, v in diag.items()) + ".", "",
        "Notes: the uncached TF-IDF embedder is refitted on every batch (its vectors live in a "
        "new space each step); the cached one is fitted once on the mixture, so a prompt's "
        "vector is computed once. K-means and the silhouette run on one thread "
        "(reclustering.kmeans_fit explains why); the step uses the torch threads named above.",
    ]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
