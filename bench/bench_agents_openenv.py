"""The toy trained on a TextArena game through the OpenEnv adapter (agents/adapters.py): the
same multi-turn GRPO as bench_agents.py, but every episode's environment is TextArena's
GuessTheNumber-v0 wrapped as an OpenEnv ``Environment`` and adapted into a grpo_lab record
(``ta_guess``: ranges of 8, 5 turns, TextArena's reward: 1 for the right number).

A supervised warm-up on the toy's own ``guess`` (games.py: the same prompts ``g:23-30=`` and
the same feedback alphabet; its random consistent player), then GRPO on ``ta_guess``. Held
out: the 72 fixed games of ``ta_guess`` (the toy's held-out ranges, reset seeds pinned).

    pip install 'grpo_lab[openenv]'     # openenv-core, textarena (a separate venv is fine)
    python bench/bench_agents_openenv.py --warm_steps 600 --steps 200 --seed 0
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_op_overhead import cpu_line  # noqa: E402
from grpo_lab.agents import step as agent_step  # noqa: E402,F401 (registers the environments)
from grpo_lab.agents.adapters import register_textarena_guess  # noqa: E402
from grpo_lab.agents.environments import get_environment  # noqa: E402
from grpo_lab.agents.episodes import sample_episodes  # noqa: E402
from grpo_lab.agents.warmup import warm_up  # noqa: E402
from grpo_lab.policies.model import load_policy, save_policy  # noqa: E402
from grpo_lab.policies.policy import load_policy_any  # noqa: E402
from grpo_lab.tasks import TASKS, get_task, sample_examples  # noqa: E402
from grpo_lab.training.config import preset  # noqa: E402
from grpo_lab.training.trainer import train  # noqa: E402


def held_out(policy, env, held, G: int = 8) -> str:
    """Greedy and sampled (T=1, G episodes per game, seeded) play on the held-out games. A win
    is a reward of 1: TextArena pays a lost game its percentage completion (> 0), so the
    trainer's episode/success and eval/accuracy (a positive return) count those too."""
    out = []
    for name, kw in (("greedy", {"greedy": True}), ("sampled", {
            "temperature": 1.0,
            "generator": [torch.Generator().manual_seed(i) for i in range(len(held))]})):
        g = 1 if name == "greedy" else G
        ep = sample_episodes(policy, held, env, g, **kw)
        won = [len(t) for t, r in zip(ep.turns, ep.scored.rewards.tolist()) if r >= 1.0]
        out.append(f"{name}: won {len(won) / len(ep.end):.3f}, turns of the wins "
                   f"{sum(won) / max(len(won), 1):.2f}, return "
                   f"{float(ep.scored.rewards.mean()):.3f}")
    return "; ".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm_steps", type=int, default=600)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-4)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    import openenv.core  # noqa: F401  (fails here, named, without the extra)
    import textarena  # noqa: F401
    from importlib.metadata import version
    out = Path("runs/agents_openenv")
    out.mkdir(parents=True, exist_ok=True)
    env = register_textarena_guess()
    held = TASKS["ta_guess"].eval_fn()
    guess, guess_held = get_environment("guess"), {e.prompt for e in TASKS["guess"].eval_fn()}
    print(f"{cpu_line()}; load {os.getloadavg()}; openenv-core {version('openenv-core')}, "
          f"textarena {version('textarena')}")
    t0 = time.perf_counter()
    policy = load_policy("data/base_policy.safetensors")
    base = held_out(policy, env, held)
    task = get_task("guess")
    losses = warm_up(policy, guess, lambda rng, n: sample_examples([task], n, rng, guess_held),
                     a.warm_steps, seed=a.seed)
    warm = out / "guess_warm.safetensors"
    save_policy(policy, warm)
    warmed = held_out(policy, env, held)
    print(f"base   : {base}")
    print(f"warm-up on the toy's guess: {a.warm_steps} steps, loss {losses[0]:.3f} -> "
          f"{losses[-1]:.3f}, {time.perf_counter() - t0:.1f} s; on ta_guess: {warmed}",
          flush=True)
    cfg = preset("agent_cpu", task="ta_guess", base_checkpoint=str(warm), steps=a.steps,
                 seed=a.seed, lr=a.lr, eval_every=max(a.steps // 4, 1), eval_size=len(held),
                 out_dir=str(out / f"ta_guess_s{a.seed}"), time_budget_s=0.0, threads=1,
                 ckpt_every=10 ** 6)
    t = time.perf_counter()
    h = train(cfg, progress=False)
    took = time.perf_counter() - t
    evals = [(r["step"], round(r["eval/reward"], 3), round(r["eval/turns"], 3))
             for r in h if "eval/reward" in r]
    rows = [r for r in h if "reward/mean" in r]
    k = max(len(rows) // 4, 1)
    mean = lambda rs, key: sum(r[key] for r in rs) / len(rs)              # noqa: E731
    trained = load_policy_any(Path(cfg.out_dir) / "checkpoint.safetensors")
    print(f"GRPO on ta_guess through the adapter: {a.steps} steps, {took:.1f} s "
          f"({took / a.steps:.3f} s/step); greedy held out (step, return, turns): {evals}")
    print(f"training (sampled) first / last {k} steps: return {mean(rows[:k], 'reward/mean'):.3f} -> {mean(rows[-k:], 'reward/mean'):.3f}, "
          f"turns {mean(rows[:k], 'episode/turns_mean'):.2f} -> "
          f"{mean(rows[-k:], 'episode/turns_mean'):.2f}")
    print(f"trained on ta_guess: {held_out(trained, env, held)}",
          flush=True)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
