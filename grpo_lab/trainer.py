"""The GRPO training loop: one plain ``for`` loop (DeepSeekMath, Algorithm 1).

    for step:
        draw B prompts; sample G completions each with the old policy   (rollout.py)
        score them with the task's reward functions                     (tasks.py)
        [dynamic sampling: drop prompts whose G rewards are all equal, refill (DAPO)]
        group ids (by prompt, or a grouping strategy) -> advantages     (grouping.py)
        mu times: clipped surrogate + beta * k3 KL, backward, clip, step (loss.py)
        log one metrics dict; evaluate and checkpoint now and then

Deviations from the paper's Algorithm 1, on purpose:
  * The reference policy is the base checkpoint for the whole run (no reference reset).
  * Old log-probs come from the sampler (``Rollout.logprobs``), which equals a forward
    pass of the old policy (tested), so no extra forward is spent on them.
  * The group is a choice (``cfg.grouping``, grouping.py); "by_prompt" is the paper's.
  * Dynamic sampling (DAPO, Yu et al. 2025, sec. 3.2) is bounded: after
    ``dynamic_max_draws`` rollouts a short batch is topped up with uninformative prompts,
    so every step trains on prompts_per_step prompts.
Exact resume: every random draw of step s comes from seeds derived from (seed, s), and
the checkpoint holds the policy, the optimizer state, the grouper's re-clustering state
and the metrics so far, so a run resumed from step s computes the same numbers as one
that never stopped.
"""
from __future__ import annotations

import json
import math
import random
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from grpo_lab.advantages import process_advantages
from grpo_lab.checkpoint import CheckpointError, atomic_save_tensors, read_tensors
from grpo_lab.config import TrainConfig, to_dict
from grpo_lab.grouping import (EMBEDS, advantage_diagnostics, advantage_split,
                               cluster_diagnostics, fill_informative_groups, grouped_advantages,
                               informative_rows, reward_group_diagnostics)
from grpo_lab.loss import grpo_loss
from grpo_lab.model import GPT, load_policy, policy_from_tensors
from grpo_lab.reclustering import StepGrouper
from grpo_lab.rollout import Rollout, cat_rollouts, completion_logprobs, sample, take_rows
from grpo_lab.tasks import (accuracy_reward, decode, encode, get_task, load_eval,
                            sample_examples, step_rewards, weighted_reward)

CKPT_TAG = "grpo_lab.train_checkpoint.v1"


def max_new_tokens(cfg: TrainConfig) -> int:
    return cfg.max_new_tokens or max(get_task(t).max_answer_len for t in cfg.task_names) + 2


@torch.no_grad()
def evaluate(model: GPT, examples, weights: dict, max_new: int, batch: int = 256) -> dict:
    """Greedy decoding on ``examples`` -> {"eval/accuracy", "eval/reward"}."""
    acc, rew = [], []
    for i in range(0, len(examples), batch):
        exs = examples[i:i + batch]
        r = sample(model, [encode(e.prompt) for e in exs], 1, max_new, greedy=True)
        texts = [decode(c) for c in r.completion_ids.tolist()]
        total, _ = weighted_reward(texts, exs, weights, r.stopped.tolist())
        acc += accuracy_reward(texts, exs, r.stopped.tolist())
        rew += total.tolist()
    return {"eval/accuracy": sum(acc) / len(acc), "eval/reward": sum(rew) / len(rew)}


def evaluate_tasks(model: GPT, eval_sets: dict, weights: dict, max_new: int) -> dict:
    """``evaluate`` on each task's held-out set -> eval/accuracy and eval/reward over their
    union, plus eval/accuracy/<task> when there are several tasks."""
    if len(eval_sets) == 1:
        return evaluate(model, next(iter(eval_sets.values())), weights, max_new)
    per = {t: evaluate(model, exs, weights, max_new) for t, exs in eval_sets.items()}
    n = {t: len(exs) for t, exs in eval_sets.items()}
    union = {k: sum(per[t][k] * n[t] for t in per) / sum(n.values())
             for k in ("eval/accuracy", "eval/reward")}
    return {**union, **{f"eval/accuracy/{t}": m["eval/accuracy"] for t, m in per.items()}}


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then constant or cosine decay to 10% at ``cfg.steps``."""
    lr = cfg.lr * min(1.0, (step + 1) / (cfg.warmup_steps + 1))
    if cfg.lr_schedule == "cosine":
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step / cfg.steps, 1.0)))
    return lr


def prompt_source(cfg: TrainConfig, held_out: set[str]):
    """-> draw(rng, n): n training examples, never from the held-out set."""
    if not cfg.train_pool:
        return lambda rng, n: sample_examples(cfg.task_names, n, rng, held_out)
    pool = sample_examples(cfg.task_names, cfg.train_pool, random.Random(f"{cfg.seed}-pool"),
                           held_out)
    return lambda rng, n: [rng.choice(pool) for _ in range(n)]


def make_grouper(cfg: TrainConfig) -> StepGrouper:
    """The run's grouper; the embedding groupers fit TF-IDF once on 512 seeded prompts."""
    corpus = None
    if cfg.grouping in EMBEDS:
        corpus = [e.prompt for e in sample_examples(cfg.task_names, 512,
                                                    random.Random(f"{cfg.seed}-embed"))]
    return StepGrouper(cfg.grouping, cfg.n_groups, cfg.seed, corpus, cfg.recluster_every,
                       cfg.group_schedule)


