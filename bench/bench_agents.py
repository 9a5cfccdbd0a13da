"""Multi-turn GRPO on the guessing game (agents/): a supervised warm-up on a random player,
then GRPO with episode-level credit and with GiGPO's step groups, measured on the held-out
ranges: success rate, mean turns against the optimum (bisection) and the warm-up's player.

    python bench/bench_agents.py --env guess --warm_steps 600 --steps 200 --seed 0

Writes runs/agents/<env>_warm.safetensors (the preset agent_cpu starts from it) and prints one
table row per arm; the run folders are runs/agents/<env>_<credit>_s<seed>.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grpo_lab.agents import step as agent_step  # noqa: E402,F401 (registers the environments)
from grpo_lab.agents.environments import get_environment, with_settings  # noqa: E402
from grpo_lab.agents.episodes import sample_episodes  # noqa: E402
from grpo_lab.agents.games import optimal_guesses  # noqa: E402
from grpo_lab.agents.step import evaluate_episodes  # noqa: E402
from grpo_lab.agents.warmup import random_guesses, warm_up  # noqa: E402
from grpo_lab.policies.model import load_policy, save_policy  # noqa: E402
from grpo_lab.policies.policy import load_policy_any  # noqa: E402
from grpo_lab.tasks import TASKS, get_task, sample_examples  # noqa: E402
from grpo_lab.training.config import preset  # noqa: E402
from grpo_lab.training.trainer import train  # noqa: E402

WIDTH = {"guess": 8, "guess4": 4}


def sampled(policy, env, held, G: int = 8) -> str:
    """Held-out success, turns of the successes and mean return at temperature 1 (G episodes
    per held-out example, seeded): the policy GRPO trains, not its greedy mode."""
    ep = sample_episodes(policy, held, env, G, temperature=1.0,
                         generator=[torch.Generator().manual_seed(i) for i in range(len(held))])
    won = [len(t) for t, e in zip(ep.turns, ep.end) if e == "done"]
    return (f"sampled: success {len(won) / len(ep.end):.3f}, turns of the successes "
            f"{sum(won) / max(len(won), 1):.3f}, return {float(ep.scored.rewards.mean()):.3f}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="guess")
    ap.add_argument("--warm_steps", type=int, default=600)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--credits", nargs="+", default=["episode", "gigpo"])
    ap.add_argument("--lr", type=float, default=3e-4)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path("runs/agents")
    out.mkdir(parents=True, exist_ok=True)
    env, task = get_environment(a.env), TASKS[a.env]
    held = task.eval_fn()
    warm = out / f"{a.env}_warm.safetensors"
    t0 = time.perf_counter()
    policy = load_policy("data/base_policy.safetensors")
    base = evaluate_episodes(policy, {a.env: held})
    prompts = {e.prompt for e in held}
    task = get_task(a.env)
    losses = warm_up(policy, env, lambda rng, n: sample_examples([task], n, rng, prompts),
                     a.warm_steps, seed=a.seed)
    save_policy(policy, warm)
    warmed = evaluate_episodes(policy, {a.env: held})
    t_warm = time.perf_counter() - t0
    w = WIDTH.get(a.env)
    print(f"CPU: {platform.processor() or platform.machine()}, load {os.getloadavg()}")
    print(f"optimum {optimal_guesses(w):.3f} guesses, random player {random_guesses(w):.3f}")
    print(f"base   : {base}")
    print(f"warm-up: {a.warm_steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
          f"{t_warm:.1f} s: {warmed}; {sampled(policy, env, held)}")
    for credit in a.credits:
        name = a.env if credit == "episode" else f"{a.env}_{credit}"
        if credit != "episode":
            with_settings(a.env, name, credit=credit)
        cfg = preset("agent_cpu", task=name, base_checkpoint=str(warm), steps=a.steps,
                     seed=a.seed, lr=a.lr, eval_every=max(a.steps // 4, 1),
                     eval_size=len(held), out_dir=str(out / f"{name}_s{a.seed}"),
                     time_budget_s=0.0, threads=1, ckpt_every=10 ** 6)
        t = time.perf_counter()
        h = train(cfg, progress=False)
        evals = [(r["step"], round(r["eval/accuracy"], 3), round(r["eval/turns"], 3),
                  round(r.get("eval/turns_success", float("nan")), 3))
                 for r in h if "eval/accuracy" in r]
        print(f"{credit:8s}: {time.perf_counter() - t:.1f} s, greedy (step, success, turns, "
              f"turns of the successes): {evals}", flush=True)
        trained = load_policy_any(Path(cfg.out_dir) / "checkpoint.safetensors")
        rows = [r for r in h if "reward/mean" in r]
        first, last = rows[:50], rows[-50:]
        mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)              # noqa: E731
        print(f"          training (sampled) first / last 50 steps: success "
              f"{mean(first, 'episode/success'):.3f} -> {mean(last, 'episode/success'):.3f}, "
              f"turns {mean(first, 'episode/turns_mean'):.2f} -> "
              f"{mean(last, 'episode/turns_mean'):.2f}; held out {sampled(trained, env, held)}",
              flush=True)


if __name__ == "__main__":
    main()
