"""Time to a held-out target: grpo_lab's train() vs TRL's GRPOTrainer on SmolLM2-135M-Instruct
(CPU), each side at the best learning rate of a small sweep, seeds interleaved.

The task is the smollm_cpu preset's: 2-digit addition asked in words (its answer_format
"boxed" and system_prompt, the chat template), reward accuracy + 0.25 x format (the preset's
weights, read by grpo_lab's answer reader on both sides; TRL's reward function gets each
completion's ids, so "stopped" is its last token being an end-of-sequence id), B=4 prompts x
G=8 completions of at most 24 tokens at temperature 0.8, beta 0, one update per rollout. The
held-out set: the first 50 of data/eval_addition.jsonl, greedy, grpo_lab's ``evaluate`` on
both sides, every ``--eval_every`` steps; a run stops at the first evaluation at or above
``--target`` (or at ``--cap`` steps).

  * grpo_lab: the preset's optimisation (2 warm-up steps, then constant lr; AdamW, grad clip
    1, eps 0.2 / 0.28, per-sequence token mean), lr from ``--lrs_grpo_lab``.
  * TRL 1.16: its own loss and schedule (loss_type "dapo", eps 0.2, linear decay to 0 at the
    cap, no warm-up), lr from ``--lrs_trl``, float32 (``bf16=False``: GRPOConfig turns bf16
    on by default, bench_agents_trl.py) and activation checkpointing off (grpo_lab does not
    checkpoint here; on the CPU it only costs time). ``--trl_matched``: grpo_lab's loss and
    schedule instead (bench_hf_trl.py's "same lr and schedule" settings, constant lr).
  * ``--grpo_lab_set``: TrainConfig fields (JSON) for grpo_lab's side on top of the preset's
    (another optimisation; TRL's records are reused, its side unchanged).
  * ``--bf16``: each side's bf16 path instead of float32, for a CPU with native bf16 (AVX-512
    BF16, AMX): grpo_lab's bf16 sampling copy + autocast (what its speed probe chooses there),
    TRL's bf16=True (autocast). The records keep it, so float32 and bf16 runs never mix.

Phase 1 (sweep): each side at each of its lrs, seed ``--sweep_seed``, the two sides
alternating; a side's best lr is the one with the least training seconds to the target (none
reached: the highest held-out accuracy). Phase 2: every seed of ``--seeds`` at each side's
best lr, interleaved (seed s: grpo_lab then TRL for even s, TRL first for odd s); a run the
sweep already did (same side, lr and seed) is not run again, and the table says its lr was
chosen on it. Training seconds leave evaluation out (and, on grpo_lab's side, the checkpoint
its train() writes where it stops); both are reported. Wall seconds include loading the
model and, on grpo_lab's side only, train()'s evaluation of the base model. Each finished run
is one line of ``--results`` (JSON lines, appended): a rerun with the same settings skips the
runs it holds, so a session cut mid-way keeps what finished.

    # the full run (hours on a 2-core CPU: run it alone there, the seconds are wall-clock;
    # needs `grpo-lab model get smollm2-135m` once and a venv with grpo_lab's dependencies
    # and trl 1.16.0, transformers 5.24.0; a cut run is resumed by the same command):
    PYTHONPATH=$PWD python bench/bench_tta_smollm.py --threads 2 \\
        --results bench/RESULTS_tta_smollm.jsonl --out bench/RESULTS_tta_smollm.md
    # end to end on data/hf_tiny in about a minute (plumbing only, no meaning):
    PYTHONPATH=$PWD python bench/bench_tta_smollm.py --dry
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_hf_trl import grpo_lab_steps, reached, trl_steps  # noqa: E402
from bench_op_overhead import cpu_line, load_average  # noqa: E402
from grpo_lab.teaching.claims_stats import paired_ratio  # noqa: E402
from grpo_lab.training.config import preset  # noqa: E402
from grpo_lab.training.experiments import mean_ci  # noqa: E402

SIDES = ("grpo_lab", "TRL")
SETTINGS = {    # preset -> the bench's defaults; the task and reward come from the preset
    "smollm": dict(preset="smollm_cpu", model="smollm2-135m", lrs_grpo_lab="5e-6,1e-5,2e-5",
                   lrs_trl="1e-5,2e-5,4e-5", target=0.5, cap=120, eval_every=5, eval_size=50,
                   threads=2),
    "dry": dict(preset="hf_tiny_cpu", model="data/hf_tiny", lrs_grpo_lab="1e-4,3e-4",
                lrs_trl="1e-4,3e-4", target=0.6, cap=6, eval_every=2, eval_size=50, threads=1,
                B=4, G=4, max_new=6, temperature=0.7)}


def shared(a) -> dict:
    """What both sides take from the preset: sampling sizes, prompts, reward weights."""
    c = preset(a.preset)
    return dict(B=a.B or c.prompts_per_step, G=a.G or c.group_size,
                max_new=a.max_new or c.max_new_tokens, temperature=a.temperature or c.temperature,
                chat_template=c.hf.chat_template, fmt=c.answer_format,
                system_prompt=c.system_prompt, weights=dict(c.reward_weights))


def run_key(a, side: str, lr: float, seed: int) -> dict:
    """Everything a finished run depends on: a rerun skips a run whose key it holds."""
    s = shared(a)
    return {"side": side, "lr": lr, "seed": seed, "model": a.model, "preset": a.preset,
            "target": a.target, "cap": a.cap, "eval_every": a.eval_every,
            "eval_size": a.eval_size, "threads": a.threads, "B": s["B"], "G": s["G"],
            "max_new": s["max_new"], "temperature": s["temperature"],
            "trl_matched": a.trl_matched if side == "TRL" else None,
            "bf16": a.bf16 or None,                     # None: float32 (the older records)
            "grpo_lab_set": (a.grpo_lab_set or None) if side == "grpo_lab" else None}


# TrainConfig fields the bench sets on grpo_lab's side itself (both sides share them)
FIXED = ("base_checkpoint", "out_dir", "steps", "lr", "prompts_per_step", "group_size",
         "max_new_tokens", "temperature", "seed", "eval_size", "eval_every", "reward_weights",
         "time_budget_s", "ckpt_every", "threads", "target_accuracy", "kl")


def with_set(a, text: str | None) -> argparse.Namespace:
    """``a`` with grpo_lab's settings set to ``text`` (``--versus_set``'s side)."""
    return argparse.Namespace(**{**vars(a), "grpo_lab_set": text})


def grpo_lab_overrides(a, chat_template: bool, option: str = "--grpo_lab_set") -> dict:
    """``--bf16``'s hf block and ``--grpo_lab_set``'s fields for grpo_lab's side; an ``hf``
    block in ``--grpo_lab_set`` is merged over the bench's own (its chat template, the bf16
    path), a field the bench sets itself is refused by name (SystemExit, naming ``option``)."""
    text = a.grpo_lab_set
    try:
        extra = json.loads(text or "{}")
    except json.JSONDecodeError as e:
        raise SystemExit(f"{option} {text!r} is not JSON: {e}") from None
    if not isinstance(extra, dict) or not isinstance(extra.get("hf", {}), dict):
        raise SystemExit(f"{option} {text!r}: a JSON object of TrainConfig fields is needed "
                         "(an hf block an object too)")
    fixed = sorted(set(extra) & set(FIXED))
    if fixed:
        raise SystemExit(f"{option} sets {fixed}: the bench sets these on both sides "
                         "(its own options: --lrs_grpo_lab, --cap, --target, ...)")
    hf = {"autocast": a.bf16, "chat_template": chat_template}      # float32: as bench_hf_trl
    if a.bf16:
        hf["sample_dtype"] = "bfloat16"
    return {**extra, "hf": {**hf, **extra.get("hf", {})}}


def one_run(a, side: str, lr: float, seed: int) -> dict:
    """One run to the target or the cap -> its record: per step seconds (rollout, update),
    evaluations, and the steps and training seconds at the target (None: not reached)."""
    import torch

    s = shared(a)
    r = argparse.Namespace(model=a.model, lr=lr, B=s["B"], G=s["G"], max_new=s["max_new"],
                           temperature=s["temperature"], eval_size=a.eval_size,
                           threads=a.threads, device="cpu", chat_template=s["chat_template"])
    torch.set_num_threads(a.threads)
    load0, t0 = load_average(), time.perf_counter()
    if side == "grpo_lab":
        rows = grpo_lab_steps(r, 0.0, a.cap, seed, a.eval_every, a.preset,
                              reward_weights=s["weights"], target_accuracy=a.target,
                              **grpo_lab_overrides(a, s["chat_template"]))
    else:
        matched = dict(lr_scheduler_type="constant_with_warmup", warmup_steps=2,
                       loss_type="grpo", epsilon=0.2, epsilon_high=0.28)
        rows = trl_steps(r, 0.0, a.cap, seed, a.eval_every, shipped=True, fmt=s["fmt"],
                         system_prompt=s["system_prompt"], weights=s["weights"],
                         read_stop=True, target=a.target, learning_rate=lr, bf16=a.bf16,
                         gradient_checkpointing=False, **(matched if a.trl_matched else {}))
    hit = reached(rows, a.target)
    rollout = sum(x["rollout_s"] for x in rows)
    return {**run_key(a, side, lr, seed), "steps": len(rows),
            "steps_to_target": hit and hit[0], "train_s_to_target": hit and hit[1],
            "train_s": rows[-1]["elapsed_s"], "rollout_s": rollout,
            "update_s": rows[-1]["elapsed_s"] - rollout,
            "eval_s": sum(x.get("eval_s", 0.0) for x in rows),
            "evals": [[i + 1, x["acc"]] for i, x in enumerate(rows) if x["acc"] is not None],
            "wall_s": time.perf_counter() - t0, "load_start": load0[0],
            "load_end": load_average()[0], "finished": time.strftime("%Y-%m-%d %H:%M:%S")}


def done_runs(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def get_run(a, side: str, lr: float, seed: int) -> dict:
    """The run's record from ``a.results``, else run now and append it there."""
    key = run_key(a, side, lr, seed)
    for rec in done_runs(a.results):
        if {k: rec.get(k) for k in key} == key:
            return rec
    rec = one_run(a, side, lr, seed)
    with open(a.results, "a") as f:
        f.write(json.dumps(rec) + "\n")
    hit = (f"target at step {rec['steps_to_target']} ({rec['train_s_to_target']:.1f} s)"
           if rec["steps_to_target"] else f"target not reached in {rec['steps']} steps")
    print(f"{side} lr {lr:g} seed {seed}: {hit}, best {best_acc(rec):.0%}, "
          f"{rec['wall_s']:.0f} s wall", flush=True)
    return rec


