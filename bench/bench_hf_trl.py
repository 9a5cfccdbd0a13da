"""grpo_lab's train() vs TRL's GRPOTrainer on the same HF model: wall time per optimizer step,
and time to 85% / 90% held-out accuracy over seeds, side by side in one run.

Needs the optional bench packages (never a grpo_lab dependency): pip install -e ".[hf,bench]"
in a separate venv (measured with trl 1.16.0, accelerate 1.15.0, datasets 5.2.0, transformers
5.24.0). Both sides: B=16 prompts x G=8 completions of at most 6 tokens, temperature 0.7, top-k
off, one update per rollout (mu = 1), rewards accuracy + 0.5 * partial (the format reward is
left out of both, and TRL's side counts every completion as stopped; ``trl_steps(read_stop=
True)`` reads the stop from the completion ids TRL hands its reward functions, which
bench_tta_smollm.py uses).

Runs (``runs``), each from the same checkpoint:
  * grpo_lab: the hf_tiny_cpu preset's optimisation (lr 1e-4, 20 warm-up steps, cosine to 10%
    of lr at the last step, AdamW, grad clip 1, eps 0.2 / 0.28, per-sequence token mean).
  * TRL, same lr and schedule: lr 1e-4, ``cosine_with_min_lr`` (min_lr_rate 0.1) after 20
    linear warm-up steps, and grpo_lab's loss where TRL has the knob (loss_type "grpo" = mean
    over a sequence's tokens, then over sequences; epsilon_high 0.28; activation
    checkpointing off, as in grpo_lab).
  * TRL as shipped: its defaults (lr 1e-6, linear decay to 0, loss_type "dapo", epsilon 0.2,
    activation checkpointing on); only the shared sampling settings and reward are set.
The schedules differ in one detail: grpo_lab's warm-up multiplies a cosine that starts at
step 0, transformers' cosine starts after the warm-up (the bench prints the largest gap).

Times are training time: evaluation (greedy, grpo_lab's ``evaluate`` on both sides) is left
out. Step 0-2 are warm-up for the per-step medians.

    python bench/bench_hf_trl.py --threads 1 --steps 30                       # per step only
    python bench/bench_hf_trl.py --threads 1 --steps 30 --seeds 0,1,2 --accuracy_steps 400
    # one GPU, a public model (transformers downloads it on your machine), bf16 autocast:
    python bench/bench_hf_trl.py --device cuda --model Qwen/Qwen2.5-0.5B-Instruct --lr 1e-6 \\
        --chat_template --max_new 16 --temperature 1.0 --threads 0 --seeds 0,1,2 \\
        --accuracy_steps 300
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from grpo_lab.training.config import preset
from grpo_lab.training.experiments import mean_ci
from grpo_lab.policies.hf import HFPolicy, load_hf_policy
from grpo_lab.tasks.rewards import resolve_rewards, weighted_reward
from grpo_lab.tasks.task_data import load_eval
from grpo_lab.tasks import Example, get_task, sample_examples
from grpo_lab.tasks.instruct import render_all
from grpo_lab.training.trainer import evaluate, learning_rate, train

WEIGHTS = {"accuracy": 1.0, "partial": 0.5}
WARMUP, MIN_LR_RATE = 20, 0.1                       # hf_tiny_cpu's warm-up; cosine to 10%
TARGETS = (0.80, 0.85, 0.90)


def sync(a) -> None:
    if a.device == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def one_gpu_group(a):
    """On CUDA: a one-process NCCL group around grpo_lab's train(), whose policy then lives on
    the GPU (Group.device); destroyed afterwards so TRL's accelerate sees a plain process."""
    if a.device != "cuda":
        yield
        return
    import torch.distributed as dist

    from grpo_lab.distributed.launch import free_port
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def grpo_lab_steps(a, beta: float, steps: int, seed: int = 0, eval_every: int = 0,
                   preset_name: str = "hf_tiny_cpu", **overrides) -> list[dict]:
    """-> one row per step: {"step_s", "rollout_s", "gen_s" (sampling), "loss_s" (the
    objective's forward), "elapsed_s" (training time so far),
    "acc" (held-out greedy accuracy, on evaluation steps), "mean_len" (completion tokens,
    <eos> included)}. ``overrides``: more TrainConfig fields, on top of these (another
    preset's policy needs its own base_checkpoint)."""
    with tempfile.TemporaryDirectory() as d, one_gpu_group(a):
        c = preset(preset_name, **{
            "base_checkpoint": a.model, "out_dir": d, "steps": steps, "lr": a.lr,
            "prompts_per_step": a.B, "group_size": a.G, "max_new_tokens": a.max_new,
            "temperature": a.temperature, "kl": {"beta": beta}, "seed": seed,
            "eval_size": a.eval_size if eval_every else 0, "eval_every": eval_every,
            "reward_weights": WEIGHTS, "time_budget_s": 0.0, "ckpt_every": 10 ** 6,
            "threads": a.threads,
            "hf": {"autocast": a.device == "cuda", "chat_template": a.chat_template}, **overrides})
        h = train(c, progress=False)
    rows, spent, clock = [], 0.0, 0.0
    for x in h[1:]:
        spent += x["time/step_s"]                       # evaluation time left out, as for TRL
        rows.append({"step_s": x["time/step_s"], "rollout_s": x["time/rollout_s"],
                     "gen_s": x["time/sample_s"], "loss_s": x["time/loss_forward_s"],
                     "elapsed_s": spent, "acc": x.get("eval/accuracy"),
                     "mean_len": x["completion/mean_len"],
                     # outside the step: evaluation, and a checkpoint where the run ends
                     "eval_s": x["time/elapsed_s"] - clock - x["time/step_s"]})
        clock = x["time/elapsed_s"]
    return rows


