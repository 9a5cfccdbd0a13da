"""GRPO vs PPO with a learned critic on 2-digit addition: memory, time per step, samples to a
target held-out accuracy (claims 10 and 21 of data/claims.md, issue 14).

Every variant trains data/base_policy.safetensors with the tiny_cpu preset's defaults (lr 1e-4,
cosine over ``--steps``, beta 0.02, temperature 0.7, eps 0.2/0.28) and 128 completions per step;
only the objective, the batch shape and the critic differ:

    grpo              16 prompts x G=8, group-mean baseline (no critic)
    ppo 128x1         128 prompts x 1 completion, GAE from a value head on the policy's body
    ppo 16x8          16 prompts x 8 completions, the same critic (GRPO's batch, PPO's baseline)
    ppo net 128x1     128 x 1, a critic network of its own (a second GPT + head, the RLHF setup)

What is measured, and how:

  (a) memory, counted from tensors, not estimated: bytes of the trainable parameters (unique
      storages: tied weights once), of their gradients, of the AdamW state (read from the
      run's checkpoint, which holds the optimizer's own state tensors), of the frozen
      reference policy; bytes saved for backward by one training forward, summed over unique
      storages seen by ``torch.autograd.graph.saved_tensors_hooks`` (parameters excluded; the
      largest step of a short run); and the peak RSS (``ru_maxrss``) of a fresh Python process
      that imports, loads and trains ``--rss_steps`` steps, with its RSS before training.
  (b) time per step: every variant trains ``--time_steps`` steps in this one process, in
      ``--time_rounds`` rounds that rotate the order (interleaved); the median of the trainer's
      ``time/step_s`` (first 2 steps of each round dropped) and its ratio to GRPO's.
  (c) learning: ``--seeds`` seeds per variant through ``experiments.run_experiment`` (2 forked
      processes, 1 thread each); held-out greedy accuracy (200 prompts) every ``--eval_every``
      steps; samples (completions sampled, 128 a step) and wall seconds to ``--target``; final
      accuracy; mean and 95% t-interval over seeds (``mean_ci``), and the paired per-seed ratio
      of samples to target. First, a short tuning of the critic's learning rate (``vf_lr``) on
      ``--tune_seeds`` with PPO 128x1: every value tried is reported; the best by mean final
      accuracy is then used by every PPO variant.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_grpo_vs_ppo.py
        # writes bench/RESULTS_grpo_vs_ppo.md and bench/RESULTS_grpo_vs_ppo.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from grpo_lab.training import step as step_mod
from grpo_lab.checkpoint import read_training_checkpoint
from grpo_lab.teaching.claims_stats import ratio_interval
from grpo_lab.training.config import preset
from grpo_lab.training.experiments import mean_ci, run_experiment, time_to_target
from grpo_lab.policies.policy import load_for
from grpo_lab.training.trainer import train

PPO = {"objective": "ppo"}
VARIANTS = {  # name -> TrainConfig overrides (128 completions per step each)
    "grpo 16x8": {},
    "ppo 128x1": {**PPO, "prompts_per_step": 128, "group_size": 1},
    "ppo 16x8": {**PPO},
    "ppo net 128x1": {**PPO, "prompts_per_step": 128, "group_size": 1,
                      "ppo": {"critic": "network"}},
}
REFERENCE = "grpo 16x8"
TUNED = "ppo 128x1"                     # the variant the critic's lr is tuned on


def with_vf_lr(overrides: dict, vf_lr: float) -> dict:
    """A variant's overrides with the critic's learning rate set (``ppo.vf_lr``)."""
    return {**overrides, "ppo": {**overrides.get("ppo", {}), "vf_lr": vf_lr}}


def samples_per_step(overrides: dict) -> int:
    c = preset("defaults", **overrides)
    return c.prompts_per_step * c.group_size


# ---- (a) memory

def unique_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a tied or viewed tensor once)."""
    seen = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


