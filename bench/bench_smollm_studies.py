"""The real-model studies of issue 35 on SmolLM2-135M-Instruct: one command per study.

    GRPO_LAB_MODELS=~/.cache/grpo_lab/models python bench/bench_smollm_studies.py \
        --study entropy_reward --out_dir /work/studies/entropy_reward

runs the study (``grpo-lab study``: paired by step and seed, each run's folder kept, a killed
study resumed where it stopped) unless every run has finished, then writes what it found:
``bench/RESULTS_smollm_study_<name>.md`` (the table, the study's question with its test, every
arm's paired difference from the reference with its 95% interval and what the seeds could
detect at 80% power at the sd's upper bound (others: leads), the health
findings of every run, the machine and its load) and ``data/studies/<name>.json`` (each run's
curves, read back by ``Results.load``: notebook 12 plots them). ``--summary_only`` writes the
two from the runs finished so far without training.

Studies (``STUDIES``; every arm is the ``smollm_cpu`` preset with one change):
  * ``entropy_reward``: issue 35's KL question (3a): the preset as it is (eps_high 0.28,
    beta 0, mu 1, the additive \\boxed{} format reward at 0.25) against ``kl``, DeepSeekMath's
    KL term (beta 0.04, k3 in the loss).
  * ``clip_higher``: DAPO's clip-higher (eps_high 0.28) against symmetric clipping (0.2), with
    two policy updates per rollout (mu 2). With the preset's mu 1 the update's ratio is exactly
    1 (the old log-probs are the policy's own), so no clip range ever acts: measured,
    clip/high_frac and clip/low_frac 0.0 at every step of the preset's runs; the clip can
    only matter off-policy. mu 2 doubles the updates per step (and 1.6x the step's time), so
    12 steps (24 updates).
  * ``format_gate``: reward design (issue 35's 4). Under the preset's system prompt the gated
    reward never fired (0 boxed right answers in the first 10-12 steps of two seeds: the model
    never boxes), so this study asks in the setting where SmolLM2 does box: no system prompt,
    the request in the question (the base boxes 3-12% of its samples, BENCHMARKS section 16).
    ``additive`` adds the format reward at weight 1 to every boxed answer (what taught a boxed
    guess in 4 steps in section 16's pilot); ``gated`` pays the same weight only on right
    answers (``format_if_correct``).
  * ``length_bias``: GRPO's per-sequence normalisation and std-scaled advantages against
    Dr. GRPO's (both switches), no system prompt, 48 tokens, the accuracy reward alone.
  * ``grouping_mixture``: by_prompt against K-means semantic and mixed grouping on five instruct
    families at 24 tokens; 59-65% of its completions were cut and 80-86% of its groups had
    equal rewards: a weak test, kept as the first attempt.
  * ``grouping_families``: the same arms at 48 tokens with the held-out target at 25% (the first
    attempt's arms ended at 21-25%), 16 steps, accuracy per family recorded.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_lab.cli import main as cli_main                     # noqa: E402
from grpo_lab.training.experiments import Results, metric_info  # noqa: E402

STUDIES = {
    "entropy_reward": [
        "--base", "smollm_cpu", "--seeds", "3", "--steps", "30", "--set", "eval_every=10",
        "--arm", "preset", "--arm", "kl", "beta=0.04", "--primary", "kl", "preset",
        "--metric", "policy/entropy_end"],
    "clip_higher": [
        "--base", "smollm_cpu", "--seeds", "3", "--steps", "12", "--set", "eval_every=6",
        "mu=2", "--arm", "symmetric", "eps_high=0.2", "--arm", "clip_higher",
        "--primary", "clip_higher", "symmetric", "--metric", "policy/entropy_end"],
    "format_gate": [
        "--base", "smollm_cpu", "--seeds", "3", "--steps", "20", "--set", "eval_every=10",
        "system_prompt=", "--arm", "additive", "reward_weights=accuracy=1,format=1",
        "--arm", "gated", "reward_weights=accuracy=1,format_if_correct=1",
        "--primary", "gated", "additive"],
    "length_bias": [
        "--base", "smollm_cpu", "--seeds", "3", "--steps", "16", "--set", "eval_every=8",
        "system_prompt=", "max_new_tokens=48", "reward_weights=accuracy=1",
        "--arm", "grpo", "--arm", "dr_grpo", "advantage=dr_grpo", "loss.aggregation=dr_grpo",
        "--primary", "dr_grpo", "grpo", "--metric", "completion/len_wrong_end"],
    "grouping_mixture": [
        "--base", "smollm_cpu", "--seeds", "3", "--steps", "20", "--target", "0.5",
        "--set", "eval_every=10", "eval_size=20", "task=addition,word_problems,max,min,compare",
        "prompts_per_step=8", "group_size=4",
        "--arm", "by_prompt", "--arm", "kmeans", "grouping=kmeans_semantic", "group.k=4",
        "--arm", "mixed", "grouping=mixed", "group.k=4", "--primary", "kmeans", "by_prompt"],
    "grouping_families": [
        "--base", "smollm_cpu", "--seeds", "3", "--steps", "16", "--target", "0.25",
        "--set", "eval_every=8", "eval_size=20", "task=addition,word_problems,max,min,compare",
        "prompts_per_step=8", "group_size=4", "max_new_tokens=48",
        "--arm", "by_prompt", "--arm", "kmeans", "grouping=kmeans_semantic", "group.k=4",
        "--arm", "mixed", "grouping=mixed", "group.k=4", "--primary", "kmeans", "by_prompt"],
}
COMPARED = ("eval/accuracy", "eval/gain", "eval/format", "policy/entropy_end",
            "completion/len_right_end", "completion/len_wrong_end")
CURVES = ("eval/accuracy", "eval/format", "policy/entropy", "reward/mean", "reward/accuracy",
          "reward/format", "reward/format_if_correct", "completion/mean_len",
          "completion/len_right", "completion/len_wrong", "completion/truncated_frac",
          "clip/high_frac", "clip/low_frac", "loss/kl_k3", "group/size_mean", "group/purity",
          "adv/var", "time/step_s")


def machine() -> str:
    """The CPU (lscpu's model name and the flags that decide matmul speed) and the load."""
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next((l.split(":", 1)[1].strip() for l in info.splitlines()
                      if l.startswith("Model name")), "?")
        flags = next((l.split(":", 1)[1].split() for l in info.splitlines()
                      if l.startswith("Flags")), [])
        wanted = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx_vnni")
                  if f in flags]
    except (OSError, subprocess.CalledProcessError):
        model, wanted = platform.processor() or "?", []
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    return (f"{model}, {os.cpu_count()} cores, flags {' '.join(wanted) or 'none of avx2/avx512'}; "
            f"load average (1, 5, 15 min) at the summary: "
            f"{', '.join(format(x, '.2f') if isinstance(x, float) else x for x in load)}")