def trl_config(a, d: str, beta: float, steps: int, seed: int, shipped: bool, **overrides):
    """TRL's GRPOConfig: grpo_lab's lr, schedule and loss knobs, or (``shipped``) its defaults;
    the sampling settings are shared either way; ``overrides``: GRPOConfig fields on top."""
    from trl import GRPOConfig

    same = {} if shipped else dict(
        learning_rate=a.lr, lr_scheduler_type="cosine_with_min_lr", warmup_steps=WARMUP,
        lr_scheduler_kwargs={"min_lr_rate": MIN_LR_RATE}, loss_type="grpo", epsilon=0.2,
        epsilon_high=0.28, max_grad_norm=1.0, gradient_checkpointing=False)
    return GRPOConfig(output_dir=d, per_device_train_batch_size=a.B * a.G, num_generations=a.G,
                      max_completion_length=a.max_new, temperature=a.temperature, top_k=0,
                      top_p=1.0, beta=beta, max_steps=steps, logging_steps=10 ** 6,
                      save_strategy="no", report_to="none", disable_tqdm=True,
                      use_cpu=a.device == "cpu", seed=seed, dataloader_num_workers=0,
                      **{"bf16": a.device == "cuda", **same, **overrides})


def trl_steps(a, beta: float, steps: int, seed: int = 0, eval_every: int = 0,
              shipped: bool = False, probe=None, trainer_kw: dict | None = None,
              fmt: str = "raw", system_prompt: str = "", weights: dict | None = None,
              read_stop: bool = False, target: float = 0.0, **overrides) -> list[dict]:
    """TRL's GRPOTrainer on the same model, prompts never from the held-out set -> rows as
    grpo_lab_steps (rollout_s: its _generate_and_score_completions; no "mean_len"; eval_s:
    the evaluation's seconds). ``overrides``: GRPOConfig fields (trl_config); ``trainer_kw``:
    more GRPOTrainer arguments (peft_config); ``probe(trainer)`` is called before training
    (to wrap its methods with timers). A preset's prompts: ``fmt`` (its answer_format, the
    prompts and held-out set rendered as instruct.render does), ``system_prompt`` (a system
    turn, chat template only) and its reward ``weights`` (default WEIGHTS). ``read_stop``: a
    completion counts as stopped where its last token is an end-of-sequence id (TRL hands its
    completion ids, cut after the first of them, to reward functions); off, every completion
    counts as stopped (the recorded runs of this bench). ``target`` > 0: training stops at
    the first evaluation with held-out accuracy >= target, as grpo_lab's target_accuracy."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    rewards = resolve_rewards(WEIGHTS if weights is None else weights)
    policy = load_hf_policy(a.model, chat_template=a.chat_template, system_prompt=system_prompt)
    held_out = {e.prompt for e in load_eval("addition")}              # as grpo_lab: never these
    exs = render_all(sample_examples([get_task("addition")], a.B * steps, random.Random(seed),
                                     held_out), fmt)
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    prompts = [system + [{"role": "user", "content": e.prompt}] if a.chat_template else e.prompt
               for e in exs]
    data = Dataset.from_dict({"prompt": prompts, "answer": [e.answer for e in exs],
                              "task": [e.task for e in exs], "fmt": [e.fmt for e in exs]})
    eos = set()                                        # TRL's end-of-sequence ids, once built

    def reward(completions, answer, task, fmt, completion_ids, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        stopped = ([bool(ids) and ids[-1] in eos for ids in completion_ids] if read_stop
                   else [True] * len(texts))
        r, _parts = weighted_reward([t.strip() for t in texts],
                                    [Example("", ans, t, f, answer_chars=get_task(t).answer_chars)
                                     for ans, t, f in zip(answer, task, fmt)], rewards, stopped)
        return r.tolist()

    rows, t0, rollout, cpu, rollout_cpu = [], [0.0], [0.0], [0.0], [0.0]   # cpu: process time
    evals = render_all(load_eval("addition")[:a.eval_size], fmt)

    class Clock(TrainerCallback):
        def on_step_begin(self, *args, **kw):
            sync(a)
            t0[0], rollout[0], cpu[0], rollout_cpu[0] = (time.perf_counter(), 0.0,
                                                         time.process_time(), 0.0)

        def on_step_end(self, args, state, control, model=None, **kw):
            sync(a)
            dt = time.perf_counter() - t0[0]
            spent = (rows[-1]["elapsed_s"] if rows else 0.0) + dt
            acc, cpu_s, t_eval = None, time.process_time() - cpu[0], time.perf_counter()
            last = state.global_step >= steps                           # as grpo_lab: evaluated
            if eval_every and (state.global_step % eval_every == 0 or (target and last)):
                was = model.training                                    # grpo_lab's evaluation
                acc = evaluate(HFPolicy(model, policy.tokenizer, policy.cfg), evals,
                               {"accuracy": 1.0}, a.max_new)["eval/accuracy"]
                model.train(was)
                if target and acc >= target:                            # else TRL's own say
                    control.should_training_stop = True
            rows.append({"step_s": dt, "rollout_s": rollout[0], "elapsed_s": spent, "acc": acc,
                         "cpu_s": cpu_s, "rollout_cpu_s": rollout_cpu[0],
                         "eval_s": time.perf_counter() - t_eval})

    if getattr(policy.model, "is_quantized", False):   # a GGUF-converted folder's config keeps
        policy.model.is_quantized = False              # its quantization note; the weights are
        policy.model.hf_quantizer = None               # plain fp32, but Trainer would refuse them
    with tempfile.TemporaryDirectory() as d:
        trainer = GRPOTrainer(model=policy.model, reward_funcs=reward,
                              args=trl_config(a, d, beta, steps, seed, shipped, **overrides),
                              train_dataset=data, processing_class=policy.tokenizer,
                              callbacks=[Clock()], **(trainer_kw or {}))
        eos.update(trainer.eos_token_ids)
        generate = trainer._generate_and_score_completions

        def timed(*args, **kw):                     # sampling, rewards, advantages (+ ref)
            t, c = time.perf_counter(), time.process_time()
            out = generate(*args, **kw)
            sync(a)
            rollout[0] += time.perf_counter() - t
            rollout_cpu[0] += time.process_time() - c
            return out

        trainer._generate_and_score_completions = timed
        if probe is not None:
            probe(trainer)
        trainer.train()
    return rows


def runs(a) -> dict:
    """name -> rows(a, seed): the time-to-accuracy runs, beta 0."""
    lr = f"{a.lr:.0e}".replace("e-0", "e-")                               # 1e-4
    return {
        f"grpo_lab, lr {lr} warm-up + cosine": lambda a, s: grpo_lab_steps(
            a, 0.0, a.accuracy_steps, s, a.eval_every),
        f"TRL, same lr {lr} and schedule": lambda a, s: trl_steps(
            a, 0.0, a.accuracy_steps, s, a.eval_every),
        "TRL as shipped (lr 1e-6)": lambda a, s: trl_steps(
            a, 0.0, a.accuracy_steps, s, a.eval_every, shipped=True)}


def reached(rows: list[dict], target: float) -> tuple[int, float] | None:
    """(steps, training seconds) at the first evaluation with accuracy >= target, or None."""
    for i, r in enumerate(rows):
        if r["acc"] is not None and r["acc"] >= target:
            return i + 1, r["elapsed_s"]
    return None


def schedule_gap(steps: int) -> tuple[float, int]:
    """Largest |grpo_lab lr - transformers lr| over the run, as a fraction of the peak lr."""
    from transformers import optimization

    f = optimization._get_cosine_with_min_lr_schedule_with_warmup_lr_rate_lambda  # its lr(step)
    cfg = preset("hf_tiny_cpu", steps=steps)
    gaps = [abs(learning_rate(cfg, s) / cfg.lr
                - f(s, num_warmup_steps=WARMUP, num_training_steps=steps, num_cycles=0.5,
                    min_lr_rate=MIN_LR_RATE)) for s in range(steps)]
    return max(gaps), gaps.index(max(gaps))


def ci_cell(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    m, lo, hi = mean_ci(values)
    return f"{m:{fmt}}" + (f" [{lo:{fmt}}, {hi:{fmt}}]" if len(values) > 1 else "")


def per_step_table(a) -> list[str]:
    med = lambda rows, k="step_s": statistics.median(r[k] for r in rows[3:])   # noqa: E731
    out = ["| beta | grpo_lab s/step (rollout) | TRL, same settings (rollout) | TRL / grpo_lab "
           "| TRL as shipped (activation checkpointing on) | its / grpo_lab |",
           "|---|---|---|---|---|---|"]
    for beta in (0.0, 0.02):
        ours = grpo_lab_steps(a, beta, a.steps)
        same, shipped_gc = trl_steps(a, beta, a.steps), trl_steps(a, beta, a.steps, shipped=True)
        o, s, g = med(ours), med(same), med(shipped_gc)
        out.append(f"| {beta} | {o:.4f} ({med(ours, 'rollout_s'):.4f}) | {s:.4f} "
                   f"({med(same, 'rollout_s'):.4f}) | {s / o:.2f} | {g:.4f} | {g / o:.2f} |")
        print(out[-1], flush=True)
    return out


def accuracy_tables(a) -> tuple[list[str], dict]:
    """Every run x seed, interleaved -> (markdown lines, {name: [rows per seed]})."""
    fns = runs(a)
    done = {name: [] for name in fns}
    for seed in a.seeds:                            # interleaved: load drifts hit every run
        for name, fn in fns.items():
            t = time.perf_counter()
            done[name].append(fn(a, seed))
            rows = done[name][-1]
            best = max(r["acc"] for r in rows if r["acc"] is not None)
            print(f"seed {seed} {name}: best {best:.1%}, "
                  f"{rows[-1]['elapsed_s']:.0f} s training, "
                  f"{time.perf_counter() - t:.0f} s wall", flush=True)
    evals = [i for i, r in enumerate(next(iter(done.values()))[0]) if r["acc"] is not None]
    out = [f"Held-out greedy accuracy (mean over seeds {a.seeds}) at each evaluation:", "",
           "| run | " + " | ".join(f"step {i + 1}" for i in evals) + " |",
           "|---|" + "---|" * len(evals)]
    for name, seeds in done.items():
        out.append(f"| {name} | " + " | ".join(
            f"{statistics.mean(rows[i]['acc'] for rows in seeds):.1%}" for i in evals) + " |")
    out += ["", f"Time to accuracy over {len(a.seeds)} seeds: mean [95% interval] over the seeds "
            f"that reached it (n/{len(a.seeds)}); training seconds, evaluation excluded:", "",
            "| run | " + " | ".join(f"reached {t:.0%} | steps to {t:.0%} | s to {t:.0%}"
                                    for t in TARGETS) + " | best acc | s/step (rollout) |",
            "|---|" + "---|---|---|" * len(TARGETS) + "---|---|"]
    for name, seeds in done.items():
        cells = []
        for t in TARGETS:
            hit = [x for x in (reached(rows, t) for rows in seeds) if x]
            cells += [f"{len(hit)}/{len(seeds)}", ci_cell([x[0] for x in hit], ".0f"),
                      ci_cell([x[1] for x in hit], ".1f")]
        best = [max(r["acc"] for r in rows if r["acc"] is not None) for rows in seeds]
        per = [rows[-1]["elapsed_s"] / len(rows) for rows in seeds]
        roll = statistics.mean(statistics.mean(r["rollout_s"] for r in rows) for rows in seeds)
        out.append(f"| {name} | " + " | ".join(cells) + f" | {ci_cell(best, '.3f')} | "
                   f"{ci_cell(per, '.3f')} ({roll:.3f}) |")
    out += ["", f"Per seed (steps to {' / '.join(f'{t:.0%}' for t in TARGETS)} with training "
            f"s, best):", ""]
    for name, seeds in done.items():
        for seed, rows in zip(a.seeds, seeds):
            h = [reached(rows, t) for t in TARGETS]
            best = max(r["acc"] for r in rows if r["acc"] is not None)
            out.append(f"- {name}, seed {seed}: " + " / ".join(
                f"{x[0]} ({x[1]:.1f} s)" if x else "-" for x in h) + f", best {best:.1%}")
    ours, theirs = list(done.values())[:2]
    out.append("")
    for t in TARGETS:
        pairs = [(reached(o, t), reached(th, t)) for o, th in zip(ours, theirs)]
        ratios = [o[1] / th[1] for o, th in pairs if o and th]
        out.append(f"grpo_lab / TRL (same lr and schedule) training time to {t:.0%}, paired by "
                   f"seed: {ci_cell(ratios, '.2f')} over {len(ratios)} seed(s) where both "
                   f"reached it.")
    return out, done


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="data/hf_tiny",
                    help="local transformers folder or hub id (downloaded on your machine)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="cuda: one GPU, bf16 autocast over fp32 weights on both sides")
    ap.add_argument("--chat_template", action="store_true",
                    help="prompts as one user turn in the tokenizer's chat template (instruct "
                         "models), on both sides")
    ap.add_argument("--steps", type=int, default=30, help="per-step timing run (0: skip)")
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--max_new", type=int, default=6)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--lr", type=float, default=1e-4,
                    help="peak lr of grpo_lab and of TRL's same-schedule run (hf_tiny_cpu's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: its default)")
    ap.add_argument("--accuracy_steps", type=int, default=0,
                    help="step budget of each time-to-accuracy run (0: step times only)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds of those runs")
    ap.add_argument("--eval_every", type=int, default=25)
    ap.add_argument("--eval_size", type=int, default=200)
    ap.add_argument("--out", default="",
                    help="results file (default bench/RESULTS_hf_trl[_cuda].md)")
    a = ap.parse_args(argv)
    a.seeds = [int(s) for s in a.seeds.split(",")]
    if not a.lr > 0:
        raise ValueError(f"--lr must be > 0, got {a.lr}")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda, but torch sees no CUDA device")
    if a.threads:
        torch.set_num_threads(a.threads)
    import accelerate
    import datasets
    import transformers
    import trl

    import sys
    args = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"Command: `python bench/bench_hf_trl.py {args}`",
             f"{a.model} on {a.device}, B={a.B} G={a.G} max_new={a.max_new} T={a.temperature}, "
             f"torch {torch.__version__}, transformers {transformers.__version__}, trl "
             f"{trl.__version__}, accelerate {accelerate.__version__}, datasets "
             f"{datasets.__version__}, threads {a.threads}.", ""]
    if a.steps:
        lines += [f"Median s per optimizer step over steps 3-{a.steps - 1} (rollout: sampling "
                  f"and rewards), lr 1e-4 schedule as above:", ""] + per_step_table(a) + [""]
    if a.accuracy_steps:
        gap, at = schedule_gap(a.accuracy_steps)
        lines += [f"Learning-rate schedules over {a.accuracy_steps} steps: largest gap "
                  f"grpo_lab vs transformers' cosine_with_min_lr {gap:.1%} of the peak lr "
                  f"(step {at}).", ""]
        table, done = accuracy_tables(a)
        lines += table
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(a.out or f"bench/RESULTS_hf_trl{'_cuda' if a.device == 'cuda' else ''}.md")
    out.write_text(f"# grpo_lab vs TRL GRPOTrainer (bench/bench_hf_trl.py)\n\n{text}")
    if a.accuracy_steps:                            # every row, to recompute any threshold
        done = {k: [[{f: round(v, 5) if isinstance(v, float) else v for f, v in r.items()}
                     for r in rows] for rows in seeds] for k, seeds in done.items()}
        out.with_suffix(".json").write_text(json.dumps({"args": vars(a), "runs": done}))


if __name__ == "__main__":
    main()