class SavedForBackward:
    """Register beside each objective a sibling "<name>_measured" (step.register_objective, as
    a plugin would: nothing of the trainer is patched) whose training forward runs under
    saved_tensors_hooks; keep the largest per-call total of distinct non-parameter storages
    saved for backward. ``measured(name)`` is the sibling's name."""

    def __init__(self):
        self.peak, self.params, self.added = 0, set(), []

    @staticmethod
    def measured(name: str) -> str:
        return f"{name}_measured"

    def __enter__(self):
        for name, obj in list(step_mod.OBJECTIVES.items()):
            same = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
                    if f.name not in ("name", "collect", "loss")}
            step_mod.register_objective(self.measured(name), obj.collect, self._wrap(obj.loss),
                                        **same)
            self.added.append(self.measured(name))
        return self

    def __exit__(self, *exc):
        for name in self.added:
            step_mod.OBJECTIVES.pop(name, None)

    def _wrap(self, objective):
        def measured(policy, batch, cfg, world=1):
            self.params = {p.untyped_storage().data_ptr() for p in policy.parameters()}
            seen = {}

            def pack(t):
                s = t.untyped_storage()
                if s.data_ptr() not in self.params:
                    seen[s.data_ptr()] = s.nbytes()
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = objective(policy, batch, cfg, world)
            self.peak = max(self.peak, sum(seen.values()))
            return out
        return measured


def memory_row(name: str, overrides: dict, steps: int) -> dict:
    """Train ``steps`` steps (no evaluation) -> bytes of parameters, gradients, AdamW state,
    reference and saved activations, each counted from the tensors."""
    held = {}
    with tempfile.TemporaryDirectory() as tmp, SavedForBackward() as saved:
        cfg = preset("defaults", **{**overrides, "steps": steps, "eval_size": 0, "threads": 1,
                                    "time_budget_s": 0.0, "out_dir": tmp,
                                    "objective": saved.measured(overrides.get("objective",
                                                                              "grpo"))})
        train(cfg, progress=False, on_step=lambda m, p: held.update(policy=p))
        optim = read_training_checkpoint(Path(tmp) / "checkpoint.safetensors")["optim"]
    params = [p for p in held["policy"].parameters()]
    ref = [p for p in load_for(cfg).parameters()] if cfg.kl.beta else []
    critic = held["policy"].value_head if hasattr(held["policy"], "value_head") else None
    return {"variant": name,
            "params": unique_bytes(params),
            "critic_params": unique_bytes(critic.parameters()) if critic is not None else 0,
            "grads": unique_bytes([p.grad for p in params if p.grad is not None]),
            "adam_state": unique_bytes([v for st in optim["state"].values() for v in st.values()
                                        if torch.is_tensor(v) and v.dim() > 0]),
            "reference": unique_bytes(ref),
            "saved_activations": saved.peak}


RSS_CHILD = """
import json, sys, tempfile
from pathlib import Path
from grpo_lab.training.config import preset
from grpo_lab.training.trainer import train

def hwm():   # this process image's peak RSS in KiB (ru_maxrss would carry the parent's over exec)
    line = [x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM")]
    return int(line[0].split()[1])

overrides, steps = json.loads(sys.argv[1]), int(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp:
    cfg = preset("defaults", **{**overrides, "steps": steps, "eval_size": 0, "threads": 1,
                                "time_budget_s": 0.0, "out_dir": tmp})
    before = hwm()
    train(cfg, progress=False)
print(json.dumps([before, hwm()]))
"""


def peak_rss(overrides: dict, steps: int) -> tuple[int, int]:
    """A fresh process imports, builds the config, trains -> its peak RSS (VmHWM of
    /proc/self/status, Linux) before training and at the end, in bytes."""
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, json.dumps(overrides), str(steps)],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    return before * 1024, after * 1024


# ---- (b) time per step, interleaved

