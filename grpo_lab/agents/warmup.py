"""A supervised warm-up on an environment's demonstrations, before GRPO.

The toy base policy (data/base_policy.safetensors) was pretrained on sums, sorts and
reversals; asked ``g:23-30=`` it writes nothing like a guess in the range, so GRPO on the
guessing game from it sees a reward of 0 in every group and learns nothing (measured:
BENCHMARKS-style numbers in bench/bench_agents.py). As the toy got a supervised warm-up on
its tasks, an environment may give a scripted player (``Environment.demo(instance, rng) ->
action``); ``warm_up`` plays episodes with it through the environment itself (the same turn
and token limits as sampling) and trains the policy by cross-entropy on the player's tokens
only: the same loss mask as GRPO, the observations fed but not predicted.

The guessing game's player guesses uniformly among the numbers the feedback leaves possible:
it teaches the format (a number in the open range, then <eos>) and to use the feedback, not
bisection; its mean turns on 8 numbers (``random_guesses(8)`` = 3.12) is above the optimum
(2.625), which is what GRPO then has to find.
"""
from __future__ import annotations

import random
from functools import lru_cache

import torch

from grpo_lab.agents.environments import Environment, env_make, env_reset, env_step
from grpo_lab.algorithm.rollout import Rollout, completion_logprobs
from grpo_lab.policies.engine import completion_logits, left_pad


@lru_cache(maxsize=None)
def random_guesses(n: int) -> float:
    """Expected guesses of the player that picks uniformly among the n numbers still possible,
    for a uniform secret: E(n) = 1 + sum_{g=1..n} ((g-1) E(g-1) + (n-g) E(n-g)) / n^2."""
    if n == 0:
        return 0.0
    return 1 + sum((g - 1) * random_guesses(g - 1) + (n - g) * random_guesses(n - g)
                   for g in range(1, n + 1)) / n ** 2


def demonstration(model, env: Environment, example, rng: random.Random):
    """One episode played by ``env.demo`` -> (prompt ids, completion ids, policy's mask)."""
    s, inst = env.settings, env_make(env)
    ids, own = [], []
    obs = env_reset(env, inst, example, 0)
    room = model.cfg.block_size - len(model.encode(example.prompt))
    for turn in range(s.max_turns):
        o = model.encode(obs)[:s.max_observation_tokens] if obs else []
        action = env.demo(inst, rng)
        a = model.encode(action) + [model.eos_id]
        if len(ids) + len(o) + len(a) > room or len(a) > s.max_action_tokens:
            break
        ids, own = ids + o + a, own + [False] * len(o) + [True] * len(a)
        obs, _, done = env_step(env, inst, action, turn + 1)
        if done:
            break
    return model.encode(example.prompt), ids, own


def demo_batch(model, env: Environment, examples, rng: random.Random) -> Rollout:
    """Demonstrations as a Rollout: prompts left-padded, completions right-padded, loss_mask
    on the player's tokens."""
    demos = [demonstration(model, env, ex, rng) for ex in examples]
    p_ids, p_mask = left_pad([d[0] for d in demos], model.pad_id)          # (B, Tp)
    Tc = max(len(d[1]) for d in demos)
    ids = torch.full((len(demos), Tc), model.pad_id, dtype=torch.long)
    mask = torch.zeros(len(demos), Tc, dtype=torch.bool)
    own = torch.zeros(len(demos), Tc, dtype=torch.bool)
    for i, (_, c, m) in enumerate(demos):
        ids[i, :len(c)], mask[i, :len(c)], own[i, :len(c)] = torch.tensor(c), True, torch.tensor(m)
    B = len(demos)
    return Rollout(p_ids, p_mask, ids, mask, torch.zeros(B, Tc), torch.arange(B),
                   torch.ones(B, dtype=torch.bool), loss_mask=own)


def warm_up(model, env: Environment, draw, steps: int, batch: int = 64, lr: float = 1e-3,
            seed: int = 0) -> list[float]:
    """``steps`` AdamW steps of cross-entropy on ``batch`` demonstrations each (``draw(rng,
    n)`` -> examples: the run's prompt source, held-out prompts excluded) -> the losses."""
    if env.demo is None:
        raise ValueError(f"environment {env.name!r} has no demo player (Environment.demo)")
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        r = demo_batch(model, env, draw(rng, batch), rng)
        logp = completion_logprobs(model, r, 1.0, forward=completion_logits)  # (B, Tc)
        loss = -(logp * r.loss_mask).sum() / r.loss_mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def run_warm_up(task: str, out: str | None = None, base: str = "data/base_policy.safetensors",
                steps: int = 1500, batch: int = 64, lr: float = 1e-3, seed: int = 0,
                threads: int = 0, evaluate=None) -> dict:
    """``grpo-lab warmup``: the base policy warmed up on environment ``task``'s scripted
    player (``warm_up``; its held-out prompts never drawn), written to ``out`` (default
    runs/agents/<task>_warm.safetensors, where the preset agent_cpu looks for ``guess``'s) ->
    a summary: the losses' first and last, the held-out greedy success and mean turns before
    and after (``evaluate(policy, {task: examples})`` -> metrics, e.g. agents.step's
    ``evaluate_episodes``, passed in so this module stays below the step), the seconds. ``grpo-lab train --objective agent --task TASK
    --base_checkpoint OUT`` then starts GRPO from it."""
    import time
    from pathlib import Path

    from grpo_lab.agents import games  # noqa: F401 (the shipped environments)
    from grpo_lab.agents.environments import get_environment
    from grpo_lab.policies.model import load_policy, save_policy
    from grpo_lab.tasks import TASKS, sample_examples
    for name, v, least in (("steps", steps, 1), ("batch", batch, 1), ("threads", threads, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError(f"warm-up {name} must be an int >= {least}, got {v!r}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < float("inf"):
        raise ValueError(f"warm-up lr must be a positive number, got {lr!r}")
    env = get_environment(task)
    if env.demo is None:
        raise ValueError(f"environment {task!r} has no demo player (Environment.demo) to warm "
                         f"up on")
    out = out or f"runs/agents/{task}_warm.safetensors"
    if threads:
        torch.set_num_threads(threads)
    held = TASKS[task].eval_fn() if TASKS[task].eval_fn is not None else []
    prompts = {e.prompt for e in held}
    policy = load_policy(base)

    def measure() -> dict:
        if evaluate is None or not held:
            return {}
        r = evaluate(policy, {task: held})
        return {"success": round(r["eval/accuracy"], 4), "turns": round(r["eval/turns"], 4)}

    before, t0 = measure(), time.perf_counter()
    losses = warm_up(policy, env, lambda rng, n: sample_examples([TASKS[task]], n, rng, prompts),
                     steps, batch=batch, lr=lr, seed=seed)
    seconds = time.perf_counter() - t0
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_policy(policy, out, {"warm_up": {"task": task, "base": base, "steps": steps,
                                          "batch": batch, "lr": lr, "seed": seed}})
    return {"out": out, "task": task, "steps": steps, "loss_first": round(losses[0], 4),
            "loss_last": round(losses[-1], 4), "seconds": round(seconds, 1),
            "held_out": len(held), "before": before, "after": measure()}
