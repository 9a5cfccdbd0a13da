"""The algorithms issue's toy study: clip-higher vs symmetric clipping, CISPO vs GRPO's clip,
dual-clip on and off, 3 seeds, paired against the demo.

Every variant is the demo preset (tiny_cpu: lr 3e-4, beta 0, DAPO dynamic sampling, stop at
90% held-out) with ``mu = 2``: two updates per rollout, so the second update is off-policy
and the ratio leaves 1 (at the demo's mu = 1 every ratio is 1, where CISPO's gradient is
clip's and dual-clip cannot act). One change per variant from that control ("clip_higher",
eps 0.2 / 0.28, the field defaults: DAPO's clip-higher): symmetric eps_high 0.2, CISPO
(loss.policy="cispo", its weight capped at clip.cispo_cap = 1.28, the cap the recorded runs
had: it was 1 + eps_high then; the default cap is now TRL's recommended 5.0), dual-clip c = 3. The table
is bench_variants.py's (steps to 85% / 90%, last and best accuracy, the paired difference
from the control, 95% t-intervals), plus the fractions of tokens clipped, step means.

    python bench/bench_algorithms.py --steps 500 --seeds 0 1 2 --processes 2
    python bench/bench_algorithms.py --from_json bench/RESULTS_algorithms.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_variants  # noqa: E402
from grpo_lab.training.config import PRESETS  # noqa: E402
from grpo_lab.training.experiments import run_experiment  # noqa: E402

CONTROL = {**PRESETS["tiny_cpu"], "mu": 2}
VARIANTS = {
    "demo": {},                                    # clip-higher 0.2 / 0.28 (the control)
    "symmetric_0.2": {"clip": {"eps_high": 0.2}},
    "cispo": {"loss": {"policy": "cispo"}, "clip": {"cispo_cap": 1.28}},
    "dual_clip_3": {"clip": {"dual_clip": 3.0}},
}
KEEP = bench_variants.KEEP + ("clip/high_frac", "clip/low_frac", "clip/ratio_mean",
                              "clip/dual_frac")


def clipped(runs) -> str:
    out = ["| variant | clip/high_frac | clip/low_frac | clip/ratio_mean (max over steps) | "
           "clip/dual_frac |", "|---|---:|---:|---:|---:|"]
    for name in dict.fromkeys(r["strategy"] for r in runs):
        hs = [h for r in runs if r["strategy"] == name for h in r["history"] if "clip/high_frac" in h]
        mean = lambda k: sum(h[k] for h in hs) / max(len(hs), 1)   # noqa: E731
        out.append(f"| {name} | {mean('clip/high_frac'):.5f} | {mean('clip/low_frac'):.5f} | "
                   f"{max((h['clip/ratio_mean'] for h in hs), default=float('nan')):.5f} | "
                   + (f"{mean('clip/dual_frac'):.6f} |" if hs and "clip/dual_frac" in hs[0]
                      else "- |"))
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=0, help="cap on steps (0: the preset's)")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--json", default="bench/RESULTS_algorithms.json")
    ap.add_argument("--out", default="bench/RESULTS_algorithms.md")
    ap.add_argument("--from_json", default="")
    a = ap.parse_args()
    command = "python bench/bench_algorithms.py " + " ".join(sys.argv[1:])
    if a.from_json:
        runs = json.loads(Path(a.from_json).read_text())["runs"]
    else:
        base = {**CONTROL, "ckpt_every": 10 ** 6, **({"steps": a.steps} if a.steps else {})}
        runs, t0 = [], time.time()
        for seed in a.seeds:                           # one seed at a time, saved as it ends
            res = run_experiment(VARIANTS, seeds=(seed,), base=base, processes=a.processes,
                                 progress=False)
            runs += [{**r, "history": [{k: h[k] for k in KEEP if k in h} for h in r["history"]]}
                     for r in res.runs]
            Path(a.json).write_text(json.dumps({"command": command, "base": base,
                                                "variants": VARIANTS, "wall_s": time.time() - t0,
                                                "runs": runs}))
            print(f"seed {seed} done, {time.time() - t0:.0f} s", flush=True)
    text = (f"\n## {time.strftime('%Y-%m-%d %H:%M')}: `{command}`\n\ntorch {torch.__version__}; "
            f"control: the demo preset with mu = 2 {CONTROL}; one change per variant: {VARIANTS}\n\n"
            + bench_variants.render(runs) + "\n\n" + clipped(runs))
    print(text)
    with open(a.out, "a") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
