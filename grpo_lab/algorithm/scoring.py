"""Completions sampled and scored: the one path from prompts to rewards (training, evaluation,
widgets, benches): ``sample_and_score`` = rollout.sample -> decode -> rewards.weighted_reward,
held in a ``Scored`` (a shape per field); ``take_scored`` and ``cat_scored`` keep and join rows.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import torch

from grpo_lab.algorithm.rollout import Rollout, cat_rollouts, sample, take_rows
from grpo_lab.tasks.rewards import weighted_reward


class Scored(NamedTuple):
    """Completions sampled and scored: B prompts, N = B*G rows (row i from prompt
    ``rollout.prompt_index[i]``)."""
    examples: list                # (B,) Example
    rollout: Rollout              # N rows
    rewards: torch.Tensor         # (N,) weighted reward
    parts: dict                   # reward function name -> (N,)
    texts: list                   # (N,) decoded completions


@torch.no_grad()
def sample_and_score(policy, examples, G: int, max_new: int, weights: dict,
                     temperature: float = 1.0, top_k: int | None = None, greedy: bool = False,
                     generator=None, clock: dict | None = None, **sampler) -> Scored:
    """sample -> decode -> score: the one path from prompts to rewards (training, evaluation,
    widgets, benches). ``sampler``: more ``rollout.sample`` options (draw, drop_finished).
    ``clock``: add the seconds spent to "time/sample_s" (all of rollout.sample, which also adds
    its own parts: time/prefill_s, time/decode_*) and "time/score_s" (decoding the tokens and
    the reward functions)."""
    t0 = now()
    r = sample(policy, [policy.encode(e.prompt) for e in examples], G, max_new, temperature,
               top_k, greedy=greedy, generator=generator, clock=clock, **sampler)
    t1 = now()
    texts = [policy.decode(c) for c in r.completion_ids.tolist()]
    rows = [examples[i] for i in r.prompt_index.tolist()]                  # (N,)
    rewards, parts = weighted_reward(texts, rows, weights, r.stopped.tolist())
    if clock is not None:
        add_time(clock, "time/sample_s", t1 - t0)
        add_time(clock, "time/score_s", now() - t1)
    return Scored(list(examples), r, rewards, parts, texts)


def now() -> float:
    """``time.perf_counter()`` after the GPU (if one is in use) has finished its queued work,
    so a phase's time is its own and not the launch time of its kernels."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def add_time(clock: dict, key: str, seconds: float) -> None:
    clock[key] = clock.get(key, 0.0) + seconds


def take_scored(s: Scored, rows: torch.Tensor) -> Scored:
    """Keep the rows (N,) bool; kept prompts renumbered 0..B'-1 in order."""
    sub, kept = take_rows(s.rollout, rows)
    return Scored([s.examples[i] for i in kept.tolist()], sub, s.rewards[rows],
                  {k: v[rows] for k, v in s.parts.items()},
                  [s.texts[i] for i in rows.nonzero().flatten().tolist()])


def cat_scored(ss: list[Scored]) -> Scored:
    r = cat_rollouts([s.rollout for s in ss], [len(s.examples) for s in ss])
    return Scored([e for s in ss for e in s.examples], r, torch.cat([s.rewards for s in ss]),
                  {k: torch.cat([s.parts[k] for s in ss]) for k in ss[0].parts},
                  [t for s in ss for t in s.texts])
