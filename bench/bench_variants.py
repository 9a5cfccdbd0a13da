"""The GRPO variants of issue 24 against the demo preset (tiny_cpu) on the toy, 3 seeds.

Each variant is the demo preset (lr 3e-4, beta 0, DAPO dynamic sampling, evaluation every 50
steps, stop at 90% held-out) with one change: GSPO's sequence-level ratio, an entropy bonus,
top-p sampling, the KL to the reference (beta 0.02) as k3 in the loss (the paper) or k1 in
the reward, DAPO's overlong filter or soft penalty, truncated importance sampling. Per variant: steps to 85% / 90% (mean ± 95% t-interval over the seeds that
reached it), the last and best held-out accuracy, and the paired difference from the demo
(variant - demo, same seed, 95% t-interval). Runs go through ``experiments.run_experiment``
(the one trainer, one thread per run); each seed is written to a JSON file as soon as its
runs end, and the table is rendered from that file (``--from_json``), so a stopped bench
keeps the seeds it finished.

``--steps`` caps the run (the cosine schedule is then over the cap, for every variant alike:
the comparison stays paired, the demo's own step count does not apply).

    python bench/bench_variants.py --steps 800 --seeds 0 1 2 --processes 2
    python bench/bench_variants.py --from_json bench/RESULTS_variants*.json
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
from bench_time_to_accuracy import markdown, summarize  # noqa: E402
from grpo_lab.training.config import PRESETS  # noqa: E402
from grpo_lab.training.experiments import Results, mean_ci, run_experiment  # noqa: E402

DEMO = dict(PRESETS["tiny_cpu"])
VARIANTS = {
    "demo": {},
    "gspo": {"loss": {"ratio_level": "sequence"}},
    "entropy_0.01": {"entropy_bonus": {"coef": 0.01}},
    "top_p_0.9": {"top_p": 0.9},
    "kl_k3_loss": {"kl": {"beta": 0.02, "estimator": "k3", "placement": "loss"}},
    "kl_k1_reward": {"kl": {"beta": 0.02, "estimator": "k1", "placement": "reward"}},
    "overlong_filter": {"overlong": {"rule": "filter"}},
    "overlong_soft": {"overlong": {"rule": "soft"}},
    "tis_2": {"tis": {"cap": 2.0}},
}
KEEP = ("step", "eval/accuracy", "time/step_s", "completion/truncated_frac", "policy/entropy")


def paired(rows_by_name: dict, name: str, key) -> str:
    """variant - demo, paired by seed: mean [95% t-interval] over the seeds where both exist."""
    a, b = rows_by_name[name], rows_by_name["demo"]
    d = [x - y for x, y in zip(key(a), key(b)) if x is not None and y is not None]
    if len(d) < 2:
        return f"n = {len(d)}"
    m, lo, hi = mean_ci(d)
    return f"{m:+.1f} [{lo:+.1f}, {hi:+.1f}] (n = {len(d)})"


def render(runs: list, targets=(0.85, 0.90)) -> str:
    rows = summarize(Results(runs, None), targets)
    by = {r["variant"]: r for r in rows}
    out = [markdown(rows, targets), "", "| variant - demo (paired by seed) | steps to 90% | "
           "last acc (points) | truncated frac (step mean) |", "|---|---:|---:|---:|"]
    trunc = {}
    for r in runs:
        t = [h["completion/truncated_frac"] for h in r["history"] if "completion/truncated_frac" in h]
        trunc.setdefault(r["strategy"], []).append(sum(t) / max(len(t), 1))
    for name in by:
        if name == "demo" or "demo" not in by:
            continue
        out.append(f"| {name} | {paired(by, name, lambda r: r[0.9]['steps'])} | "
                   f"{paired(by, name, lambda r: [100 * v for v in r['last']])} | "
                   f"{max(trunc[name]):.4f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=0, help="cap on steps (0: the preset's)")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--json", default="bench/RESULTS_variants.json")
    ap.add_argument("--out", default="bench/RESULTS_variants.md")
    ap.add_argument("--from_json", nargs="*", default=[],
                    help="render from these JSON files (seeds run apart are joined)")
    a = ap.parse_args()
    command = "python bench/bench_variants.py " + " ".join(sys.argv[1:])
    if a.from_json:
        runs = [r for p in a.from_json for r in json.loads(Path(p).read_text())["runs"]]
        order = {n: i for i, n in enumerate(VARIANTS)}
        runs.sort(key=lambda r: (order.get(r["strategy"], len(order)), r["seed"]))
    else:
        names = a.variants.split(",")
        base = {**DEMO, "ckpt_every": 10 ** 6, **({"steps": a.steps} if a.steps else {})}
        runs, t0 = [], time.time()
        for seed in a.seeds:                           # one seed at a time, saved as it ends
            res = run_experiment({n: VARIANTS[n] for n in names}, seeds=(seed,), base=base,
                                 processes=a.processes, progress=False)
            runs += [{**r, "history": [{k: h[k] for k in KEEP if k in h} for h in r["history"]]}
                     for r in res.runs]
            Path(a.json).write_text(json.dumps({"command": command, "base": base,
                                                "variants": {n: VARIANTS[n] for n in names},
                                                "wall_s": time.time() - t0, "runs": runs}))
            print(f"seed {seed} done, {time.time() - t0:.0f} s", flush=True)
    text = (f"\n## {time.strftime('%Y-%m-%d %H:%M')}: `{command}`\n\ntorch {torch.__version__}; "
            f"the demo preset {DEMO}; one change per variant: "
            f"{ {n: VARIANTS[n] for n in dict.fromkeys(r['strategy'] for r in runs)} }\n\n"
            + render(runs))
    print(text)
    with open(a.out, "a") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
