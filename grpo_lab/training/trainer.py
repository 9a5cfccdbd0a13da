"""The training loop: one plain ``for`` loop, on one process or N (DeepSeekMath, Algorithm 1).

    for step:
        with exchange.gathered():                      (fsdp2: the weights whole, once)
            batch = collect(policy, cfg, step, ctx)    prompts -> rollouts -> rewards ->
                                                       group ids -> advantages (step.py, no grad)
        mu times: loss = objective(policy, batch)       clipped surrogate + beta * k3 KL
                  backward                             (per micro-batch: they accumulate)
                  exchange.reduce()                    ranks agree on the mean gradient
                  exchange.step()                      clip, AdamW (exchanges.py)
        log one metrics dict; evaluate and checkpoint now and then (rank 0)

The same function runs on one CPU process and under ``torchrun`` (``grpo-lab train --nproc N``):
``Group.current()`` is a group of one without a process group, and every collective is then
the identity. The global batch does not depend on N (step.py), so neither do the results.
Ranks sample, run the reference and evaluate (rank 0 only) for different numbers of forwards;
an exchange that gathers weights inside a forward (fsdp2) gathers them once around those
instead (``Exchange.gathered``; every other exchange's is a no-op).

Deviations from the paper's Algorithm 1, on purpose:
  * The reference policy is the base checkpoint for the whole run (no reference reset).
  * Old log-probs come from the sampler (``Rollout.logprobs``), which equals a forward
    pass of the old policy (tested), so no extra forward is spent on them.
  * The group is a choice (``cfg.grouping``, grouping.py); "by_prompt" is the paper's.
  * Dynamic sampling (DAPO, Yu et al. 2025, sec. 3.2) is bounded: after
    ``dynamic.max_draws`` rollouts a short batch is topped up with uninformative prompts,
    so every step trains on prompts_per_step prompts.
Exact resume: every random draw of step s comes from seeds derived from (seed, s), and the
checkpoint holds the policy, the optimizer state (whole, gathered from the owners when it is
sharded), the grouper's re-clustering state and the metrics so far, so a run resumed from
step s, on the same or another number of processes, computes the same numbers as one that
never stopped. Compressed exchanges also keep per-rank residuals that are not saved: their
resume is approximate, and says so.
"""
from __future__ import annotations

import json
import math
import random
import signal
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from grpo_lab.checkpoint import (check_optimizer_state, load_state_strict,
                                 read_training_checkpoint, save_training_checkpoint)
from grpo_lab import __version__
from grpo_lab.training.config import CONFIG_FILE, TrainConfig, check_records, to_dict
from grpo_lab.training.saved_config import config_changes
from grpo_lab.training.config_file import FAST_PATH_KEY, VERSION_KEY
from grpo_lab.training.trackers import Trackers, check_installed
from grpo_lab.distributed import dcp
from grpo_lab.distributed.exchanges import AdamW, make_exchange, param_groups
from grpo_lab.distributed.fsdp import full_parameters
from grpo_lab.distributed.group import Group
from grpo_lab.machine import free_cores, wchar
from grpo_lab.policies.model import GPT
from grpo_lab.policies.policy import frozen, get_policy_kind, load_for
from grpo_lab.algorithm.grouping import StepGrouper, get_grouper
from grpo_lab.agents import step as _agents  # noqa: F401 (objective "agent", environments: a
                                             # spawned rank builds no config)
from grpo_lab.algorithm.rollout import add_time, now, sample_and_score
from grpo_lab.training.async_rollout import AsyncRollout
from grpo_lab.training.step import (Objective, StepContext, backward, get_objective, max_new_tokens,
                                    split_batch)
from grpo_lab import timelimit
from grpo_lab.registry import load_plugins, plugin_changes, plugin_digests
from grpo_lab.algorithm.health import diagnose
from grpo_lab.tasks.instruct import render_all, rendered_source
from grpo_lab.tasks.rewards import accuracy_reward, format_reward, resolve_rewards
from grpo_lab.rundir import (Interrupted, StopSignals, claim, claimed_by_parent,
                             write_lines_atomic)