DIFFERENCES_HEAD = "Paired differences from `"
"""Where the differences section of a results file starts when it has no question yet;
"Seconds per step" ends it."""


def differences(res: Results) -> list[str]:
    """The study's question with its test, then every paired difference from the reference
    arm: the primary's row is the test, the others leads; detectable at the sd's one-sided 95%
    upper bound on n - 1 degrees of freedom, with the figure at the observed sd as rough."""
    ref = res.primary["b"] if res.primary else res.strategies[0]
    question = res.question_lines()
    while question and not question[-1]:
        question.pop()
    lines = [*question, "",
             f"Paired differences from `{ref}` (same seed, same prompts at every step; "
             f"detectable = the smallest true difference these seeds find 80% of the time when "
             f"the sd of the paired differences is at its one-sided 95% upper bound from 2 "
             f"degrees of freedom, 4.4x the sd seen; rough = the same at the sd seen, reached "
             f"only when the true sd is no larger; the primary's row is the test, the others "
             f"leads):", "",
             "| arm | metric | role | difference | 95% interval | n | detectable (80%) | rough "
             "| verdict |", "|---|---|---|---:|---|---:|---:|---:|---|"]
    for d in res.differences(ref, COMPARED):
        fmt = metric_info(d["metric"])[1].lstrip("+")
        det, rough = ("-" if d[k] is None else format(d[k], fmt)
                      for k in ("detectable", "detectable_rough"))
        lines.append(f"| {d['a']} | {d['metric']} | {d['role']} | {d['mean']:+{fmt}} | "
                     f"[{d['ci_low']:+{fmt}}, {d['ci_high']:+{fmt}}] | {d['n']} | {det} | "
                     f"{rough} | {d['verdict']} |")
    return lines


