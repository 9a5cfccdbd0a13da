"""The multi-turn GRPO step: objective "agent" (``--objective agent --task guess``).

    collect_episodes(policy, cfg, step, ctx) -> step.Batch          (no grad)
        draw B prompts, seeded by (seed, step) as step.collect draws them; this rank's slice
        -> G episodes each (episodes.sample_episodes; prompt i with its own generator, its G
        episodes reset with one seed)
        episode returns gathered from every rank (ranks.gather_rows; one process: itself)
        group ids (the run's grouper), episode advantages on the global batch (the run's
        estimator, advantages.grouped_advantages); this rank keeps its rows
        credit (credit.py, the environment's AgentSettings.credit): per-token advantages
    loss: step.grpo_objective, unchanged: it reads ``Rollout.policy_mask`` (the policy's own
        tokens), so the observation tokens stay out of the ratio, the KL, the entropy and the
        length normaliser, and ``Batch.n_tokens`` counts policy tokens only.

The environment's settings live on its record (environments.AgentSettings), not on
TrainConfig. What this version refuses (``check``), each with the reason: a policy other than
"toy" and "hf" (an HF policy samples its episodes through the same rollout: transformers'
KV cache kept across turns, episodes.py), rollout="vllm" (vLLM samples one turn), dynamic sampling, overlong rules and
kl.placement="reward" (they read whole completions), process supervision, an answer_format
(the environment's task writes its prompts, in words or not), the dr_grpo aggregation
(its constant is the single-turn completion limit), several tasks at once.
"""
from __future__ import annotations

import random

import torch

from grpo_lab.agents import calculator, games, quick  # noqa: F401 (the shipped environments)
from grpo_lab.agents.credit import get_credit, step_groups
from grpo_lab.agents.environments import ENVIRONMENTS, get_environment, tool_metrics
from grpo_lab.agents.episodes import sample_episodes
from grpo_lab.algorithm.advantages import advantage_diagnostics, grouped_advantages
from grpo_lab.algorithm.rollout import DRAWS
from grpo_lab.algorithm.variants import active_variants
from grpo_lab.timelimit import user_code
from grpo_lab.training.step import (Batch, Gathered, StepContext, gather_rows, grpo_objective,
                                    prompt_generators, register_objective, seed_of)


def reset_seeds(seed: int, step: int, indices) -> list[int]:
    """The reset seed of each prompt: (seed, step, prompt index), the same on every rank."""
    return [seed_of(seed, step, "reset", i) for i in indices]


def episode_metrics(ep, g: Gathered, adv_flat: torch.Tensor, prompt_index, G: int) -> dict:
    """reward/, episode/, completion/, adv/ metrics. episode/ metrics are this rank's episodes
    (on one process, the batch's) but done_frac, the global batch's as reward/ and completion/.
    No completion/stopped_frac: health.py's "truncated" finding reads it as cut at
    max_new_tokens, which an episode's limits are not (episode/truncated_* say which)."""
    n = max(len(ep.end), 1)
    turns = [len(t) for t in ep.turns]
    groups = step_groups(ep.turns, ep.scored.rollout.prompt_index)
    sizes = [len(m) for m in groups.values()]
    return {
        "reward/mean": float(g.rewards.mean()), "reward/std": float(g.rewards.std()),
        "episode/success": sum(e == "done" and float(r) > 0 for e, r in
                               zip(ep.end, ep.scored.rewards)) / n,
        "episode/turns_mean": sum(turns) / n,
        "episode/truncated_turns_frac": ep.end.count("turns") / n,
        "episode/truncated_tokens_frac": ep.end.count("tokens") / n,
        "episode/obs_cut": ep.obs_cut, "episode/obs_dropped_chars": ep.dropped_chars,
        "episode/step_groups": len(sizes),
        "episode/step_group_size": sum(sizes) / max(len(sizes), 1),
        "completion/mean_len": float(g.lengths.float().mean()),          # policy tokens
        "episode/done_frac": float(g.stopped.float().mean()),           # the global batch's
        "adv/abs_mean": float(adv_flat.abs().mean()),
        **advantage_diagnostics(adv_flat, prompt_index),
        **{f"tool/{k}": v for k, v in tool_metrics(ep.info).items()},   # this rank's
    }