from grpo_lab.algorithm.samples import FILE as SAMPLES_FILE, append as append_samples, rows as sample_rows
from grpo_lab.algorithm.samples import keep_through as keep_samples_through
from grpo_lab.tasks.task_data import held_out
from grpo_lab.tasks import get_task, sample_examples
from grpo_lab.tokenizer import ALPHABET

# the per-phase timings every step logs (seconds; "time/rollout_s" is the whole collect)
PHASES = ("time/sample_s", "time/score_s", "time/loss_forward_s", "time/backward_s",
          "time/exchange_s", "time/optimizer_s", "time/check_s")

__all__ = ["train", "setup", "held_out_sets", "evaluate", "evaluate_tasks", "learning_rate", "prompt_source",
           "make_grouper", "max_new_tokens"]


@torch.no_grad()
def evaluate(model: GPT, examples, weights: dict, max_new: int, batch: int = 256,
             samples: list | None = None) -> dict:
    """Greedy decoding on ``examples`` -> {"eval/accuracy", "eval/reward"}, and
    "eval/format" (the requested format's rate) for instruct prompts. ``samples``: a list
    the first prompts' completions are appended to (samples.py)."""
    acc, rew, fmt, rewards = [], [], [], resolve_rewards(weights)
    instruct = bool(examples and examples[0].fmt)
    for i in range(0, len(examples), batch):
        s = sample_and_score(model, examples[i:i + batch], 1, max_new, rewards, greedy=True)
        stopped = s.rollout.stopped.tolist()
        a = accuracy_reward(s.texts, s.examples, stopped)
        f = format_reward(s.texts, s.examples, stopped) if instruct else None
        if samples is not None and i == 0:
            samples += sample_rows(s, a, f)
        acc, rew, fmt = acc + a, rew + s.rewards.tolist(), fmt + (f or [])
    return {"eval/accuracy": sum(acc) / len(acc), "eval/reward": sum(rew) / len(rew),
            **({"eval/format": sum(fmt) / len(fmt)} if instruct else {})}