def rewrite_differences(name: str) -> str:
    """Rewrite the differences section of bench/RESULTS_smollm_study_<name>.md from
    data/studies/<name>.json (the runs' folders are not needed): the rest of the file (the
    command, the machine, the health findings) stays as the study wrote it."""
    path = ROOT / "bench" / f"RESULTS_smollm_study_{name}.md"
    old = path.read_text().splitlines()
    start = next(i for i, x in enumerate(old)                # the question, or the table
                 if x.startswith(("**Primary question**", DIFFERENCES_HEAD)))
    end = next(i for i, x in enumerate(old) if x.startswith("Seconds per step"))
    res = Results.load(ROOT / "data" / "studies" / f"{name}.json")
    text = "\n".join(old[:start] + differences(res) + [""] + old[end:]) + "\n"
    path.write_text(text)
    return text


def summarise(name: str, out_dir: Path, command: str) -> str:
    res = Results.from_folder(out_dir)
    table = res.to_markdown().split("\n\n")[0]          # the table; the question comes below
    lines = [f"# Study {name}: SmolLM2-135M-Instruct, {len(res.runs)} runs", "",
             f"    {command}", "", f"Machine: {machine()}.", "",
             table, "", res._legend() + ".", "", *differences(res)]
    per_step = {}
    for r in res.runs:
        per_step.setdefault(r["strategy"], []).extend(
            h["time/step_s"] for h in r["history"] if "time/step_s" in h)
    lines += ["", "Seconds per step (every step of every seed, one thread per run, two runs at "
              "once, on the shared machine: a loaded figure): " + ", ".join(
                  f"{a} {sum(v) / len(v):.1f}" for a, v in per_step.items() if v) + "."]
    lines += ["", "Health findings per run (health.py):", ""]
    for r in res.runs:
        found = [f for f in r["findings"] if f.strip()] or ["none"]
        lines.append(f"- {r['strategy']} seed {r['seed']}: " + " / ".join(found))
    lines += [f"- note: {n}" for n in res.notes]
    (ROOT / "data" / "studies").mkdir(exist_ok=True)
    res.save(ROOT / "data" / "studies" / f"{name}.json", keys=CURVES)
    shown = {}   # seed 0's greedy samples of the held-out prompts at its first and last evaluation
    for r in res.runs:   # (the base's are not kept: base.json holds its metrics only)
        path = Path(r["out_dir"]) / "samples.jsonl"
        if r["seed"] == 0 and path.exists():
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            shown[r["strategy"]] = {"first_step": rows[0]["step"], "first": rows[0]["samples"],
                                    "after_step": rows[-1]["step"], "after": rows[-1]["samples"]}
    (ROOT / "data" / "studies" / f"{name}_samples.json").write_text(json.dumps(shown, indent=1))
    text = "\n".join(lines) + "\n"
    (ROOT / "bench" / f"RESULTS_smollm_study_{name}.md").write_text(text)
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", required=True, choices=sorted(STUDIES))
    p.add_argument("--out_dir", default=None,
                   help="the study's folder (runs, checkpoints); not needed with "
                        "--rewrite_differences")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--summary_only", action="store_true",
                   help="summarise the finished runs, train nothing")
    p.add_argument("--rewrite_differences", action="store_true",
                   help="rewrite only the differences section of the results file from "
                        "data/studies/<study>.json (no study folder needed)")
    args = p.parse_args(argv)
    if args.rewrite_differences:
        print(rewrite_differences(args.study))
        return 0
    if args.out_dir is None:
        p.error("--out_dir is required (but with --rewrite_differences)")
    study = STUDIES[args.study] + ["--out_dir", args.out_dir, "--processes",
                                   str(args.processes)]
    command = "grpo-lab study " + " ".join(study)
    if not args.summary_only:
        resume = ["--resume"] if (Path(args.out_dir) / "study.json").exists() else []
        if cli_main(["study", *study, *resume, "--pilot_steps", "0"]) != 0:
            return 1
    print(summarise(args.study, Path(args.out_dir), command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
