"""Fingerprints of a set of short training runs, to show that a refactor changes no number.

    python tools/same_metrics.py --out A.json [--only demo,kl_reward] [--steps 6] [--nproc]
    python tools/same_metrics.py --compare A.json B.json

Each named config (CONFIGS: the demo preset and one run per step variant, grouper and code
path; with ``--nproc`` also NPROC, on 2 and 3 processes) trains ``--steps`` steps, one thread
a process, evaluating at step 3; the fingerprint is every metrics.jsonl row without its
``time/*`` keys (and the run's wall-clock fields), written as JSON with floats in full
(``repr``). ``--compare`` prints the first difference per config
and exits 1 when any config differs: a refactor that is a refactor keeps every bit.

One config is not bitwise reproducible by itself: ``powersgd_2proc`` (torch's powerSGD_hook
under DDP) moves in the 7th significant digit from its first compressed step, run to run on
one tree (6 runs of one commit gave 4 different grad/norm values at step 4). A difference in
it alone is no evidence: run it again, on both trees, before reading it as a change.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

CONFIGS: dict[str, tuple[str, dict]] = {
    "demo": ("tiny_cpu", {}),
    "defaults_kl_loss": ("defaults", {}),
    "kl_reward": ("defaults", {"kl": {"placement": "reward", "estimator": "k1"}}),
    "tis": ("defaults", {"tis": {"cap": 2.0}, "kl": {"beta": 0.0}}),
    "tis_sequence": ("defaults", {"tis": {"cap": 2.0, "level": "sequence"}, "kl": {"beta": 0.0}}),
    "overlong_soft": ("defaults", {"overlong": {"rule": "soft", "buffer": 2}, "max_new_tokens": 6}),
    "overlong_filter": ("defaults", {"overlong": {"rule": "filter"}, "max_new_tokens": 6}),
    "process": ("defaults", {"supervision": "process"}),
    "entropy": ("defaults", {"top_entropy": {"quantile": 0.2}, "entropy_bonus": {"coef": 0.01}}),
    "off_policy_mask": ("defaults", {"off_policy_mask": {"delta": 0.5}, "mu": 2}),
    "dr_grpo": ("defaults", {"advantage": "dr_grpo", "loss": {"aggregation": "dr_grpo"}}),
    "token_mean_cispo": ("defaults", {"loss": {"aggregation": "token_mean", "policy": "cispo"},
                                      "clip": {"cispo_cap": 1.28}}),   # 1 + eps_high before
    "micro_batches": ("defaults", {"micro_batches": 2}),
    "no_drop_topk_topp": ("defaults", {"sampler": {"drop_finished": False}, "top_k": 8,
                                       "top_p": 0.9}),
    "inverse_cdf": ("defaults", {"sampler": {"draw": "inverse_cdf"}}),
    "kmeans": ("mixture_cpu", {"grouping": "kmeans_semantic", "group": {"k": 3},
                               "prompts_per_step": 8, "eval_size": 20}),
    "kmeans_recluster": ("mixture_cpu", {"grouping": "kmeans_semantic",
                                         "group": {"k": 2, "recluster_every": 2,
                                                   "schedule": False, "combine": "cluster"},
                                         "prompts_per_step": 8, "eval_size": 20}),
    "ppo": ("defaults", {"objective": "ppo"}),
    "hf_tiny": ("hf_tiny_cpu", {"prompts_per_step": 4, "eval_size": 20}),
    # the sampler thread's rollout is deterministic (seeded by (seed, step)), whatever its timing
    "async": ("defaults", {"speed": {"async_steps": 1, "rollout_threads": 1}, "tis": {"cap": 2.0},
                           "kl": {"beta": 0.0}, "dynamic": {"sampling": False}}),
}

# the same on 2 and 3 processes (spawn_train, gloo): the ranks' bookkeeping, the gather,
# dynamic sampling's shared decisions, process supervision's per-token rewards
NPROC: dict[str, tuple[str, dict, int]] = {
    "demo_2proc": ("tiny_cpu", {}, 2),
    "demo_3proc": ("tiny_cpu", {"prompts_per_step": 10}, 3),
    "kmeans_2proc": ("mixture_cpu", {"grouping": "kmeans_semantic", "group": {"k": 3},
                                     "prompts_per_step": 8}, 2),
    "process_2proc": ("defaults", {"supervision": "process"}, 2),
    # each exchange kind with its settings block set off its defaults
    "compressed_2proc": ("defaults", {"exchange": {"name": "compressed"},
                                      "compression": {"preset": "aggressive", "momentum": 0.5,
                                                      "beta1": 0.5, "density_warmup": 3}}, 2),
    "sharded_compressed_2proc": ("defaults", {
        "exchange": {"name": "sharded_compressed"},
        "compression": {"preset": "fp8_topk5", "error_feedback": False},
        "sharding": {"policy": "importance_round_robin", "importance": "seed", "reshard_every": 2,
                     "max_shard_numel": 500, "broadcast_preset": "fp16"}}, 2),
    "powersgd_2proc": ("defaults", {"exchange": {"name": "ddp_powersgd_hook"},
                                    "powersgd": {"rank": 1, "start": 3}}, 2),
    "fsdp2_2proc": ("defaults", {"exchange": {"name": "fsdp2"},
                                 "fsdp2": {"reshard_after_forward": False}}, 2),
}

DROP = ("time/", "comm/wchar_bytes")           # wall clock; bytes the OS counted being written


def fingerprint(name: str, steps: int) -> list[dict]:
    from grpo_lab.training.config import preset
    from grpo_lab.training.trainer import spawn_train, train
    base, over, nproc = (*CONFIGS[name], 1) if name in CONFIGS else NPROC[name]
    out = tempfile.mkdtemp(prefix=f"same_metrics_{name}_")
    fields = {"steps": steps, "eval_every": 3, "eval_size": 40, "ckpt_every": 1000,
              "time_budget_s": 0.0, "threads": 1, "out_dir": out, "target_accuracy": 0.0}
    cfg = preset(base, **{**fields, **over})
    if nproc > 1:
        spawn_train([cfg], nproc=nproc, progress=False)
    else:
        train(cfg, progress=False)
    rows = []
    for line in (Path(out) / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.append({k: repr(v) for k, v in sorted(row.items())
                     if not k.startswith(DROP) and k not in ("wall_s", "elapsed_s")})
    return rows


def compare(a: Path, b: Path) -> int:
    A, B = json.loads(a.read_text()), json.loads(b.read_text())
    bad = 0
    for name in sorted(set(A) | set(B)):
        if name not in A or name not in B:
            print(f"{name}: only in {'A' if name in A else 'B'}")
            continue
        if A[name] == B[name]:
            print(f"{name}: same ({len(A[name])} rows)")
            continue
        bad += 1
        for i, (ra, rb) in enumerate(zip(A[name], B[name])):
            diff = {k: (ra.get(k), rb.get(k)) for k in set(ra) | set(rb) if ra.get(k) != rb.get(k)}
            if diff:
                first = dict(sorted(diff.items())[:4])
                print(f"{name}: DIFFERS at row {i} ({len(diff)} keys), e.g. {first}")
                break
        else:
            print(f"{name}: DIFFERS in row count {len(A[name])} vs {len(B[name])}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--only", default="", help="comma-separated names of CONFIGS (default: all)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--nproc", action="store_true",
                    help="add the N-process runs (NPROC: 2 and 3 local processes, ~1 min)")
    ap.add_argument("--compare", nargs=2, type=Path)
    a = ap.parse_args(argv)
    if a.compare:
        return compare(*a.compare)
    if not a.out:
        ap.error("--out or --compare")
    names = a.only.split(",") if a.only else list(CONFIGS) + (list(NPROC) if a.nproc else [])
    for n in names:
        if n not in CONFIGS and n not in NPROC:
            ap.error(f"unknown config {n!r}; known: {', '.join([*CONFIGS, *NPROC])}")
    result = {}
    for n in names:
        result[n] = fingerprint(n, a.steps)
        print(f"{n}: {len(result[n])} rows", flush=True)
    a.out.write_text(json.dumps(result, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
