"""The study of issue 47 item 7: episode-level credit against GiGPO's step groups on the
guessing game, over seeds, paired by seed (BENCHMARKS.md section 23).

Per seed s: one supervised warm-up (1500 steps of 64 demonstrations, seeded s; the credit plays
no part in it, so both arms of a seed start from the same checkpoint), then GRPO with each
credit (the preset agent_cpu, 1000 steps, seed s: both arms draw the same prompts at every
step), each trained policy measured on the 72 held-out episodes greedily and on 8 sampled
episodes per held-out example (T = 1, seeded). The question and the metric are fixed in
bench/RESULTS_agents_study.md before any run.

    python bench/bench_agents_study.py run --seed 0            # one seed, both arms -> JSON
    python bench/bench_agents_study.py report --seeds 0 1 2    # the table, paired intervals

``run`` writes runs/agents_study/seed<s>.json (one record per arm, plus the warm-up's);
``report`` reads them and prints the markdown tables (per seed, paired difference with its
95% t interval, what the seeds could detect at the sd's one-sided 95% upper bound).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grpo_lab.agents import step as agent_step  # noqa: E402,F401 (registers the environments)
from grpo_lab.agents.environments import ENVIRONMENTS, get_environment, with_settings  # noqa: E402
from grpo_lab.agents.episodes import sample_episodes  # noqa: E402
from grpo_lab.agents.games import optimal_guesses  # noqa: E402
from grpo_lab.agents.step import evaluate_episodes  # noqa: E402
from grpo_lab.agents.warmup import warm_up  # noqa: E402
from grpo_lab.policies.model import load_policy, save_policy  # noqa: E402
from grpo_lab.policies.policy import load_policy_any  # noqa: E402
from grpo_lab.tasks import TASKS, get_task, sample_examples  # noqa: E402
from grpo_lab.training.config import preset  # noqa: E402
from grpo_lab.training.power import detectable  # noqa: E402
from grpo_lab.training.trainer import train  # noqa: E402

ENV = "guess"
ARMS = ("episode", "gigpo")
OUT = Path("runs/agents_study")


def sampled(policy, env, held, G: int = 8) -> dict:
    """G episodes per held-out example at T = 1 (generator i for example i): success, mean
    turns over all episodes and over the successes, mean return."""
    ep = sample_episodes(policy, held, env, G, temperature=1.0,
                         generator=[torch.Generator().manual_seed(i) for i in range(len(held))])
    ok = [e == "done" and float(r) > 0 for e, r in zip(ep.end, ep.scored.rewards)]
    turns = [len(t) for t in ep.turns]
    won = [t for t, o in zip(turns, ok) if o]
    return {"success": sum(ok) / len(ok), "turns": sum(turns) / len(turns),
            "turns_success": sum(won) / max(len(won), 1),
            "return": float(ep.scored.rewards.mean())}


def greedy(policy, held) -> dict:
    r = evaluate_episodes(policy, {ENV: held})
    return {"success": r["eval/accuracy"], "turns": r["eval/turns"],
            "turns_success": r.get("eval/turns_success", float("nan")),
            "return": r["eval/reward"]}


def run(a) -> None:
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    env, held = get_environment(ENV), TASKS[ENV].eval_fn()
    rec = {"seed": a.seed, "warm_steps": a.warm_steps, "steps": a.steps, "lr": a.lr,
           "load_start": os.getloadavg()}
    warm = OUT / f"{ENV}_warm_s{a.seed}.safetensors"
    t0 = time.perf_counter()
    policy = load_policy("data/base_policy.safetensors")
    prompts = {e.prompt for e in held}
    losses = warm_up(policy, env, lambda rng, n: sample_examples([get_task(ENV)], n, rng, prompts),
                     a.warm_steps, seed=a.seed)
    save_policy(policy, warm)
    rec["warm"] = {"seconds": time.perf_counter() - t0, "loss_first": losses[0],
                   "loss_last": losses[-1], "greedy": greedy(policy, held),
                   "sampled": sampled(policy, env, held)}
    print(f"seed {a.seed} warm-up: {rec['warm']}", flush=True)
    for credit in ARMS:
        name = ENV if credit == "episode" else f"{ENV}_{credit}"
        if name not in ENVIRONMENTS:
            with_settings(ENV, name, credit=credit)
        cfg = preset("agent_cpu", task=name, base_checkpoint=str(warm), steps=a.steps,
                     seed=a.seed, lr=a.lr, eval_every=max(a.steps // 4, 1),
                     eval_size=len(held), out_dir=str(OUT / f"{name}_s{a.seed}"),
                     time_budget_s=0.0, threads=1, ckpt_every=10 ** 6)
        t = time.perf_counter()
        h = train(cfg, progress=False)
        seconds = time.perf_counter() - t
        trained = load_policy_any(Path(cfg.out_dir) / "checkpoint.safetensors")
        rows = [r for r in h if "reward/mean" in r]
        first, last = rows[:50], rows[-50:]
        mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)              # noqa: E731
        rec[credit] = {
            "seconds": seconds, "greedy": greedy(trained, held),
            "sampled": sampled(trained, env, held),
            "curve": [(r["step"], r["eval/accuracy"], r["eval/turns"])
                      for r in h if "eval/accuracy" in r],
            "train_success": [mean(first, "episode/success"), mean(last, "episode/success")],
            "train_turns": [mean(first, "episode/turns_mean"), mean(last, "episode/turns_mean")],
        }
        print(f"seed {a.seed} {credit}: {rec[credit]}", flush=True)
    rec["load_end"] = os.getloadavg()
    (OUT / f"seed{a.seed}.json").write_text(json.dumps(rec, indent=1))


METRICS = (("greedy", "success", "greedy held-out success (the question)"),
           ("greedy", "turns", "greedy mean turns, all episodes"),
           ("sampled", "success", "sampled held-out success (T=1, 8 each)"),
           ("sampled", "turns", "sampled mean turns, all episodes"),
           ("sampled", "return", "sampled mean return"))


def paired(d: list[float]) -> dict:
    from scipy.stats import t
    n = len(d)
    m = sum(d) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
    h = t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    out = {"mean": m, "lo": m - h, "hi": m + h, "sd": sd}
    if sd > 0:
        out.update(detectable(sd, n, n - 1))
    return out


def report(a) -> None:
    recs = [json.loads((OUT / f"seed{s}.json").read_text()) for s in a.seeds]
    opt = optimal_guesses(8)
    print(f"optimum {opt:.3f} guesses; 1.5x = {1.5 * opt:.3f}\n")
    print("| seed | arm | greedy success | greedy turns (all) | greedy turns (successes) | "
          "sampled success | sampled turns (all) | sampled return | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in recs:
        for arm in ("warm",) + ARMS:
            g, s = r[arm]["greedy"], r[arm]["sampled"]
            print(f"| {r['seed']} | {arm} | {g['success']:.3f} | {g['turns']:.3f} | "
                  f"{g['turns_success']:.3f} | {s['success']:.3f} | {s['turns']:.3f} | "
                  f"{s['return']:.3f} | {r[arm]['seconds']:.0f} |")
    print(f"\n| gigpo - episode (paired, {len(recs)} seeds) | per seed | mean | 95% t interval "
          f"| sd | detectable (80%, sd bound) | rough (sd seen) |")
    print("|---|---|---:|---|---:|---:|---:|")
    for part, key, label in METRICS:
        d = [r["gigpo"][part][key] - r["episode"][part][key] for r in recs]
        p = paired(d)
        det = (f"{p['detectable']:.3f} | {p['rough']:.3f}" if "detectable" in p else "- | -")
        print(f"| {label} | {', '.join(f'{x:+.3f}' for x in d)} | {p['mean']:+.3f} | "
              f"[{p['lo']:+.3f}, {p['hi']:+.3f}] | {p['sd']:.3f} | {det} |")
    print("\nthe goal (success >= 0.90 held out, mean turns over all episodes <= "
          f"{1.5 * opt:.3f}), per arm, mean over seeds:")
    for arm in ARMS:
        for part in ("greedy", "sampled"):
            s = [r[arm][part]["success"] for r in recs]
            tt = [r[arm][part]["turns"] for r in recs]
            met = sum(x >= 0.9 and y <= 1.5 * opt for x, y in zip(s, tt))
            print(f"  {arm} {part}: success {sum(s) / len(s):.3f} (min {min(s):.3f}), turns "
                  f"{sum(tt) / len(tt):.3f} (max {max(tt):.3f}) = "
                  f"{sum(tt) / len(tt) / opt:.2f}x the optimum; met in {met}/{len(recs)} seeds")


def main(argv=None):
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--warm_steps", type=int, default=1500)
    r.add_argument("--steps", type=int, default=1000)
    r.add_argument("--lr", type=float, default=3e-4)
    p = sub.add_parser("report")
    p.add_argument("--seeds", type=int, nargs="+", required=True)
    a = ap.parse_args(argv)
    run(a) if a.cmd == "run" else report(a)


if __name__ == "__main__":
    main()