class Scored(NamedTuple):
    """One step's batch, sampled and scored: B prompts, N = B*G rows (row i from prompt
    ``rollout.prompt_index[i]``)."""
    examples: list                # (B,) Example
    rollout: Rollout              # N rows
    rewards: torch.Tensor         # (N,) weighted reward
    parts: dict                   # reward function name -> (N,)
    texts: list                   # (N,) decoded completions


def rollout_batch(policy, cfg: TrainConfig, step: int, draw) -> tuple[Scored, dict]:
    """Draw B prompts, sample G completions each, score them -> (Scored, metrics).

    With ``cfg.dynamic_sampling``: DAPO's filter, bounded. Draw until B prompts with
    reward variance are kept (``grouping.fill_informative_groups``) or
    ``dynamic_max_draws`` rollouts are spent; a shortfall is topped up with the first
    draw's uninformative prompts, so the batch always holds B prompts.
    """
    rng = random.Random(f"{cfg.seed}-prompts-{step}")
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    drawn: list[Scored] = []

    def one_draw():
        examples = draw(rng, cfg.prompts_per_step)
        r = sample(policy, [encode(e.prompt) for e in examples], cfg.group_size,
                   max_new_tokens(cfg), cfg.temperature, cfg.top_k or None, generator=gen)
        row_examples = [examples[i] for i in r.prompt_index.tolist()]      # N = B*G
        texts = [decode(c) for c in r.completion_ids.tolist()]
        rewards, parts = weighted_reward(texts, row_examples, cfg.reward_weights,
                                         r.stopped.tolist())
        drawn.append(Scored(examples, r, rewards, parts, texts))
        return rewards, r.prompt_index, len(drawn) - 1                    # payload: draw index

    if not cfg.dynamic_sampling:
        one_draw()
        return drawn[0], {}
    with warnings.catch_warnings():               # a shortfall is expected: topped up below
        warnings.simplefilter("ignore", RuntimeWarning)
        kept = dict(fill_informative_groups(one_draw, cfg.prompts_per_step,
                                            cfg.dynamic_max_draws, strict=False))
    G = cfg.group_size                                                    # kept: draw -> (N,) mask
    short = cfg.prompts_per_step - sum(int(m.sum()) // G for m in kept.values())
    if short:
        first = drawn[0]
        dull = (~informative_rows(first.rewards, first.rollout.prompt_index)).nonzero()
        rows = kept.get(0, torch.zeros_like(first.rewards, dtype=torch.bool))
        kept[0] = rows.index_fill(0, dull.flatten()[:short * G], True)
    informative = sum(int(informative_rows(d.rewards, d.rollout.prompt_index).sum())
                      for d in drawn) // G
    metrics = {"sample/draws": len(drawn),
               "sample/informative_frac": informative / (len(drawn) * cfg.prompts_per_step)}
    return _cat_scored([_take_rows(drawn[i], kept[i]) for i in sorted(kept)]), metrics


def _take_rows(d: Scored, rows: torch.Tensor) -> Scored:
    """Keep the rows (N,) bool of one batch; kept prompts renumbered 0..B'-1 in order."""
    sub, kept_prompts = take_rows(d.rollout, rows)
    return Scored([d.examples[i] for i in kept_prompts.tolist()], sub, d.rewards[rows],
                  {k: v[rows] for k, v in d.parts.items()},
                  [d.texts[i] for i in rows.nonzero().flatten().tolist()])


def _cat_scored(ds: list[Scored]) -> Scored:
    """Stack batches (``rollout.cat_rollouts``), their prompts, rewards and texts."""
    r = cat_rollouts([d.rollout for d in ds], [len(d.examples) for d in ds])
    return Scored([e for d in ds for e in d.examples], r, torch.cat([d.rewards for d in ds]),
                  {k: torch.cat([d.parts[k] for d in ds]) for k in ds[0].parts},
                  [t for d in ds for t in d.texts])


def grpo_step(policy, ref, opt, cfg: TrainConfig, step: int, draw,
              grouper: StepGrouper | None = None) -> dict:
    """One GRPO step (rollout, rewards, groups, advantages, mu updates) -> metrics dict.

    ``grouper`` (``make_grouper(cfg)``) maps the step's prompts to group ids; None = by prompt.
    """
    t0 = time.perf_counter()
    batch, sample_metrics = rollout_batch(policy, cfg, step, draw)
    examples, r, rewards, parts, texts = batch
    t_rollout = time.perf_counter() - t0
    row_examples = [examples[i] for i in r.prompt_index.tolist()]           # N = B*G
    prompts, tasks = [e.prompt for e in examples], [e.task for e in examples]
    grouper = grouper or StepGrouper("by_prompt")
    cluster_ids = grouper(prompts, tasks, rewards, r.prompt_index, step)    # (B,)
    group_ids = torch.as_tensor(cluster_ids)[r.prompt_index]               # (N,)
    if cfg.supervision == "process":
        steps = step_rewards(texts, row_examples, r.stopped.tolist())
        sr = torch.zeros(r.completion_mask.shape)                          # (N, Tc)
        for i, row in enumerate(steps):
            sr[i, :len(row)] = torch.tensor(row)
        adv = process_advantages(sr, r.completion_mask, group_ids)         # (N, Tc)
    else:
        adv = grouped_advantages(cluster_ids, r.prompt_index, rewards,
                                 cfg.combine, cfg.advantage)               # (N,)
    for g in opt.param_groups:
        g["lr"] = learning_rate(cfg, step)
    ref_logp = None
    if cfg.beta:
        with torch.no_grad():
            ref_logp = completion_logprobs(ref, r, cfg.temperature)        # (N, Tc)
    policy.train()
    for _ in range(cfg.mu):
        logp, entropy = completion_logprobs(policy, r, cfg.temperature, return_entropy=True)
        loss, stats = grpo_loss(logp, r.logprobs, ref_logp, adv, r.completion_mask,
                                cfg.eps_low, cfg.eps_high, cfg.beta, cfg.aggregation,
                                max_new_tokens(cfg))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(
            policy.parameters(), cfg.grad_clip if cfg.grad_clip else float("inf"))
        if not torch.isfinite(gnorm):
            raise FloatingPointError(f"step {step}: gradient norm is {float(gnorm)}; "
                                     f"lower lr={cfg.lr} or check the rewards")
        opt.step()
    m = r.completion_mask.float()
    # one prompt per group (by prompt): pure, the rest undefined; skip the ~15 ms of TF-IDF
    quality = ({"group/purity": 1.0} if len(set(cluster_ids.tolist())) == len(prompts)
               else cluster_diagnostics(prompts, cluster_ids, tasks))      # NaN if undefined
    metrics = {
        "step": step,
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        **{f"reward/{k}": float(v.mean()) for k, v in parts.items()},
        **reward_group_diagnostics(rewards, group_ids),
        **{k: v for k, v in quality.items() if not math.isnan(v)},
        "adv/abs_mean": float(adv.abs().mean()),
        **advantage_diagnostics(adv if adv.dim() == 1 else adv[r.completion_mask]),
        **(advantage_split(adv, r.prompt_index) if adv.dim() == 1 else {}),
        **sample_metrics,
        **stats,
        "policy/entropy": float((entropy.detach() * m).sum() / m.sum()),
        "completion/mean_len": float(m.sum(1).mean()),
        "completion/stopped_frac": float(r.stopped.float().mean()),
        "grad/norm": float(gnorm),
        "time/rollout_s": t_rollout,
        "time/step_s": time.perf_counter() - t0,
    }
    return metrics


def save_checkpoint(path, policy, opt, cfg: TrainConfig, step: int, history: list[dict],
                    grouper: StepGrouper | None = None):
    """Policy + optimizer state + metrics so far (+ the grouper's re-clustering state),
    one safetensors file, written atomically."""
    tensors = {f"policy.{k}": v for k, v in policy.state_dict().items() if k != "lm_head.weight"}
    if grouper is not None:
        tensors.update({f"grouping.{k}": v for k, v in grouper.state_dict().items()})
    osd = opt.state_dict()
    for pid, st in osd["state"].items():
        for k, v in st.items():
            tensors[f"optim.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    meta = {"format": CKPT_TAG, "step": str(step), "config": json.dumps(to_dict(cfg)),
            "model_config": json.dumps(vars(policy.cfg)),
            "param_groups": json.dumps(osd["param_groups"]), "history": json.dumps(history)}
    atomic_save_tensors(tensors, path, meta)


def load_checkpoint(path, policy, opt, cfg: TrainConfig | None = None,
                    grouper: StepGrouper | None = None) -> tuple[int, list[dict], dict]:
    """Restore policy, optimizer (and grouper) from ``path`` -> (step, history, saved config).

    With ``cfg``, first check that the checkpoint's run had the same seed, task and grouping.
    """
    tensors, meta = read_tensors(path)
    if meta.get("format") != CKPT_TAG:
        raise CheckpointError(f"{path} is not a grpo_lab training checkpoint "
                              f"(format tag {meta.get('format')!r}, expected {CKPT_TAG!r})")
    saved_cfg = json.loads(meta["config"])
    if cfg is not None:
        saved = {k: saved_cfg.get(k, "by_prompt" if k == "grouping" else None)
                 for k in ("seed", "task", "grouping")}
        if saved != {"seed": cfg.seed, "task": cfg.task, "grouping": cfg.grouping}:
            raise ValueError(f"cannot resume {path}: it was run with {saved}, not "
                             f"seed={cfg.seed} task={cfg.task!r} grouping={cfg.grouping!r}")
    if json.loads(meta["model_config"]) != vars(policy.cfg):
        raise CheckpointError(f"{path} holds a policy of another shape: "
                              f"{meta['model_config']} vs {vars(policy.cfg)}")
    policy.load_state_dict(_policy_tensors(tensors), strict=False)
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("optim."):
            _, pid, name = k.split(".", 2)
            state.setdefault(int(pid), {})[name] = v
    opt.load_state_dict({"state": state, "param_groups": json.loads(meta["param_groups"])})
    if grouper is not None:
        grouper.load_state_dict({k[9:]: v for k, v in tensors.items() if k.startswith("grouping.")})
    return int(meta["step"]), json.loads(meta["history"]), saved_cfg


def train(cfg: TrainConfig, resume: bool = False, progress: bool = True,
          on_step=None) -> list[dict]:
    """Run GRPO as ``cfg`` says -> history (one metrics dict per step, eval rows merged).

    Writes ``out_dir/metrics.jsonl`` and ``out_dir/checkpoint.safetensors``. With
    ``resume``, continues from that checkpoint exactly. ``on_step(metrics)`` is the one
    hook point (notebooks use it for live plots).
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt, log_path = out / "checkpoint.safetensors", out / "metrics.jsonl"
    policy = load_policy(cfg.base_checkpoint)
    ref = load_policy(cfg.base_checkpoint).eval().requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    eval_sets = {t: load_eval(t)[:cfg.eval_size] for t in cfg.task_names}
    draw = prompt_source(cfg, {e.prompt for t in cfg.task_names for e in load_eval(t)})
    grouper = make_grouper(cfg)
    evaluate_now = lambda: evaluate_tasks(policy, eval_sets, cfg.reward_weights,
                                          max_new_tokens(cfg))
    start, history = 0, []
    if resume:
        saved_step, history, _ = load_checkpoint(ckpt, policy, opt, cfg, grouper)
        start = saved_step + 1
    else:
        history.append({"step": -1, **evaluate_now(), "time/elapsed_s": 0.0})
    log_path.write_text("".join(json.dumps(h) + "\n" for h in history))
    elapsed0 = history[-1].get("time/elapsed_s", 0.0) if history else 0.0
    t0 = time.perf_counter()
    last = start - 1
    bar = tqdm(range(start, cfg.steps), desc="grpo", disable=not progress,
               initial=start, total=cfg.steps)
    for step in bar:
        metrics = grpo_step(policy, ref, opt, cfg, step, draw, grouper)
        last_step = step == cfg.steps - 1
        out_of_time = cfg.time_budget_s and elapsed0 + time.perf_counter() - t0 >= cfg.time_budget_s
        if (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or last_step or out_of_time:
            metrics.update(evaluate_now())
        metrics["time/elapsed_s"] = elapsed0 + time.perf_counter() - t0
        history.append(metrics)
        with open(log_path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if (step + 1) % cfg.ckpt_every == 0 or last_step or out_of_time:
            save_checkpoint(ckpt, policy, opt, cfg, step, history, grouper)
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}",
                        acc=f"{[h for h in history if 'eval/accuracy' in h][-1]['eval/accuracy']:.2f}")
        if on_step is not None:
            on_step(metrics)
        last = step
        if out_of_time:
            break
    if last < start:  # nothing left to run: make sure a checkpoint exists
        save_checkpoint(ckpt, policy, opt, cfg, last, history, grouper)
    return history


def load_policy_any(path) -> GPT:
    """A policy from a policy file (``save_policy``) or from a training checkpoint."""
    tensors, meta = read_tensors(path)
    if meta.get("format") != CKPT_TAG:
        return policy_from_tensors(tensors, meta, path)
    from grpo_lab.model import GPTConfig

    policy = GPT(GPTConfig(**json.loads(meta["model_config"])))
    policy.load_state_dict(_policy_tensors(tensors), strict=False)
    return policy


def _policy_tensors(tensors: dict) -> dict:
    """The policy's weights inside a training checkpoint (keys saved as ``policy.<name>``)."""
    return {k[len("policy."):]: v for k, v in tensors.items() if k.startswith("policy.")}