def step_times(variants: dict, steps: int, rounds: int) -> dict:
    """name -> per-step seconds over ``rounds`` interleaved rounds (first 2 steps dropped)."""
    times = {n: [] for n in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:      # rotate the order
            with tempfile.TemporaryDirectory() as tmp:
                cfg = preset("defaults", **{**variants[name], "steps": steps, "eval_size": 0,
                                            "threads": 1, "time_budget_s": 0.0,
                                            "out_dir": tmp, "seed": 100 + r})
                h = train(cfg, progress=False)
            times[name] += [x["time/step_s"] for x in h if x["step"] >= 2]
    return times


# ---- (c) learning

def curves(history: list[dict]) -> dict:
    ev = [h for h in history if "eval/accuracy" in h]
    steps = [h for h in history if h["step"] >= 0]
    return {"eval_step": [h["step"] + 1 for h in ev],
            "eval_accuracy": [h["eval/accuracy"] for h in ev],
            "eval_elapsed_s": [h.get("time/elapsed_s", 0.0) for h in ev],
            "reward_mean": [round(h["reward/mean"], 4) for h in steps],
            "explained_variance": [round(h["ppo/explained_variance"], 4) for h in steps
                                   if "ppo/explained_variance" in h]}


def per_run(res, strategies: dict, target: float) -> list[dict]:
    """One row per (strategy, seed): final and best accuracy, steps, samples and seconds to
    ``target``, and the curves notebook 07 plots."""
    rows = []
    for run in res.runs:
        h, n = run["history"], samples_per_step(strategies[run["strategy"]])
        s, sec = time_to_target(h, target)
        ev = [x["eval/accuracy"] for x in h if "eval/accuracy" in x]
        rows.append({"variant": run["strategy"], "seed": run["seed"], "final_accuracy": ev[-1],
                     "best_accuracy": max(ev), "steps_to_target": s,
                     "samples_to_target": None if s is None else s * n,
                     "seconds_to_target": sec, "wall_s": h[-1]["time/elapsed_s"],
                     **curves(h)})
    return rows


def ci_text(values, fmt: str = ".3f", of: int | None = None) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "never"
    m, lo, hi = mean_ci(vals)
    text = format(m, fmt) + ("" if len(vals) < 2 else f" [{lo:{fmt}}, {hi:{fmt}}]")
    return text + (f" ({len(vals)}/{of} reached)" if of and len(vals) < of else "")


def paired_ratios(rows: list[dict], a: str, b: str, key: str) -> list[float]:
    """Per seed: b's value / a's value (both must be set)."""
    by = {(r["variant"], r["seed"]): r[key] for r in rows}
    return [by[b, s] / by[a, s] for (v, s) in by if v == a and by.get((b, s)) and by[a, s]]


def verdict(lo: float, hi: float, claimed_lo: float, claimed_hi: float, none: float) -> str:
    """A claimed value or range against a measured 95% interval; ``none``: the value that
    means no difference."""
    if hi < claimed_lo or lo > claimed_hi:
        return "does not hold (the interval excludes the claim)"
    if claimed_lo <= lo and hi <= claimed_hi:
        return "holds"
    if lo <= none <= hi:
        return "not shown (the interval holds the claim and no difference alike)"
    return "not settled (the interval overlaps the claim but is wider)"


def claim_lines(rows: list[dict], target: float, ppo: str) -> list[str]:
    """The two quotable verdict lines, from paired per-seed ratios (PPO / GRPO)."""
    samples = paired_ratios(rows, REFERENCE, ppo, "samples_to_target")        # PPO / GRPO
    seconds = paired_ratios(rows, REFERENCE, ppo, "seconds_to_target")
    if len(samples) < 2:
        return [f"- Claims 10 and 21: fewer than 2 seeds where both reached {target:.0%}: "
                f"no interval, no verdict."]
    rs, rt = ratio_interval(samples), ratio_interval(seconds)                  # one scale for both
    n = (f"{len(samples)} paired seeds, {target:.0%} held-out target, {REFERENCE} vs {ppo}; "
         f"geometric mean [95% t-interval of the log-ratio]")
    s = f"{rs['mean']:.2f}x [{rs['low']:.2f}, {rs['high']:.2f}]"
    return [
        f"- **Claim 10** (group sampling cuts samples 50-70% vs PPO, i.e. PPO needs 2.0-3.3x "
        f"GRPO's samples): PPO's samples to the target / GRPO's {s} ({n}): "
        f"{verdict(rs['low'], rs['high'], 1 / 0.5, 1 / 0.3, 1.0)}.",
        f"- **Claim 21** (GRPO vs PPO: convergence +40%, sample efficiency 2.3x): sample "
        f"efficiency on the same scale {s}: {verdict(rs['low'], rs['high'], 2.3, 2.3, 1.0)}; "
        f"PPO's wall time to the target / GRPO's {rt['mean']:.2f}x [{rt['low']:.2f}, "
        f"{rt['high']:.2f}] (claim 1.4x): {verdict(rt['low'], rt['high'], 1.4, 1.4, 1.0)} ({n})."]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval_every", type=int, default=25)
    ap.add_argument("--target", type=float, default=0.75)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tune_seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--vf_lrs", type=float, nargs="+", default=[0.0, 1e-3, 3e-3, 1e-2])
    ap.add_argument("--also_vf_lrs", type=float, nargs="*", default=[3e-3],
                    help="also train PPO 128x1 over the seeds with these critic lrs")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--mem_steps", type=int, default=4)
    ap.add_argument("--rss_steps", type=int, default=20)
    ap.add_argument("--time_steps", type=int, default=12)
    ap.add_argument("--time_rounds", type=int, default=5)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS),
                    help="variants measured for memory and time")
    ap.add_argument("--learn_variants", nargs="+", default=list(VARIANTS)[:3],
                    help="variants trained over seeds (the critic network: memory and time only "
                         "by default, it is the slowest)")
    ap.add_argument("--out", default="bench/RESULTS_grpo_vs_ppo.md")
    ap.add_argument("--from_json", help="only re-render --out from this saved JSON")
    args = ap.parse_args(argv)
    if args.from_json:
        Path(args.out).write_text(write_report(json.loads(Path(args.from_json).read_text())))
        return
    torch.set_num_threads(1)
    variants = {n: VARIANTS[n] for n in args.variants}
    load0, t_start = os.getloadavg()[0], time.time()
    base = {"steps": args.steps, "eval_every": args.eval_every}

    # (c, first) tune the critic's lr on PPO 128x1
    trials = {f"vf_lr={v:g}": with_vf_lr(VARIANTS[TUNED], v) for v in args.vf_lrs}
    tune = run_experiment(trials, seeds=tuple(args.tune_seeds), base=base,
                          processes=args.processes, target=args.target, progress=False)
    tune_rows = per_run(tune, trials, args.target)
    mean_final = {k: statistics.mean(r["final_accuracy"] for r in tune_rows if r["variant"] == k)
                  for k in dict.fromkeys(r["variant"] for r in tune_rows)}
    best = max(mean_final, key=mean_final.get)
    vf_lr = float(best.split("=")[1])
    print("tuning:", mean_final, "->", best, flush=True)
    tuned = {n: (with_vf_lr(o, vf_lr) if o.get("objective") == "ppo" else o)
             for n, o in variants.items()}

    # (c) the comparison over seeds
    learn = {**{n: tuned[n] for n in args.learn_variants},          # + other critic lrs, to
             **{f"{TUNED} vf_lr={v:g}": with_vf_lr(VARIANTS[TUNED], v)   # see what the choice
                for v in args.also_vf_lrs if v != vf_lr}}                # of vf_lr moves
    res = run_experiment(learn, seeds=tuple(args.seeds), base=base, processes=args.processes,
                         target=args.target, progress=False)
    rows = per_run(res, learn, args.target)
    print("learning done", flush=True)

    # (a) memory and (b) time, in this process (and fresh children for RSS)
    mem = [memory_row(n, o, args.mem_steps) for n, o in tuned.items()]
    for m in mem:
        m["rss_before"], m["rss_peak"] = peak_rss(tuned[m["variant"]], args.rss_steps)
    times = step_times(tuned, args.time_steps, args.time_rounds)
    data = {"argv": sys.argv[1:], "args": vars(args), "when": time.strftime(
                "%Y-%m-%d %H:%M UTC", time.gmtime()), "versions": versions(),
            "load": [load0, os.getloadavg()[0]], "wall_s": time.time() - t_start,
            "vf_lr": vf_lr, "variants": {**tuned, **learn}, "learned": list(learn),
            "tuning": tune_rows, "runs": rows,
            "memory": mem, "step_times_s": times}
    Path(args.out).with_suffix(".json").write_text(json.dumps(data, indent=1))
    Path(args.out).write_text(write_report(data))
    print(Path(args.out).read_text())