@torch.no_grad()
def collect_episodes(policy, cfg, step: int, ctx: StepContext) -> Batch:
    """Prompts -> episodes -> returns -> group ids -> advantages -> credit: one ``Batch``."""
    env, G, B = get_environment(cfg.task), cfg.group_size, cfg.prompts_per_step
    mine = ctx.group.slice(B)
    with user_code(f"the task generator of {cfg.task!r}"):
        examples = ctx.draw(random.Random(f"{cfg.seed}-prompts-{step}-0"), B)   # (B,)
    ep = sample_episodes(policy, [examples[i] for i in mine], env, G, cfg.temperature,
                         cfg.top_k or None, generator=prompt_generators(cfg.seed, step, 0, mine),
                         seeds=reset_seeds(cfg.seed, step, mine), draw=DRAWS[cfg.sampler.draw],
                         top_p=cfg.top_p, clock=ctx.clock)
    s, r = ep.scored, ep.scored.rollout
    rows = {k: x for v in active_variants(cfg) if v.rows is not None   # name -> (N_r, Tc):
            for k, x in v.rows(policy, cfg, r, ctx).items()}          # the reference's, ...
    g = gather_rows(ctx.group, list(mine), Gathered(s.rewards, s.parts, r.policy_mask.sum(1),
                                                    r.stopped, None), G)
    prompt_index = torch.arange(B).repeat_interleave(G)                    # (N,)
    prompts, tasks = [e.prompt for e in examples], [e.task for e in examples]
    with user_code(f"grouper {cfg.grouping!r}"):
        cluster_ids = torch.as_tensor(ctx.grouper(prompts, tasks, g.rewards, prompt_index,
                                                  step, examples=examples))   # (B,)
    with user_code(f"advantage estimator {cfg.advantage!r}"):
        adv_all = grouped_advantages(cluster_ids, prompt_index, g.rewards, cfg.group.combine,
                                     cfg.advantage, g.lengths)            # (N,) per episode
    own = torch.tensor([p * G + j for p in mine for j in range(G)], dtype=torch.long)
    adv = get_credit(env.settings.credit).fn(adv_all[own], ep.turns, r.prompt_index,
                                             r.completion_ids.shape[1], env.settings)
    loss_reads = {k: rows[k] for v in active_variants(cfg) for k in v.loss_rows if k in rows}
    return Batch(s, adv, loss_reads, B * G, int(g.lengths.sum()), cluster_ids,
                 episode_metrics(ep, g, adv_all, prompt_index, G))


@torch.no_grad()
def evaluate_episodes(policy, eval_sets: dict, weights=None, max_new=None,
                      samples: list | None = None, batch: int = 256) -> dict:
    """Greedy episodes on each held-out set -> eval/accuracy (the share of episodes the
    environment ended with a positive return: success), eval/reward (the mean return),
    eval/turns (mean policy turns), eval/turns_success (over the successes); ``samples`` gets the first episodes' texts
    (observations in brackets). ``weights`` and ``max_new`` are the single-turn evaluation's
    arguments, unused: the environment rewards and limits."""
    acc, rew, turns, info = [], [], [], []
    for task, examples in eval_sets.items():
        env = get_environment(task)
        for i in range(0, len(examples), batch):
            ep = sample_episodes(policy, examples[i:i + batch], env, 1, greedy=True)
            ok = [float(e == "done" and float(r) > 0) for e, r in zip(ep.end, ep.scored.rewards)]
            if samples is not None and i == 0:
                samples += [{"task": task, "prompt": ex.prompt, "completion": text,
                             "answer": ex.answer, "reward": round(float(rw), 4),
                             "accuracy": a, "stopped": e == "done"}
                            for ex, text, rw, a, e in zip(examples[:4], ep.scored.texts,
                                                          ep.scored.rewards, ok, ep.end)]
            acc += ok
            rew += ep.scored.rewards.tolist()
            turns += [len(t) for t in ep.turns]
            info += ep.info
    n, won = max(len(acc), 1), [t for t, a in zip(turns, acc) if a]
    return {"eval/accuracy": sum(acc) / n, "eval/reward": sum(rew) / n,
            "eval/turns": sum(turns) / n,
            **({"eval/turns_success": sum(won) / len(won)} if won else {}),
            **{f"eval/tool/{k}": v for k, v in tool_metrics(info).items()}}


REFUSED = (
    (lambda c: c.policy not in ("toy", "hf"), "policy={0.policy!r}: the multi-turn rollout "
                                              "runs the toy and HF policies"),
    (lambda c: c.rollout != "grpo_lab", "rollout={0.rollout!r} samples one turn at a time; "
                                        "multi-turn episodes need rollout='grpo_lab'"),
    (lambda c: c.dynamic.sampling, "dynamic.sampling (the CLI's default preset tiny_cpu sets "
                                   "it; --dynamic.sampling false, or --preset agent_cpu): it "
                                   "redraws prompts by single-turn rewards"),
    (lambda c: c.overlong.rule != "none", "overlong.rule={0.overlong.rule!r} reads whole "
                                          "completions; an episode's limits are its "
                                          "environment's AgentSettings"),
    (lambda c: bool(c.kl.beta) and c.kl.placement == "reward", "kl.placement='reward' sums the KL "
                                                               "over every completion token, "
                                                               "observations included"),
    (lambda c: c.supervision != "outcome", "supervision={0.supervision!r}: rewards come from "
                                           "the environment (credit: AgentSettings.credit)"),
    (lambda c: c.answer_format != "raw", "answer_format={0.answer_format!r}: an environment's "
                                         "task writes its own prompts (answer_format renders "
                                         "single-turn ones); answer_format='raw'"),
    (lambda c: c.loss.aggregation == "dr_grpo", "loss.aggregation='dr_grpo' divides by the "
                                                "single-turn completion limit"),
)


def check(cfg) -> None:
    """Objective "agent": its task is one registered environment; the refused settings."""
    if cfg.task not in ENVIRONMENTS:
        raise ValueError(f"objective='agent' trains on an environment: task={cfg.task!r} is "
                         f"not one (environments: {sorted(ENVIRONMENTS)})")
    for bad, why in REFUSED:
        if bad(cfg):
            raise ValueError(f"objective='agent' with {why.format(cfg)}")


register_objective("agent", collect_episodes, grpo_objective, check=check,
                   evaluate=evaluate_episodes,
                   description="multi-turn GRPO: episodes with an environment, the "
                               "observation tokens masked (agents/)")
