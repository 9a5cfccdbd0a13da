"""Wall time per optimizer step: grpo_lab's train() vs TRL's GRPOTrainer, side by side in one
run, on the same HF model (data/hf_tiny), tokenizer, task, B, G, lengths, lr and steps.

Needs the optional bench packages (never a grpo_lab dependency): pip install trl
(measured with trl 1.13.0, accelerate 1.15.0, datasets 5.2.0 next to transformers 5.24.0).
Both sides: B=16 prompts x G=8 completions of at most 6 tokens, temperature 0.7, lr 1e-4
constant after no warm-up, one update per rollout (mu = 1), rewards accuracy + 0.5 * partial
(TRL's reward functions do not see whether a completion stopped, so the format reward is left
out of both), beta 0 and beta 0.02 (TRL then keeps a reference model too). Median of the
steps after the first 3 (warm-up), per side.

    python bench/bench_hf_trl.py --threads 1 --steps 30
    python bench/bench_hf_trl.py --threads 1 --steps 30 --accuracy_steps 200   # + accuracy
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import torch

from grpo_lab.config import preset
from grpo_lab.hf import HFPolicy, load_hf_policy
from grpo_lab.tasks import load_eval, sample_examples, weighted_reward
from grpo_lab.trainer import evaluate, train

WEIGHTS = {"accuracy": 1.0, "partial": 0.5}


def grpo_lab_steps(a, beta: float, eval_every: int = 0, preset_name: str = "hf_tiny_cpu",
                   **overrides) -> list[dict]:
    """-> one row per step: {"step_s", "elapsed_s" (training time so far), "acc" (held-out
    greedy accuracy, on evaluation steps), "rollout_s" (sampling, rewards, reference forward),
    "mean_len" (completion tokens, <eos> included)}. ``overrides``: more TrainConfig fields."""
    with tempfile.TemporaryDirectory() as d:
        c = preset(preset_name, **{
            "out_dir": d, "steps": a.steps, "prompts_per_step": a.B, "group_size": a.G,
            "max_new_tokens": a.max_new, "temperature": 0.7, "lr": a.lr, "warmup_steps": 0,
            "lr_schedule": "constant", "beta": beta,
            "eval_size": a.eval_size if eval_every else 0, "eval_every": eval_every,
            "reward_weights": WEIGHTS, "time_budget_s": 0.0, "ckpt_every": 10 ** 6,
            "threads": a.threads, **overrides})
        h = train(c, progress=False)
    rows, spent = [], 0.0
    for x in h[1:]:
        spent += x["time/step_s"]                       # evaluation time left out, as for TRL
        rows.append({"step_s": x["time/step_s"], "elapsed_s": spent,
                     "acc": x.get("eval/accuracy"), "rollout_s": x["time/rollout_s"],
                     "mean_len": x["completion/mean_len"]})
    return rows


def trl_steps(a, beta: float, eval_every: int = 0, lr: float | None = None,
              model_dir: str = "data/hf_tiny", lr_schedule: str = "constant",
              probe=None, seed: int = 0) -> list[dict]:
    """-> one row per step, as grpo_lab_steps (no "rollout_s", "mean_len"), from TRL's
    GRPOTrainer on the transformers model in ``model_dir``. ``probe(trainer)`` is called
    before training (to wrap its methods with timers, or read its logged metrics after)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    policy = load_hf_policy(model_dir)
    held_out = {e.prompt for e in load_eval("addition")}              # as grpo_lab: never these
    exs = sample_examples(["addition"], a.B * a.steps, random.Random(seed), held_out)
    data = Dataset.from_dict({"prompt": [e.prompt for e in exs], "answer": [e.answer for e in exs],
                              "task": [e.task for e in exs]})

    def reward(completions, answer, task, **_):
        from grpo_lab.tasks import Example
        rows = [Example("", ans, t) for ans, t in zip(answer, task)]
        r, _parts = weighted_reward([c.strip() for c in completions], rows, WEIGHTS,
                                    [True] * len(rows))
        return r.tolist()

    rows, t0 = [], [0.0]
    evals = load_eval("addition")[:a.eval_size]

    class Clock(TrainerCallback):
        def on_step_begin(self, *args, **kw):
            t0[0] = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kw):
            dt = time.perf_counter() - t0[0]
            spent = (rows[-1]["elapsed_s"] if rows else 0.0) + dt
            acc = None
            if eval_every and state.global_step % eval_every == 0:     # grpo_lab's evaluation
                was = model.training
                acc = evaluate(HFPolicy(model, policy.tokenizer, policy.cfg), evals,
                               {"accuracy": 1.0}, a.max_new)["eval/accuracy"]
                model.train(was)
            rows.append({"step_s": dt, "elapsed_s": spent, "acc": acc})

    with tempfile.TemporaryDirectory() as d:
        cfg = GRPOConfig(output_dir=d, per_device_train_batch_size=a.B * a.G,
                         num_generations=a.G, max_completion_length=a.max_new, temperature=0.7,
                         learning_rate=a.lr if lr is None else lr,
                         lr_scheduler_type=lr_schedule, warmup_steps=0,
                         beta=beta, max_steps=a.steps, logging_steps=10 ** 6, save_strategy="no",
                         report_to="none", use_cpu=True, seed=seed, top_k=0,
                         dataloader_num_workers=0)
        trainer = GRPOTrainer(model=policy.model, reward_funcs=reward, args=cfg,
                              train_dataset=data, processing_class=policy.tokenizer,
                              callbacks=[Clock()])
        if probe is not None:
            probe(trainer)
        trainer.train()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--max_new", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--accuracy_steps", type=int, default=0,
                    help="also train this many steps per side (beta 0) and report held-out "
                         "greedy accuracy over time (0: step times only)")
    ap.add_argument("--eval_every", type=int, default=25)
    ap.add_argument("--eval_size", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import transformers
    import trl

    print(f"data/hf_tiny, B={a.B} G={a.G} max_new={a.max_new} lr={a.lr} steps={a.steps}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, trl "
          f"{trl.__version__}, threads {a.threads}; median s per optimizer step after 3 warm-up")
    print("| beta | grpo_lab | TRL GRPOTrainer | TRL / grpo_lab |")
    print("|---|---|---|---|")
    med = lambda rows: statistics.median(r["step_s"] for r in rows[3:])   # noqa: E731
    for beta in (0.0, 0.02):
        ours, theirs = med(grpo_lab_steps(a, beta)), med(trl_steps(a, beta))
        print(f"| {beta} | {ours:.4f} | {theirs:.4f} | {theirs / ours:.2f} |", flush=True)
    if not a.accuracy_steps:
        return
    a.steps = a.accuracy_steps
    runs = {f"grpo_lab lr {a.lr:g}": grpo_lab_steps(a, 0.0, a.eval_every),
            f"TRL lr {a.lr:g}": trl_steps(a, 0.0, a.eval_every),
            "TRL lr 1e-06 (its default)": trl_steps(a, 0.0, a.eval_every, lr=1e-6)}
    print(f"\nheld-out greedy accuracy on {a.eval_size} addition prompts, beta 0, every "
          f"{a.eval_every} steps (training time, evaluation excluded; base 64.5%)")
    print("| run | " + " | ".join(f"step {r * a.eval_every}" for r in
                                   range(1, a.accuracy_steps // a.eval_every + 1)) + " | best |")
    print("|---|" + "---|" * (a.accuracy_steps // a.eval_every + 1))
    for name, rows in runs.items():
        pts = [(r["acc"], r["elapsed_s"]) for r in rows if r["acc"] is not None]
        print(f"| {name} | " + " | ".join(f"{acc:.1%} ({t:.0f} s)" for acc, t in pts)
              + f" | {max(p[0] for p in pts):.1%} |", flush=True)


if __name__ == "__main__":
    main()
