"""GRPO against a learned reward model: the proxy rises, the true reward does not (issue 14).

A small reward model (grpo_lab/training/reward_model.py) is trained once, in seconds, on the base
policy's own addition samples labelled by the verifiable accuracy reward. GRPO then trains the
base policy through the one trainer (``experiments.run_experiment`` -> ``trainer.train``)
against it, in four variants, each over several seeds:

  * learned:             reward_weights {"learned": 1, "accuracy": 0}   (weight 0: logged only)
  * learned, beta 0.2:   the same with a 10x larger KL penalty to the base policy
  * 0.5 learned + acc.:  the verifiable reward mixed back in
  * accuracy (control):  the verifiable reward alone, the learned one logged only

Logged per step: reward/learned (what the policy optimises) and reward/accuracy (the true
reward of the same training samples); every ``eval_every`` steps the held-out greedy
eval/accuracy. Gao, Schulman & Hilton 2022 ("Scaling laws for reward model overoptimization")
is the reference: the proxy keeps rising while the gold reward falls.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_reward_hacking.py
        # writes bench/RESULTS_reward_hacking.{md,json} and bench/reward_hacking.png
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from grpo_lab.policies.policy import load_policy_any
from grpo_lab.training.config import preset
from grpo_lab.training.experiments import difference_sentence, mean_ci, run_experiment
from grpo_lab.training.reward_model import (default_data, default_reward_model, plot_reward_hacking,
                                            use_reward_model)
from grpo_lab.algorithm.rollout import sample_and_score
from grpo_lab.tasks.rewards import resolve_rewards
from grpo_lab.tasks.task_data import load_eval
from grpo_lab.training.trainer import train

LEARNED_ONLY = {"learned": 1.0, "accuracy": 0.0}
VARIANTS = {  # name -> TrainConfig overrides
    "learned": {"reward_weights": LEARNED_ONLY},
    "learned, beta 0.2": {"reward_weights": LEARNED_ONLY, "kl": {"beta": 0.2}},
    "0.5 learned + accuracy": {"reward_weights": {"learned": 0.5, "accuracy": 1.0}},
    "accuracy (control)": {"reward_weights": {"accuracy": 1.0, "learned": 0.0}},
}
WINDOW = 25                     # steps averaged for the "first" and "last" training rewards


def curves(res, variant: str) -> dict:
    """Per-seed curves of one variant, rounded for a small JSON file."""
    runs = [r for r in res.runs if r["strategy"] == variant]
    steps = [h for h in runs[0]["history"] if h["step"] >= 0]
    evals = [h["step"] for h in runs[0]["history"] if "eval/accuracy" in h]

    def series(key, rows):
        return [[round(h[key], 4) for h in rows(r)] for r in runs]
    train_rows = lambda r: [h for h in r["history"] if h["step"] >= 0]          # noqa: E731
    eval_rows = lambda r: [h for h in r["history"] if "eval/accuracy" in h]     # noqa: E731
    w = VARIANTS[variant]["reward_weights"]
    out = {"overrides": VARIANTS[variant], "seeds": [r["seed"] for r in runs],
           "steps": [h["step"] for h in steps], "learned": series("reward/learned", train_rows),
           "train_accuracy": series("reward/accuracy", train_rows),
           "kl": series("loss/kl", train_rows), "eval_steps": evals,
           "eval_accuracy": series("eval/accuracy", eval_rows), "eval_learned": None}
    if w["learned"]:   # eval/reward = w_l * learned + w_a * accuracy on the same greedy samples
        out["eval_learned"] = [[round((h["eval/reward"] - w["accuracy"] * h["eval/accuracy"])
                                      / w["learned"], 4) for h in eval_rows(r)] for r in runs]
    return out


def greedy_completions(policy, n: int = 200) -> dict:
    """The policy's greedy answers to the first n held-out prompts: accuracy, learned reward,
    the most common answers and the share of the most common last digit (about 0.1 for
    correct sums)."""
    exs = load_eval("addition")[:n]
    s = sample_and_score(policy, exs, 1, 5, resolve_rewards(LEARNED_ONLY), greedy=True)
    last = Counter(t[-1:] for t in s.texts).most_common(1)[0]
    return {"accuracy": float(s.parts["accuracy"].mean()),
            "learned": round(float(s.parts["learned"].mean()), 4),
            "most_common": Counter(s.texts).most_common(8),
            "last_digit": [last[0], last[1] / n],
            "examples": [[e.prompt, t] for e, t in zip(exs[:8], s.texts)]}


def probe(model) -> dict:
    """What the reward model rewards: on its training data (the base policy's samples,
    ``default_data``), per last digit: rows, true accuracy, mean learned score; on the held-out
    prompts: the mean score of the correct answer, of the correct answer with its last digit
    made 7, and of "157" for every prompt."""
    exs, d = load_eval("addition"), default_data()
    sc = model.score(d.completions, d.examples, d.stopped)                 # (N,)
    by_digit = {}
    for digit in "0123456789":
        rows = [i for i, c in enumerate(d.completions) if c[-1:] == digit]
        by_digit[digit] = [len(rows), round(float(d.labels[rows].mean()), 3),
                           round(float(sc[rows].mean()), 3)]
    ok = [True] * len(exs)
    held = {name: round(float(model.score(comps, exs, ok).mean()), 3) for name, comps in
            (("correct", [e.answer for e in exs]),
             ("correct, last digit 7", [e.answer[:-1] + "7" for e in exs]),
             ("'157' for every prompt", ["157"] * len(exs)))}
    return {"by_last_digit": by_digit, "held_out": held}


def hacked(base: dict) -> dict:
    """Seed 0 of "learned" once more, here, to look at what the policy learned to write."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = preset("defaults", **base, **VARIANTS["learned"], seed=0, threads=1,
                     time_budget_s=0.0, out_dir=tmp)
        train(cfg, progress=False)
        after = load_policy_any(Path(tmp) / "checkpoint.safetensors").eval()
    return {"base policy": greedy_completions(load_policy_any(cfg.base_checkpoint).eval()),
            "after GRPO on learned (seed 0)": greedy_completions(after)}