def versions() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def write_report(d: dict) -> str:
    """The RESULTS markdown from the bench's JSON (``--from_json`` re-renders a saved run)."""
    a, times = d["args"], d["step_times_s"]
    ref_t = statistics.median(times[REFERENCE])
    n_seeds = len(a["seeds"])
    L = [f"# GRPO vs PPO with a critic (issue 14): {d['when']}",
         "",
         "```bash", "PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_grpo_vs_ppo.py "
         + shlex.join(d["argv"]), "```", "",
         f"Machine: {d['versions']}. Load average (1 min) {d['load'][0]:.1f} before, "
         f"{d['load'][1]:.1f} after (shared machine). Wall time {d['wall_s'] / 60:.1f} min.",
         f"Task addition, base data/base_policy.safetensors, tiny_cpu defaults, {a['steps']} steps "
         f"(cosine over them), 128 completions per step in every variant, held-out greedy "
         f"accuracy on 200 prompts every {a['eval_every']} steps, target {a['target']:.0%}.",
         *([f"Note: {d['note']}."] if d.get("note") else []), ""]
    L += ["## Tuning the critic's learning rate (PPO 128x1, seeds "
          f"{' '.join(map(str, a['tune_seeds']))})", "",
          "| vf_lr | final accuracy | best accuracy | steps to target | explained variance, "
          "mean of the last 100 steps |", "|---|---|---|---|---|"]
    for k in dict.fromkeys(r["variant"] for r in d["tuning"]):
        rs = [r for r in d["tuning"] if r["variant"] == k]
        v, ev = k.split("=")[1], [statistics.mean(r["explained_variance"][-100:]) for r in rs]
        L.append(f"| {v + ' (= lr)' if v == '0' else v} | "
                 f"{statistics.mean(r['final_accuracy'] for r in rs):.3f} | "
                 f"{statistics.mean(r['best_accuracy'] for r in rs):.3f} | "
                 f"{', '.join(str(r['steps_to_target']) for r in rs)} | "
                 f"{statistics.mean(ev):.3f} |")
    L += ["", f"Chosen: vf_lr = {d['vf_lr']:g} (best mean final accuracy), used by every PPO "
          "variant below.", ""]
    rows, mem = d["runs"], d["memory"]
    L += [f"## Learning over {n_seeds} seeds (mean [95% interval])", "",
          "| variant | final accuracy | samples to target | steps to target | "
          "wall s to target | run wall s |", "|---|---|---|---|---|---|"]
    for n in d["learned"]:
        rs = [r for r in rows if r["variant"] == n]
        L.append(f"| {n} | {ci_text([r['final_accuracy'] for r in rs])} | "
                 f"{ci_text([r['samples_to_target'] for r in rs], '.0f', n_seeds)} | "
                 f"{ci_text([r['steps_to_target'] for r in rs], '.0f', n_seeds)} | "
                 f"{ci_text([r['seconds_to_target'] for r in rs], '.1f', n_seeds)} | "
                 f"{ci_text([r['wall_s'] for r in rs], '.1f')} |")
    L += ["", "Per seed (samples to target, final accuracy):", ""]
    for n in d["learned"]:
        rs = [r for r in rows if r["variant"] == n]
        L.append(f"- {n}: " + "; ".join(f"seed {r['seed']}: {r['samples_to_target']}, "
                                         f"{r['final_accuracy']:.3f}" for r in rs))
    L += ["", "Paired by seed, PPO samples to target / GRPO's (> 1: GRPO needs fewer; geometric "
          "mean [95% t-interval of the log-ratio], the scale of the claim lines below):", ""]
    for n in d["learned"]:
        if n != REFERENCE:
            rat = paired_ratios(rows, REFERENCE, n, "samples_to_target")
            r = ratio_interval(rat) if len(rat) > 1 else None
            text = f"{r['mean']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" if r else ci_text(rat, ".2f")
            L.append(f"- {n}: {text} over {len(rat)} seed(s) where both reached")
    L += ["", "## Claims 10 and 21, measured", "", *claim_lines(rows, a["target"], TUNED)]
    L += ["", "## Memory, counted from tensors (bytes)", "",
          f"Method: after {a['mem_steps']} training steps (no evaluation), the bytes of the "
          "distinct storages of the trainable parameters (tied weights once), their gradients, "
          "the AdamW state tensors (from the run's checkpoint) and the frozen reference policy; "
          "'saved for backward' sums the distinct non-parameter storages that "
          "torch.autograd.graph.saved_tensors_hooks saw during one training forward (the largest "
          "step). RSS: VmHWM (/proc/self/status) of a fresh Python process that imports, builds "
          f"the config and trains {a['rss_steps']} steps, read before training and at the end; "
          "most of it is torch itself.", "",
          "| variant | trainable params (critic) | grads | AdamW state | frozen reference | "
          "saved for backward (peak step) | sum | RSS before -> peak, fresh process |",
          "|---|---|---|---|---|---|---|---|"]
    for m in mem:
        total = m["params"] + m["grads"] + m["adam_state"] + m["reference"] + m["saved_activations"]
        L.append(f"| {m['variant']} | {m['params']:,} ({m['critic_params']:,}) | {m['grads']:,} | "
                 f"{m['adam_state']:,} | {m['reference']:,} | {m['saved_activations']:,} | "
                 f"{total:,} | {m['rss_before'] / 2**20:.0f} -> {m['rss_peak'] / 2**20:.0f} MiB |")
    L += ["", f"## Time per step, interleaved ({a['time_rounds']} rounds x {a['time_steps']} "
          "steps, medians)", "", "| variant | median s/step | ratio to GRPO |", "|---|---|---|"]
    for n, t in times.items():
        L.append(f"| {n} | {statistics.median(t):.4f} | {statistics.median(t) / ref_t:.2f}x |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