def best_acc(rec: dict) -> float:
    return max((acc for _, acc in rec["evals"]), default=float("nan"))


def best_lr(recs: list[dict]) -> dict:
    """The sweep's best run: least training seconds to the target; none reached: the highest
    held-out accuracy."""
    hit = [r for r in recs if r["steps_to_target"]]
    return (min(hit, key=lambda r: r["train_s_to_target"]) if hit
            else max(recs, key=best_acc))


def ci(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    m, lo, hi = mean_ci(values)
    return f"{m:{fmt}}" + (f" [{lo:{fmt}}, {hi:{fmt}}]" if len(values) > 1 else "")


def sweep_table(a, sweep: dict) -> list[str]:
    out = [f"Phase 1, learning-rate sweep (seed {a.sweep_seed}; best = least training s to "
           f"{a.target:.0%}):", "",
           "| side | lr | steps to target | training s to target | best held-out acc | "
           "steps run | s/step (rollout + update) | evaluation s | wall s |",
           "|---|---|---|---|---|---|---|---|---|"]
    edges = []
    for side, recs in sweep.items():
        best = best_lr(recs)
        for r in recs:
            mark = " (best)" if r is best else ""
            out.append(f"| {side} | {r['lr']:g}{mark} | {r['steps_to_target'] or '-'} | "
                       f"{fmt_s(r['train_s_to_target'])} | {best_acc(r):.0%} | {r['steps']} | "
                       f"{per_step(r)} | {r['eval_s']:.1f} | {r['wall_s']:.0f} |")
        lrs = sorted(r["lr"] for r in recs)
        if len(lrs) > 1 and best["lr"] in (lrs[0], lrs[-1]):
            edges.append(f"- {side}'s best lr is at the sweep's edge: a wider --lrs_"
                         f"{'grpo_lab' if side == 'grpo_lab' else 'trl'} may do better.")
    return out + ([""] + edges if edges else [])


def fmt_s(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def per_step(r: dict) -> str:
    n = r["steps"]
    return f"{r['train_s'] / n:.2f} ({r['rollout_s'] / n:.2f} + {r['update_s'] / n:.2f})"


def versus_lines(a, mine: list[dict], lr: float) -> list[str]:
    """grpo_lab under ``--versus_set`` against ``mine`` (its runs under ``--grpo_lab_set``),
    the same lr and seeds (a run the results file lacks is run), paired by seed: the ratio
    versus / mine of training seconds and of steps to the target."""
    def name(text):
        return repr(text) if text else "the preset's settings"

    def at(r):
        return (f"step {r['steps_to_target']}, {r['train_s_to_target']:.1f} s"
                if r["steps_to_target"] else f"not reached in {r['steps']} steps")

    theirs = [get_run(with_set(a, a.versus_set), "grpo_lab", lr, r["seed"]) for r in mine]
    out = [f"grpo_lab with {name(a.versus_set)} against grpo_lab with {name(a.grpo_lab_set)}, "
           f"lr {lr:g}, the same seeds:", ""]
    out += [f"- seed {m['seed']}: {at(t)} against {at(m)}" for t, m in zip(theirs, mine)]
    pairs = [(t, m) for t, m in zip(theirs, mine) if t["steps_to_target"] and m["steps_to_target"]]
    out.append("")
    if len(pairs) < 2:
        return out + [f"{len(pairs)} seed(s) where both reached the target: no interval."]
    for what, k in (("training s", "train_s_to_target"), ("steps", "steps_to_target")):
        p = paired_ratio([t[k] for t, _ in pairs], [m[k] for _, m in pairs])
        out.append(f"- versus / mine, {what} to {a.target:.0%}, paired by seed over {len(pairs)} "
                   f"seed(s): geometric mean {p['mean']:.2f} [95% {p['low']:.2f}, "
                   f"{p['high']:.2f}], per seed {', '.join(f'{x:.2f}' for x in p['ratios'])}")
    return out


def seed_table(a, final: dict, lrs: dict) -> list[str]:
    out = [f"Phase 2, seeds {a.seeds} at each side's best lr (grpo_lab {lrs['grpo_lab']:g}, "
           f"TRL {lrs['TRL']:g}), interleaved; mean [95% t-interval] over the seeds that "
           f"reached {a.target:.0%}; training seconds leave evaluation out:", "",
           "| side | reached | steps to target | training s to target | s/step (rollout + "
           "update) | rollout share | evaluation s (excluded) | wall s | best held-out acc |",
           "|---|---|---|---|---|---|---|---|---|"]
    for side, recs in final.items():
        hit = [r for r in recs if r["steps_to_target"]]
        share = sum(r["rollout_s"] for r in recs) / sum(r["train_s"] for r in recs)
        per = [r["train_s"] / r["steps"] for r in recs]
        roll = [r["rollout_s"] / r["steps"] for r in recs]
        upd = [r["update_s"] / r["steps"] for r in recs]
        out.append(f"| {side} | {len(hit)}/{len(recs)} | "
                   f"{ci([r['steps_to_target'] for r in hit], '.1f')} | "
                   f"{ci([r['train_s_to_target'] for r in hit], '.1f')} | "
                   f"{ci(per, '.2f')} ({mean_ci(roll)[0]:.2f} + {mean_ci(upd)[0]:.2f}) | "
                   f"{share:.0%} | {ci([r['eval_s'] for r in recs], '.1f')} | "
                   f"{ci([r['wall_s'] for r in recs], '.0f')} | "
                   f"{ci([best_acc(r) for r in recs], '.2f')} |")
    out += ["", "Per seed:", ""]
    for side, recs in final.items():
        for r in recs:
            chosen = " (the sweep's run: its lr was chosen on it)" if r.get("sweep") else ""
            at = (f"step {r['steps_to_target']}, {r['train_s_to_target']:.1f} s"
                  if r["steps_to_target"] else f"not reached in {r['steps']} steps")
            out.append(f"- {side}, seed {r['seed']}: {at}; s/step {per_step(r)}; held-out "
                       f"{' '.join(f'{s}:{acc:.0%}' for s, acc in r['evals'])}; load "
                       f"{r['load_start']:.1f} -> {r['load_end']:.1f}{chosen}")
    pairs = [(t, g) for t, g in zip(final["TRL"], final["grpo_lab"])
             if t["steps_to_target"] and g["steps_to_target"]]
    out.append("")
    if not pairs:
        return out + ["No seed where both sides reached the target: no paired ratio."]
    low = high = 0.0
    for what, k in (("training s", "train_s_to_target"), ("steps", "steps_to_target")):
        if len(pairs) > 1:
            p = paired_ratio([t[k] for t, _ in pairs], [g[k] for _, g in pairs])
            low, high = (p["low"], p["high"]) if k == "train_s_to_target" else (low, high)
            out.append(f"- TRL / grpo_lab, {what} to {a.target:.0%}, paired by seed over "
                       f"{len(pairs)} seed(s): geometric mean {p['mean']:.2f} [95% "
                       f"{p['low']:.2f}, {p['high']:.2f}], per seed "
                       f"{', '.join(f'{x:.2f}' for x in p['ratios'])}")
        else:
            t, g = pairs[0]
            out.append(f"- TRL / grpo_lab, {what} to {a.target:.0%}, one seed pair: "
                       f"{t[k] / g[k]:.2f}")
    if len(pairs) < 2:
        return out + ["- goal (TRL / grpo_lab >= 3): undecided, fewer than 2 seed pairs."]
    out.append(f"- goal (grpo_lab's training time to {a.target:.0%} <= 1/3 of TRL's, i.e. "
               f"TRL / grpo_lab >= 3): "
               + ("met" if low >= 3 else "not met" if high < 3 else "undecided: the interval "
                  "holds 3") + f" (the interval {low:.2f} to {high:.2f}); time per side: rollout (sampling, rewards, advantages) and "
               f"update (loss forward, backward, optimizer) per step above.")
    return out


def machine_lines(when: str) -> list[str]:
    up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return [f"- {when}: {cpu_line()}; `uptime`: {up}"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true",
                    help="data/hf_tiny, tiny sizes: the whole path in about a minute")
    ap.add_argument("--lrs_grpo_lab", default="", help="comma-separated sweep of grpo_lab's lr")
    ap.add_argument("--lrs_trl", default="", help="comma-separated sweep of TRL's lr")
    ap.add_argument("--target", type=float, default=0.0, help="held-out accuracy to reach")
    ap.add_argument("--cap", type=int, default=0, help="most steps of one run")
    ap.add_argument("--eval_every", type=int, default=0)
    ap.add_argument("--eval_size", type=int, default=0)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--sweep_seed", type=int, default=0,
                    help="the sweep's seed (one of --seeds: its runs are reused in phase 2)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads")
    ap.add_argument("--trl_matched", action="store_true",
                    help="TRL with grpo_lab's loss and constant lr after 2 warm-up steps")
    ap.add_argument("--sweep_only", action="store_true", help="phase 1 only")
    ap.add_argument("--grpo_lab_set", default="",
                    help="JSON of TrainConfig fields for grpo_lab's side on top of the preset's, "
                         "e.g. '{\"warmup_steps\": 0, \"loss\": {\"aggregation\": \"token_mean\"}}'")
    ap.add_argument("--versus_set", default=None,
                    help="JSON like --grpo_lab_set ('' the preset's own): grpo_lab's runs under "
                         "it paired by seed with its runs under --grpo_lab_set, at the same lr")
    ap.add_argument("--bf16", action="store_true",
                    help="bf16 on both sides: grpo_lab's bf16 sampling copy + autocast (the speed "
                         "probe's choice on a CPU with native bf16), TRL's bf16=True")
    ap.add_argument("--results", default="", help="JSON lines of finished runs (appended)")
    ap.add_argument("--out", default="", help="markdown table (default: printed only)")
    a = ap.parse_args(argv)
    d = SETTINGS["dry" if a.dry else "smollm"]
    for k in ("lrs_grpo_lab", "lrs_trl", "target", "cap", "eval_every", "eval_size", "threads"):
        setattr(a, k, getattr(a, k) or d[k])
    a.preset, a.model = d["preset"], d["model"]
    a.B, a.G, a.max_new, a.temperature = (d.get(k, 0) for k in ("B", "G", "max_new",
                                                                 "temperature"))
    a.seeds = [int(s) for s in a.seeds.split(",")]
    a.results = Path(a.results or Path(tempfile.gettempdir()) / "bench_tta_dry.jsonl"
                     if a.dry else a.results or "runs/bench_tta_smollm.jsonl")
    a.results.parent.mkdir(parents=True, exist_ok=True)
    lrs = {"grpo_lab": [float(x) for x in a.lrs_grpo_lab.split(",")],
           "TRL": [float(x) for x in a.lrs_trl.split(",")]}
    import torch
    import transformers
    import trl

    args = " ".join(sys.argv[1:] if argv is None else argv)
    s = shared(a)
    grpo_lab_overrides(a, s["chat_template"])                 # a bad --grpo_lab_set fails now
    if a.versus_set:
        grpo_lab_overrides(with_set(a, a.versus_set), s["chat_template"], "--versus_set")
    lines = [f"Command: `python bench/bench_tta_smollm.py {args}`", "",
             f"{a.model} (preset {a.preset}: answer_format {s['fmt']!r}, reward {s['weights']}), "
             f"B={s['B']} G={s['G']} max_new={s['max_new']} T={s['temperature']}, target "
             f"{a.target:.0%} on the first {a.eval_size} held-out prompts (greedy) every "
             f"{a.eval_every} steps, cap {a.cap} steps, threads {a.threads}; TRL with "
             f"{'grpo_lab loss and schedule' if a.trl_matched else 'its own loss and schedule'}; "
             f"{'bf16 on both sides' if a.bf16 else 'float32 on both sides'}; "
             f"{'grpo_lab with ' + a.grpo_lab_set + ' on the preset; ' if a.grpo_lab_set else ''}"
             f"torch {torch.__version__}, transformers {transformers.__version__}, trl "
             f"{trl.__version__}; results {a.results}.", ""] + machine_lines("start")
    print("\n".join(lines), flush=True)
    sweep = {side: [] for side in SIDES}
    for i in range(max(len(v) for v in lrs.values())):           # the sides alternate
        for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
            if i < len(lrs[side]):
                sweep[side].append(get_run(a, side, lrs[side][i], a.sweep_seed))
    best = {side: best_lr(recs)["lr"] for side, recs in sweep.items()}
    lines += [""] + sweep_table(a, sweep)
    if not a.sweep_only:
        final = {side: [] for side in SIDES}
        for seed in a.seeds:                                      # interleaved, order alternating
            for side in (SIDES if seed % 2 == 0 else SIDES[::-1]):
                rec = get_run(a, side, best[side], seed)
                final[side].append({**rec, "sweep": seed == a.sweep_seed})
        lines += [""] + seed_table(a, final, best)
        if a.versus_set is not None:
            lines += [""] + versus_lines(a, final["grpo_lab"], best["grpo_lab"])
    lines += [""] + machine_lines("end")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(f"# Time to {a.target:.0%} held-out: grpo_lab vs TRL "
                               f"(bench/bench_tta_smollm.py)\n\n{text}")


if __name__ == "__main__":
    main()