def evaluate_tasks(model: GPT, eval_sets: dict, weights: dict, max_new: int,
                   samples: list | None = None) -> dict:
    """``evaluate`` on each task's held-out set -> eval/accuracy and eval/reward (and
    eval/format) over their union, plus eval/accuracy/<task> when there are several tasks."""
    if len(eval_sets) == 1:
        return evaluate(model, next(iter(eval_sets.values())), weights, max_new,
                        samples=samples)
    per = {t: evaluate(model, exs, weights, max_new, samples=samples)
           for t, exs in eval_sets.items()}
    n = {t: len(exs) for t, exs in eval_sets.items()}
    union = {k: sum(per[t][k] * n[t] for t in per) / sum(n.values())
             for k in ("eval/accuracy", "eval/reward", "eval/format") if k in per[next(iter(per))]}
    return {**union, **{f"eval/accuracy/{t}": m["eval/accuracy"] for t, m in per.items()}}


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then constant or cosine decay to 10% at ``cfg.schedule_steps`` (0:
    ``cfg.steps``)."""
    lr = cfg.lr * min(1.0, (step + 1) / (cfg.warmup_steps + 1))
    if cfg.lr_schedule == "cosine":
        horizon = cfg.schedule_steps or cfg.steps
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step / horizon, 1.0)))
    return lr


def prompt_source(cfg: TrainConfig, held_out: set[str]):
    """-> draw(rng, n): n training examples, never held out (the task records looked up once)."""
    tasks = [get_task(t) for t in cfg.task_names]
    if not cfg.train_pool:
        return lambda rng, n: sample_examples(tasks, n, rng, held_out)
    pool = sample_examples(tasks, cfg.train_pool, random.Random(f"{cfg.seed}-pool"), held_out)
    return lambda rng, n: [rng.choice(pool) for _ in range(n)]


def make_grouper(cfg: TrainConfig) -> StepGrouper:
    """The run's grouper; its embedder is TF-IDF fitted once on 512 seeded prompts, when a
    grouper (or the cluster diagnostics) first reads embeddings."""
    def corpus():
        return [e.prompt for e in sample_examples(list(map(get_task, cfg.task_names)), 512,
                                                  random.Random(f"{cfg.seed}-embed"))]
    g, record = cfg.group, get_grouper(cfg.grouping)
    return StepGrouper(record, g.n_groups(cfg), cfg.seed, corpus, g.recluster_every, g.schedule,
                       getattr(cfg, record.name) if record.settings else None)


def _check_resumable(path, saved: dict, cfg: TrainConfig, allow_override: bool) -> dict:
    """-> the fields that differ from the saved run ({field: [saved, given]}); an error if
    any does without ``allow_override``, and always for what the saved state depends on."""
    keys = ("seed", "task", "grouping", "objective")
    have = {k: saved.get(k, {"grouping": "by_prompt", "objective": "grpo"}.get(k)) for k in keys}
    want = {k: getattr(cfg, k) for k in keys}
    if have != want:
        raise ValueError(f"cannot resume {path}: it was run with {have}, not {want}")
    changes = config_changes(saved, to_dict(cfg))
    if changes and not allow_override:
        listed = "; ".join(f"{k}: saved {a!r}, given {b!r}" for k, (a, b) in changes.items())
        raise ValueError(f"cannot resume {path} with a different config ({listed}); resume "
                         f"with the saved config (grpo-lab train --out_dir DIR --resume), or "
                         f"pass --override (allow_override=True) to change it on purpose: the "
                         f"change is then recorded in metrics.jsonl and the report")
    return changes


def _check_finite(ex, step: int, ckpt: Path, group: Group) -> None:
    """Stop every rank if any holds a non-finite parameter or optimizer state."""
    bad = ex.bad_state()
    if group.agree(bad is not None):
        where = bad or "a tensor of another rank"
        raise FloatingPointError(f"step {step}: {where} is not finite after the optimizer "
                                 f"step; nothing was saved, the last good checkpoint ({ckpt}, "
                                 f"if any) is kept")


def _agree(group: Group, *flags: bool) -> list[bool]:
    """Each flag True if any rank says so, in one collective (identity on one process)."""
    if group.world == 1:
        return [bool(f) for f in flags]
    t = group.sum_(torch.tensor([float(bool(f)) for f in flags], dtype=torch.float64))
    return [bool(x > 0) for x in t.tolist()]


def _reduce_shares(shares: dict, group: Group) -> dict:
    """Sum each rank's share of the step's statistics over ranks (step.py's ``shares``)."""
    keys = sorted(shares)
    t = group.sum_(torch.tensor([shares[k] for k in keys], dtype=torch.float64))
    return dict(zip(keys, t.tolist()))


class Setup(NamedTuple):
    """What a run needs besides its loop; ``setup(cfg)`` builds it the one way the trainer,
    the benches, the widgets and the notebooks share."""
    policy: torch.nn.Module       # on the group's device, training mode (+ its critic if any)
    ctx: StepContext              # prompt source, grouper, frozen reference (or None), group
    eval_sets: dict               # task -> its first eval_size held-out examples ({} if none)
    held_out: set                 # every held-out prompt (never drawn for training)
    objective: Objective          # the record cfg.objective names (step.OBJECTIVES)


def held_out_sets(cfg: TrainConfig) -> tuple[dict, set]:
    """-> (task -> its first eval_size held-out examples, every held-out prompt); an error
    when eval_size asks for more examples than a set holds."""
    sets = held_out(cfg.task_names, required=bool(cfg.eval_size))
    for t, exs in sets.items():
        if cfg.eval_size > len(exs):
            raise ValueError(f"eval_size={cfg.eval_size} but the held-out set of {t!r} has "
                             f"{len(exs)} examples; use at most {len(exs)} (0: no evaluation)")
    prompts = {e.prompt for exs in sets.values() for e in exs}
    return {t: render_all(exs[:cfg.eval_size], cfg.answer_format)           # instruct.py
            for t, exs in sets.items()}, prompts


class UnreadableText(UserWarning):
    """The policy's tokenizer drops characters of the run's text (check_readable)."""


def check_readable(policy, cfg: TrainConfig, eval_sets: dict, draw) -> None:
    """Every character of the run's text, as the run renders it (each task's held-out
    examples and 64 seeded training draws, prompt and answer), is one the policy's tokenizer
    reads and writes back (``Policy.unknown_chars``). What a task needs (``Task.alphabet``)
    meets what this policy has here, once: on the toy a character outside its alphabet is an
    error naming the task, the text and the character (the toy cannot encode it); a
    transformers tokenizer that would drop one silently (a BPE without byte fallback, as
    data/hf_tiny's) gets an ``UnreadableText`` warning naming the same (the model never sees
    those characters; the run goes on)."""
    first: dict[str, tuple] = {}                       # character -> where it first occurs
    drawn = draw(random.Random(f"{cfg.seed}-readable"), 64)
    for ex in [e for exs in eval_sets.values() for e in exs] + drawn:
        for text, what in ((ex.prompt, "prompt"), (ex.answer, "answer")):
            for c in text:
                first.setdefault(c, (ex.task, what, text))
    bad = policy.unknown_chars("".join(first))
    if not bad:
        return
    task, what, text = first[bad[0]]
    more = f" (all it cannot read: {bad})" if len(bad) > 1 else ""
    head = (f"task {task!r}: {what} {text!r} has character {bad[0]!r}, which the "
            f"{cfg.policy} policy cannot read{more}")
    if cfg.policy == "toy":
        raise ValueError(f"{head}: the toy's char tokenizer reads only {ALPHABET!r}; a task "
                         f"written in words trains on policy='hf' with an answer_format")
    warnings.warn(f"{head}: the tokenizer of {cfg.base_checkpoint!r} drops it, so the model "
                  f"never sees it; reword the task or use a model whose tokenizer reads it",
                  UnreadableText, stacklevel=3)


def setup(cfg: TrainConfig, group: Group | None = None) -> Setup:
    """The held-out sets, the policy (and the objective's extra modules: PPO's critic), the
    frozen reference only when the objective uses one and beta > 0, the prompt source (never a
    held-out prompt) and the grouper, for ``cfg`` on ``group``'s device (default: this process,
    ``Group.current()``)."""
    check_records(cfg)                         # each record the config names checks it
    group = Group.current() if group is None else group
    timelimit.LIMIT_S = cfg.user_code_timeout_s       # every call of user code from here on
    eval_sets, held = held_out_sets(cfg)
    obj = get_objective(cfg.objective)
    device = torch.device(cfg.speed.device) if cfg.speed.device else group.device   # NCCL: the rank's GPU
    policy = load_for(cfg)                                  # policy.py: toy GPT or HF model
    if obj.prepare is not None:      # e.g. PPO's critic (ppo.py), trained by the one optimizer
        obj.prepare(policy, cfg, lambda: load_for(cfg))
    policy = policy.to(device)
    ref = None
    if cfg.kl.beta and obj.uses_reference:        # a second, frozen copy (LoRA: adapters off)
        ref = policy.reference() if cfg.hf.lora_r else frozen(load_for(cfg).to(device))
    draw = rendered_source(prompt_source(cfg, held), cfg.answer_format)
    check_readable(policy, cfg, eval_sets, draw)           # the task's needs vs this policy
    ctx = StepContext(draw, make_grouper(cfg), ref, group)
    ctx.resolve(policy, cfg)      # once (vLLM: its engine built now, or an ImportError, not
                                  # after the base evaluation)
    return Setup(policy, ctx, eval_sets, held, obj)


def train(cfg: TrainConfig, resume: bool = False, progress: bool = True,
          on_step=None, allow_override: bool = False, overwrite: bool = True,
          base_eval: dict | None = None) -> list[dict]:
    """Run ``cfg`` -> history (one metrics dict per step, eval rows merged).

    Writes ``out_dir/metrics.jsonl`` and ``out_dir/checkpoint.safetensors`` (rank 0). With
    ``resume``, continues from that checkpoint exactly. ``on_step(metrics, policy)`` is the
    one hook point (live plots; it sees the averaged gradients of the step's last update).
    Under a process group (torchrun, ``launch.spawn``) every rank calls this with the same
    ``cfg``; the gradient exchange is ``cfg.exchange``. A resumed run must have the saved
    config (but its runtime fields: saved_config.RUNTIME_FIELDS) and plugin code unless
    ``allow_override``. The folder is locked while the run lasts (rundir.py); a new run into
    a folder holding one replaces it if ``overwrite`` (the default here, so a re-run notebook
    cell replaces its run; the CLI refuses unless --overwrite). SIGINT/SIGTERM finish the
    step, write a checkpoint and raise ``rundir.Interrupted``. ``out_dir/config.json`` holds
    the resolved config (rewritten on resume, with its overrides); ``cfg.report_to`` also
    sends every metrics row to live trackers (rank 0, trackers.py). ``base_eval``: the base
    policy's evaluation (``evaluate_tasks`` of this config's base), when the caller already
    has it: the step -1 row then takes it instead of evaluating again (experiments.py
    evaluates a study's shared base once).
    """
    check_installed(cfg.report_to)              # a missing tracker package: before any work
    fast = None
    if cfg.speed.fast_path:                        # the settings measured fastest here
        from grpo_lab.training import speed_probe
        cfg, fast = speed_probe.for_run(cfg, resume)
    rank0 = Group.current().rank == 0
    lead = rank0 and not claimed_by_parent(cfg.out_dir)
    lock = claim(cfg.out_dir, resume, overwrite and not resume) if lead else None
    several = Group.current().world > 1         # then SIGTERM keeps its default (rundir.py)
    stop = StopSignals(progress, (signal.SIGINT,) if several else StopSignals.SIGNALS)
    tracked = Trackers(cfg.report_to, cfg.out_dir, to_dict(cfg), fresh=not resume, lead=rank0)
    try:
        with stop:
            return _train(cfg, resume, progress, on_step, allow_override, stop, tracked,
                          base_eval, fast)
    except Exception as e:                      # the CLI's one-line error names the step
        e.add_note(f"at step {stop.step}" if stop.step is not None else
                   "before the first step (setup or the first evaluation)")
        raise
    finally:
        tracked.close()
        if lock is not None:
            lock.release()


class _Start(NamedTuple):
    """What the loop needs from the start of a run (setup, resume or the base evaluation)."""
    policy: object
    ctx: StepContext
    ex: object                      # the gradient exchange (exchanges.py, fsdp.py)
    collect: object
    objective: object
    evaluate_now: object            # step -> the evaluation's metrics ({} without eval_size)
    samples: dict                   # step -> its sample rows, for the trackers
    start: int                      # the first step to run
    history: list
    changes: dict                   # the overrides a resumed run took


def _start(cfg, resume, allow_override, base_eval, ckpt: Path, log_path: Path,
           fast=None) -> _Start:
    """Builds the run (``setup``), loads ``ckpt`` when resuming, else evaluates the base;
    writes ``log_path`` (metrics.jsonl) and config.json."""
    group = Group.current()
    sampling = (cfg.speed.rollout_threads or 1) if cfg.speed.async_steps else 0  # async's thread
    threads = cfg.threads or max(1, free_cores() - sampling)
    torch.set_num_threads(threads)
    cfg.check_world(group.world)                # the launcher checked it too (cli.main)
    out = Path(cfg.out_dir)
    lead = group.rank == 0
    if lead and not resume:
        (out / SAMPLES_FILE).unlink(missing_ok=True)        # a fresh run's samples only
    load_plugins(cfg.plugins)                   # a spawned or torchrun rank needs them too
    plugins = plugin_digests(cfg.plugins)       # {resolved path: sha256}, kept in the history
    run = setup(cfg, group)
    policy, ctx, eval_sets = run.policy, run.ctx, run.eval_sets
    scales = {"value_head.": cfg.ppo.vf_lr / cfg.lr} if cfg.ppo.vf_lr else {}   # critic's own lr
    collect, objective = run.objective.collect, run.objective.loss
    max_new = max_new_tokens(cfg)
    samples: dict[int, list] = {}                 # step -> its sample rows, for the trackers

    def evaluate_now(step: int) -> dict:          # and the first prompts to samples.jsonl
        if not cfg.eval_size:
            return {}
        rows: list = []
        res = (run.objective.evaluate or evaluate_tasks)(policy, eval_sets, cfg.reward_weights,
                                                         max_new, samples=rows)   # agents: episodes
        append_samples(out, step, rows)
        samples[step] = rows
        return res

    start, history, changes = 0, [], {}
    if resume:                       # the weights into the plain policy, before the exchange
        c = read_training_checkpoint(ckpt, whole=False)     # wraps or shards it (a sharded
        changes = {**_check_resumable(ckpt, c["config"], cfg, allow_override),   # one: after)
                   **plugin_changes(ckpt, c["history"], plugins, allow_override)}
        if c["model_config"] != vars(policy.cfg):
            raise ValueError(f"{ckpt} holds a policy of another shape: {c['model_config']} "
                             f"vs {vars(policy.cfg)}")
        if c["shards"] is None:
            load_state_strict(policy, c["policy"], ckpt)
            check_optimizer_state(c["optim"], [p for g in param_groups(policy, scales)[0]
                                               for p in g], ckpt)   # the optimizer's order
    fused = get_policy_kind(cfg.policy).fused_adamw      # HF models: fused AdamW
    ex = make_exchange(policy, cfg.exchange, AdamW(cfg.lr, cfg.adam_eps, cfg.weight_decay,
                                                   cfg.grad_clip, cfg.seed, scales, fused),
                       group.world, group.rank, cfg.blocks)
    if resume and c["shards"] is not None:        # each rank its share, from any world size
        if ex.optimizer is None:
            raise ValueError(f"{ckpt} is a sharded checkpoint of torch's AdamW state; exchange "
                             f"{cfg.exchange.name!r} steps its own Adam: resume it under an "
                             f"exchange that steps torch's AdamW (allreduce, fsdp2, ...)")
        dcp.load_sharded(c["shards"], policy, ex.optimizer, c["optim"]["param_groups"], group)
        if lead:
            dcp.remove_unnamed(ckpt, keep=c["shards"])        # a write killed before its commit
        group.barrier()
    if resume:
        if c["shards"] is None:
            ex.load_state_dict(c["optim"])
        ctx.grouper.load_state_dict(c["grouping"])
        if not cfg.exchange.kind.resumes_exactly:
            warnings.warn(f"exchange {cfg.exchange.name!r} keeps per-rank compression state "
                          f"that checkpoints do not hold: the resumed run is close to, not "
                          f"exactly, the one that never stopped", RuntimeWarning, stacklevel=2)
        start, history = c["step"] + 1, c["history"]
        if lead:                                    # the steps after it run again
            keep_samples_through(out, c["step"])
    else:
        if base_eval is not None:                  # a study's shared base evaluation
            base = base_eval if lead else {}
        else:
            with ex.gathered() if cfg.eval_size else nullcontext():   # on every rank
                base = evaluate_now(-1) if lead else {}
        history.append({"step": -1, **base, "time/elapsed_s": 0.0,
                        "time/threads": threads, **({"plugins/sha256": plugins} if plugins else {})})
    if lead:                                    # replaced atomically: a kill leaves old or new
        write_lines_atomic(log_path, [json.dumps(h) + "\n" for h in history])
        write_lines_atomic(out / CONFIG_FILE, [json.dumps(
            {VERSION_KEY: __version__, **to_dict(cfg), **({FAST_PATH_KEY: fast} if fast else {})},
            indent=1) + "\n"])
    return _Start(policy, ctx, ex, collect, objective, evaluate_now, samples, start, history,
                  changes)


def _train(cfg, resume, progress, on_step, allow_override, stop, tracked,
           base_eval=None, fast=None) -> list[dict]:
    group, out = Group.current(), Path(cfg.out_dir)
    lead = group.rank == 0
    ckpt, log_path = out / "checkpoint.safetensors", out / "metrics.jsonl"
    policy, ctx, ex, collect, objective, evaluate_now, samples, start, history, changes = \
        _start(cfg, resume, allow_override, base_eval, ckpt, log_path, fast)
    threads = torch.get_num_threads()           # the update's; the rollout's: speed.rollout_threads
    sampler = (AsyncRollout(cfg, policy, ctx, out, start if resume else None)  # async_rollout.py
               if cfg.speed.async_steps else None)
    untracked = [] if resume else history[-1:]  # the base row goes to the trackers with step 0's
    elapsed0 = history[-1].get("time/elapsed_s", 0.0) if history else 0.0
    acc = next((h["eval/accuracy"] for h in reversed(history) if "eval/accuracy" in h), None)
    t0 = time.perf_counter()
    cfg_dict, warned = to_dict(cfg), set()
    bar = tqdm(range(start, cfg.steps), desc=cfg.objective, disable=not (progress and lead),
               initial=start, total=cfg.steps)
    for step in bar:
        stop.step, t_step = step, now()
        clock = ctx.clock
        clock.clear()                            # "time/<phase>_s" of this step
        lr = learning_rate(cfg, step)
        ex.set_lr(lr)
        torch.set_num_threads(cfg.speed.rollout_threads or threads)
        with ex.gathered():           # the rollout's forwards: a different number per rank
            batch = (collect(policy, cfg, step, ctx) if sampler is None else
                     sampler.collect(collect, policy, cfg, step, ctx))   # step+k starts now
        torch.set_num_threads(threads)
        t_collect = now() - t_step
        policy.train()
        w0 = wchar() if group.world > 1 else None      # bytes written, for comm/wchar_bytes
        payload, sent, shares, ex_metrics = 0, 0, {}, {}
        parts = split_batch(batch, cfg.micro_batches) if cfg.micro_batches > 1 else [batch]
        for _ in range(cfg.mu):
            ex.zero_grad()
            shares = backward(objective, ex.module, parts, cfg, group.world,  # accumulates
                              clock)
            t_reduce = now()
            b = ex.reduce()
            t_opt = now()
            try:
                ex_metrics = ex.step()
            except FloatingPointError as e:
                raise FloatingPointError(f"step {step}: {e}; lower lr={cfg.lr}{_scales(cfg)} "
                                         f"or check the rewards") from None
            add_time(clock, "time/exchange_s", t_opt - t_reduce)
            add_time(clock, "time/optimizer_s", now() - t_opt)
            payload, sent = payload + b, sent + ex.wire(b)
        t_check = now()
        _check_finite(ex, step, ckpt, group)
        add_time(clock, "time/check_s", now() - t_check)
        metrics = {"step": step, "optim/lr": lr,         # the schedule's values at this step
                   **({"optim/vf_lr": lr * cfg.ppo.vf_lr / cfg.lr} if cfg.ppo.vf_lr else {}),
                   **batch.metrics, **_reduce_shares(shares, group), **ex_metrics,
                   **{k: 0.0 for k in PHASES}, **clock,
                   "time/rollout_s": t_collect, "time/step_s": now() - t_step}
        if changes and step == start:
            metrics["resume/overrides"] = changes                # recorded once, where it began
        if group.world > 1:
            w1 = wchar()
            metrics.update({"comm/payload_bytes": payload, "comm/bytes": sent,
                            "comm/wchar_bytes": None if w0 is None or w1 is None else w1 - w0})
        last_step = step == cfg.steps - 1
        over = bool(cfg.time_budget_s) and elapsed0 + time.perf_counter() - t0 >= cfg.time_budget_s
        out_of_time, stopping = _agree(group, over, stop.signum is not None)   # SIGINT/SIGTERM
        evaluated = bool((cfg.eval_every and (step + 1) % cfg.eval_every == 0) or last_step
                         or out_of_time)                 # the same on every rank
        if evaluated and cfg.eval_size:
            with ex.gathered():                          # every rank; rank 0 evaluates
                if lead:
                    metrics.update(evaluate_now(step))
        metrics["time/elapsed_s"] = elapsed0 + time.perf_counter() - t0
        reached = (bool(cfg.target_accuracy) and evaluated and   # a collective only then
                   group.agree(metrics.get("eval/accuracy", -1.0) >= cfg.target_accuracy))
        history.append(metrics)
        if lead:
            with open(log_path, "a") as f:
                f.write(json.dumps(metrics) + "\n")
        for row in untracked + [metrics]:        # trackers.py (rank 0; a failure only warns)
            tracked.log(row, samples.pop(row["step"], None))
        untracked = []
        if (step + 1) % cfg.ckpt_every == 0 or last_step or out_of_time or reached or stopping:
            if sampler is not None:
                sampler.save(step)                       # its pending rollouts, first
            _checkpoint(ckpt, policy, ex, cfg, step, history, ctx.grouper, lead)
        if stopping:
            bar.close()
            raise Interrupted(stop.signum or signal.SIGINT, cfg.out_dir, step)
        if lead:
            acc = metrics.get("eval/accuracy", acc)
            budget = (f"{metrics['time/elapsed_s']:.0f}/{cfg.time_budget_s:.0f}s"
                      if cfg.time_budget_s else None)                # progress against the budget
            found = diagnose(history[-60:], cfg_dict, history[:6])  # health.py: no signal?
            for f in found:
                if f.code not in warned:                            # said once, in words
                    warned.add(f.code)
                    bar.write(f"step {step}: {f.code}: {f.message}")
            bar.set_postfix(reward=f"{metrics.get('reward/mean', float('nan')):.3f}",
                            acc="-" if acc is None else f"{acc:.2f}",
                            **({"budget": budget} if budget else {}),
                            **({"warn": ",".join(f.code for f in found)} if found else {}))
        if on_step is not None:
            on_step(metrics, policy)
        if out_of_time or reached:
            break
    if start >= cfg.steps:  # nothing left to run: make sure a checkpoint exists
        _checkpoint(ckpt, policy, ex, cfg, start - 1, history, ctx.grouper, lead)
    group.barrier()
    return history


def _scales(cfg) -> str:
    """The loss's coefficients that are on, for an error about a gradient: ", kl.beta=..."."""
    on = {"kl.beta": cfg.kl.beta, "entropy_bonus.coef": cfg.entropy_bonus.coef,
          **({"ppo.vf_coef": cfg.ppo.vf_coef} if cfg.objective == "ppo" else {})}
    return "".join(f", {k}={v}" for k, v in on.items() if v)


def _checkpoint(path, policy, ex, cfg, step, history, grouper, lead: bool) -> None:
    if cfg.ckpt_format == "dcp":                     # every rank writes its shards
        dcp.save_sharded(path, policy, ex.optimizer, to_dict(cfg), step, history,
                         grouper.state_dict(), Group.current())
        return
    state = ex.state_dict()                          # a collective for sharded exchanges
    weights = ex.model_state() if ex.model_state is not None else None    # fsdp2: likewise
    if lead:
        save_training_checkpoint(path, policy, state, to_dict(cfg), step, history,
                                 grouper.state_dict(), weights)
        dcp.remove_unnamed(path, keep=None)          # a resumed sharded run's old folder


def _train_ranks(rank: int, world: int, cfgs: list, resume: bool,
                 allow_override: bool = False) -> list[dict]:
    out = []
    for c in cfgs:
        seen = {}
        history = train(c, resume=resume, progress=False, allow_override=allow_override,
                        on_step=lambda m, policy: seen.setdefault("policy", policy))
        params = full_parameters(seen["policy"]) if seen else {}   # whole, also when sharded
        out.append({"history": history, "params": params})
    return out


def spawn_train(cfgs: list[TrainConfig], nproc: int = 2, resume: bool = False,
                run_timeout_s: float | None = None, progress: bool = True,
                allow_override: bool = False) -> list[list[dict]]:
    """Train every config in turn on ``nproc`` new local processes (gloo on CPU; one spawn
    for all, ``launch.spawn``) -> results[i][rank] = {"history", "params"} of cfgs[i].
    What notebooks and tests use; from a shell, ``grpo-lab train --nproc N`` does the same.
    ``progress``: a bar in this process over all configs' steps, read from the runs'
    metrics.jsonl files (rank 0 writes one line per step). ``resume``, ``allow_override``: as
    ``train``'s."""
    from grpo_lab.distributed import launch

    timeout = max(c.exchange.timeout_s for c in cfgs)
    bar = tqdm(total=sum(c.steps for c in cfgs), desc=f"{len(cfgs)} run(s) x {nproc} processes",
               disable=not progress)
    logs = [Path(c.out_dir) / "metrics.jsonl" for c in cfgs]
    seen = {"t": 0.0}

    def poll():                                   # at most once a second: count logged steps
        if time.monotonic() - seen["t"] < 1.0:
            return
        seen["t"] = time.monotonic()
        done = sum(max(0, len(f.read_text().splitlines()) - 1) for f in logs if f.exists())
        bar.update(min(done, bar.total) - bar.n)

    try:
        by_rank = launch.spawn(_train_ranks, nproc, (list(cfgs), resume, allow_override),
                               timeout_s=timeout,
                               run_timeout_s=run_timeout_s, on_poll=poll)
        bar.update(bar.total - bar.n)
    finally:
        bar.close()
    return [[by_rank[r][i] for r in range(nproc)] for i in range(len(cfgs))]