def ci(values, fmt="+.3f") -> str:
    m, lo, hi = mean_ci(values)
    return f"{m:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def summary(name: str, c: dict) -> str:
    first = [sum(x[:WINDOW]) / WINDOW for x in c["learned"]]
    last = [sum(x[-WINDOW:]) / WINDOW for x in c["learned"]]
    tfirst = [sum(x[:WINDOW]) / WINDOW for x in c["train_accuracy"]]
    tlast = [sum(x[-WINDOW:]) / WINDOW for x in c["train_accuracy"]]
    acc0 = [x[0] for x in c["eval_accuracy"]]
    acc1 = [x[-1] for x in c["eval_accuracy"]]
    best = [max(x) for x in c["eval_accuracy"]]
    kl = [sum(x[-WINDOW:]) / WINDOW for x in c["kl"]]
    held = ("-" if c["eval_learned"] is None else
            ci([x[-1] - x[0] for x in c["eval_learned"]]))
    return (f"| {name} | {ci(last, '.3f')} | {ci([b - a for a, b in zip(first, last)])} | {held} "
            f"| {ci([b - a for a, b in zip(tfirst, tlast)])} | {ci(acc1, '.3f')} "
            f"| {ci([b - a for a, b in zip(acc0, acc1)])} | {ci(best, '.3f')} | {ci(kl, '.2f')} |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", default="bench/RESULTS_reward_hacking")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    rm, log = default_reward_model()
    use_reward_model(rm)                          # forked workers inherit it
    t_rm = time.time() - t0
    base = {"task": "addition", "steps": args.steps, "eval_every": 25, "eval_size": 200}
    res = run_experiment(VARIANTS, seeds=tuple(args.seeds), base=base,
                         processes=args.processes)
    looks, probed = hacked(base), probe(rm)
    cmd = shlex.join(["bench/bench_reward_hacking.py", *(argv or sys.argv[1:])])
    data = {"meta": {"command": "PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python " + cmd,
                     "base": base, "torch": torch.__version__,
                     "reward_model": {k: v for k, v in log.items() if k != "train_loss"},
                     "seconds": round(time.time() - t0, 1), "rm_seconds": round(t_rm, 1),
                     "greedy_completions": looks, "probe": probed},
            "variants": {v: curves(res, v) for v in VARIANTS}}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(data, separators=(",", ":")) + "\n")
    plot_reward_hacking(data).savefig(out.parent / "reward_hacking.png", dpi=110)
    rm_line = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in data["meta"]["reward_model"].items())
    lines = [
        "# GRPO against a learned reward model (reward hacking)", "",
        f"`{data['meta']['command']}`", "",
        f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} CPUs (shared), "
        f"one thread per run, {args.processes} runs in parallel; {data['meta']['seconds']:.0f} s "
        f"in all. Base: data/base_policy.safetensors on addition, {args.steps} GRPO steps "
        f"(tiny_cpu preset: 16 prompts x 8, lr 1e-4 cosine, beta 0.02 unless set), seeds "
        f"{args.seeds}; held-out greedy accuracy on 200 prompts every 25 steps.", "",
        f"Reward model (trained once, {t_rm:.0f} s, the same for every run): {rm_line}.", "",
        f"Mean [95% t-interval] over {len(args.seeds)} seeds. 'learned' = reward/learned of the "
        f"training samples (temperature 0.7), mean of the last {WINDOW} steps, and its change "
        f"from the first {WINDOW}; 'held-out learned' = the learned reward of the held-out "
        f"greedy completions, last minus first evaluation; 'true (train)' the same change of "
        f"reward/accuracy; 'held-out acc.' at the end, its change from the base, and its best "
        f"evaluation; KL = loss/kl, last {WINDOW} steps.", "",
        "| variant | learned | learned change | held-out learned change | true (train) change "
        "| held-out acc. | held-out acc. change | best held-out acc. | KL |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(summary(v, c) for v, c in data["variants"].items()), "",
        "Paired by seed, final held-out accuracy:", "",
        *(f"- {difference_sentence(res.compare(a, 'learned'))}"
          for a in VARIANTS if a != "learned"), "",
        "What the policy learned to write (greedy, first 200 held-out prompts; seed 0 of "
        "'learned' trained again in this process; its held-out accuracy "
        + ("equals that run's final eval/accuracy: the same run"
           if abs(looks["after GRPO on learned (seed 0)"]["accuracy"]
                  - data["variants"]["learned"]["eval_accuracy"][0][-1]) < 1e-4 else
           "DIFFERS from that run's final eval/accuracy: not reproducible") + "):", "",
        *(f"- {who}: accuracy {g['accuracy']:.3f}, learned reward {g['learned']:.3f}, most "
          f"common last digit {g['last_digit'][0]!r} in {g['last_digit'][1]:.0%} of answers; "
          f"most common answers {g['most_common'][:6]}; e.g. "
          + ", ".join(f"{p}{t}" for p, t in g["examples"]) for who, g in looks.items()), "",
        "What the reward model rewards. On its training data (the base policy's samples), "
        "by the answer's last digit: rows, true accuracy, mean learned score:", "",
        "| last digit | " + " | ".join(probed["by_last_digit"]) + " |",
        "|---" + "|---:" * 10 + "|",
        *("| " + row + " | " + " | ".join(fmt(v[j]) for v in probed["by_last_digit"].values())
          + " |" for j, row, fmt in ((0, "rows", str), (1, "accuracy", "{:.3f}".format),
                                     (2, "learned", "{:.3f}".format))),
        "", "On the 200 held-out prompts, mean learned score of: "
        + "; ".join(f"{k} {v:.3f}" for k, v in probed["held_out"].items()) + ".", "",
        "Curves: bench/reward_hacking.png; per-step data: bench/RESULTS_reward_hacking.json "
        "(`reward_model.plot_reward_hacking(json.load(...))` redraws the figure).", ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
