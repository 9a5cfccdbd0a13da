"""The GRPO training loop: one plain ``for`` loop (DeepSeekMath, Algorithm 1).

    for step:
        draw B prompts; sample G completions each with the old policy   (rollout.py)
        score them with the task's reward functions                     (tasks.py)
        group ids (by prompt) -> group-relative advantages              (advantages.py)
        mu times: clipped surrogate + beta * k3 KL, backward, clip, step (loss.py)
        log one metrics dict; evaluate and checkpoint now and then

Deviations from the paper's Algorithm 1, on purpose:
  * The reference policy is the base checkpoint for the whole run (no reference reset).
  * Old log-probs come from the sampler (``Rollout.logprobs``), which equals a forward
    pass of the old policy (tested), so no extra forward is spent on them.
Exact resume: every random draw of step s comes from seeds derived from (seed, s), and
the checkpoint holds the policy, the optimizer state and the metrics so far, so a run
resumed from step s computes the same numbers as one that never stopped.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from grpo_lab.advantages import ADVANTAGES, process_advantages
from grpo_lab.checkpoint import CheckpointError, atomic_save_tensors, read_tensors
from grpo_lab.config import TrainConfig, to_dict
from grpo_lab.loss import grpo_loss
from grpo_lab.model import GPT, load_policy
from grpo_lab.rollout import completion_logprobs, sample
from grpo_lab.tasks import (accuracy_reward, decode, encode, get_task, load_eval,
                            sample_examples, step_rewards, weighted_reward)

CKPT_TAG = "grpo_lab.train_checkpoint.v1"


def max_new_tokens(cfg: TrainConfig) -> int:
    return cfg.max_new_tokens or get_task(cfg.task).max_answer_len + 2


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


def prompt_source(cfg: TrainConfig, held_out: set[str]):
    """-> draw(rng, n): n training examples, never from the held-out set."""
    if not cfg.train_pool:
        return lambda rng, n: sample_examples([cfg.task], n, rng, held_out)
    pool = sample_examples([cfg.task], cfg.train_pool, random.Random(f"{cfg.seed}-pool"),
                           held_out)
    return lambda rng, n: [rng.choice(pool) for _ in range(n)]


def grpo_step(policy, ref, opt, cfg: TrainConfig, step: int, draw) -> dict:
    """One GRPO step (rollout, rewards, advantages, mu updates) -> metrics dict."""
    rng = random.Random(f"{cfg.seed}-prompts-{step}")
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    t0 = time.perf_counter()
    examples = draw(rng, cfg.prompts_per_step)
    r = sample(policy, [encode(e.prompt) for e in examples], cfg.group_size,
               max_new_tokens(cfg), cfg.temperature, cfg.top_k or None, generator=gen)
    t_rollout = time.perf_counter() - t0
    row_examples = [examples[i] for i in r.prompt_index.tolist()]           # N = B*G
    texts = [decode(c) for c in r.completion_ids.tolist()]
    rewards, parts = weighted_reward(texts, row_examples, cfg.reward_weights, r.stopped.tolist())
    group_ids = r.prompt_index                                             # (N,) by prompt
    if cfg.supervision == "process":
        steps = step_rewards(texts, row_examples, r.stopped.tolist())
        sr = torch.zeros(r.completion_mask.shape)                          # (N, Tc)
        for i, row in enumerate(steps):
            sr[i, :len(row)] = torch.tensor(row)
        adv = process_advantages(sr, r.completion_mask, group_ids)         # (N, Tc)
    else:
        adv = ADVANTAGES[cfg.advantage](rewards, group_ids)                # (N,)
    for g in opt.param_groups:
        g["lr"] = cfg.lr * min(1.0, (step + 1) / (cfg.warmup_steps + 1))
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
    zero_std = (rewards.view(-1, cfg.group_size).std(1) == 0).float().mean()
    m = r.completion_mask.float()
    metrics = {
        "step": step,
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        **{f"reward/{k}": float(v.mean()) for k, v in parts.items()},
        "group/zero_std_frac": float(zero_std),
        "adv/abs_mean": float(adv.abs().mean()),
        **stats,
        "policy/entropy": float((entropy.detach() * m).sum() / m.sum()),
        "completion/mean_len": float(m.sum(1).mean()),
        "completion/stopped_frac": float(r.stopped.float().mean()),
        "grad/norm": float(gnorm),
        "time/rollout_s": t_rollout,
        "time/step_s": time.perf_counter() - t0,
    }
    return metrics


def save_checkpoint(path, policy, opt, cfg: TrainConfig, step: int, history: list[dict]):
    """Policy + optimizer state + metrics so far, one safetensors file, written atomically."""
    tensors = {f"policy.{k}": v for k, v in policy.state_dict().items() if k != "lm_head.weight"}
    osd = opt.state_dict()
    for pid, st in osd["state"].items():
        for k, v in st.items():
            tensors[f"optim.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    meta = {"format": CKPT_TAG, "step": str(step), "config": json.dumps(to_dict(cfg)),
            "model_config": json.dumps(vars(policy.cfg)),
            "param_groups": json.dumps(osd["param_groups"]), "history": json.dumps(history)}
    atomic_save_tensors(tensors, path, meta)


def load_checkpoint(path, policy, opt) -> tuple[int, list[dict], dict]:
    """Restore policy and optimizer from ``path`` -> (step, history, saved config dict)."""
    tensors, meta = read_tensors(path)
    if meta.get("format") != CKPT_TAG:
        raise CheckpointError(f"{path} is not a grpo_lab training checkpoint "
                              f"(format tag {meta.get('format')!r}, expected {CKPT_TAG!r})")
    if json.loads(meta["model_config"]) != vars(policy.cfg):
        raise CheckpointError(f"{path} holds a policy of another shape: "
                              f"{meta['model_config']} vs {vars(policy.cfg)}")
    policy.load_state_dict({k[7:]: v for k, v in tensors.items() if k.startswith("policy.")},
                           strict=False)
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("optim."):
            _, pid, name = k.split(".", 2)
            state.setdefault(int(pid), {})[name] = v
    opt.load_state_dict({"state": state, "param_groups": json.loads(meta["param_groups"])})
    return int(meta["step"]), json.loads(meta["history"]), json.loads(meta["config"])


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
    eval_set = load_eval(cfg.task)[:cfg.eval_size]
    draw = prompt_source(cfg, {e.prompt for e in load_eval(cfg.task)})
    evaluate_now = lambda: evaluate(policy, eval_set, cfg.reward_weights, max_new_tokens(cfg))
    start, history = 0, []
    if resume:
        saved_step, history, saved_cfg = load_checkpoint(ckpt, policy, opt)
        start = saved_step + 1
        if saved_cfg.get("seed") != cfg.seed or saved_cfg.get("task") != cfg.task:
            raise ValueError(f"cannot resume {ckpt}: it was run with seed={saved_cfg.get('seed')} "
                             f"task={saved_cfg.get('task')!r}, not seed={cfg.seed} task={cfg.task!r}")
    else:
        history.append({"step": -1, **evaluate_now(), "time/elapsed_s": 0.0})
    log_path.write_text("".join(json.dumps(h) + "\n" for h in history))
    elapsed0 = history[-1].get("time/elapsed_s", 0.0) if history else 0.0
    t0 = time.perf_counter()
    last = start - 1
    bar = tqdm(range(start, cfg.steps), desc="grpo", disable=not progress,
               initial=start, total=cfg.steps)
    for step in bar:
        metrics = grpo_step(policy, ref, opt, cfg, step, draw)
        last_step = step == cfg.steps - 1
        out_of_time = cfg.time_budget_s and elapsed0 + time.perf_counter() - t0 >= cfg.time_budget_s
        if (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or last_step or out_of_time:
            metrics.update(evaluate_now())
        metrics["time/elapsed_s"] = elapsed0 + time.perf_counter() - t0
        history.append(metrics)
        with open(log_path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if (step + 1) % cfg.ckpt_every == 0 or last_step or out_of_time:
            save_checkpoint(ckpt, policy, opt, cfg, step, history)
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}",
                        acc=f"{[h for h in history if 'eval/accuracy' in h][-1]['eval/accuracy']:.2f}")
        if on_step is not None:
            on_step(metrics)
        last = step
        if out_of_time:
            break
    if last < start:  # nothing left to run: make sure a checkpoint exists
        save_checkpoint(ckpt, policy, opt, cfg, last, history)
    return history


def load_policy_any(path) -> GPT:
    """A policy from a policy file (``save_policy``) or from a training checkpoint."""
    tensors, meta = read_tensors(path)
    if meta.get("format") != CKPT_TAG:
        return load_policy(path)
    from grpo_lab.model import GPTConfig

    policy = GPT(GPTConfig(**json.loads(meta["model_config"])))
    policy.load_state_dict({k[7:]: v for k, v in tensors.items() if k.startswith("policy.")},
                           strict=False)
    return policy
