"""Strategies x seeds: run each configuration over several seeds, report means with intervals.

One seed cannot compare two grouping strategies here: the seed-to-seed spread of final
held-out accuracy on the mixture (about 1.3 points, BENCHMARKS.md section 6) is as large as
the differences between the built-in groupers. So a comparison is a small experiment:

    res = run_experiment({"by_prompt": {}, "kmeans": {"grouping": "kmeans_semantic"}},
                         seeds=(0, 1, 2), base={"task": "mixture", "steps": 100, ...})
    res                                   # a table: mean ± 95% half-width per metric
    res.compare("kmeans", "by_prompt", "eval/accuracy")   # paired by seed
    res.plot("eval/accuracy")             # mean curve per strategy, min-max band over seeds

Every (strategy, seed) run is ``trainer.train`` (the one loop) on
``preset(base_preset, **base, **strategy, seed=s)`` (default "defaults": the field defaults,
lr 1e-4, beta 0.02, not the time-tuned demo; "smollm_cpu" for SmolLM2) with no time budget and
no early stop, each in its own folder under the study's (``out_dir``; a temporary one by
default). Runs share the base policy and held-out sets, so seed s of two strategies draws the
same prompts at step s: differences are paired by seed and by step. A study in a folder
resumes where it was killed (each finished run is on disk); ``pilot_steps`` prints what it
will cost and what it can detect before it starts (power.py).

Interval: the 95% Student-t interval of the mean over seeds, mean ± t(0.975, n-1) * sd / sqrt(n)
(sd with n-1). With 3 seeds t = 4.303, so the half-width is 2.5 standard deviations of the
runs: wide on purpose; it is what 3 seeds can support.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import multiprocessing
import os
import re
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from grpo_lab.algorithm.samples import append as append_samples
from grpo_lab.registry import check_number, load_plugins, lookup
from grpo_lab.rundir import writable_folder, write_lines_atomic
from grpo_lab.training.config import merge, preset, to_dict
from grpo_lab.training.placement import Slots, on_device, study_devices
from grpo_lab.training.power import detectable, seeds_needed
from grpo_lab.training.sequential import nominal_levels, paired_p
from grpo_lab.training.report import write_report
from grpo_lab.training.step import max_new_tokens
from grpo_lab.training.trainer import evaluate_tasks, setup, train
from grpo_lab.training.workers import run_in_workers, stop_on_signals

__all__ = ["run_experiment", "Results", "METRICS", "metric_info", "mean_ci", "run_metrics",
           "time_to_target", "steps_to_target", "difference_sentence", "can_tell", "MIN_SEEDS"]

END_STEPS = 5
"""Steps at the end of a run that the *_end metrics average (one step's value is noisy)."""

METRICS = {  # name -> (what it is, format); the per-run summary of one history
    "eval/accuracy": ("held-out greedy accuracy at the last evaluation", ".3f"),
    "eval/gain": ("last eval/accuracy minus the base policy's (step -1)", "+.3f"),
    "target/steps": ("steps trained when eval/accuracy first reached the target, "
                     "interpolated linearly between the evaluation before and the first at or "
                     "above it (Results.grid: the steps evaluated); n counts the runs that "
                     "reached it", ".1f"),
    "eval/format": ("held-out rate of the requested answer format at the last evaluation "
                    "(instruct tasks)", ".3f"),
    "policy/entropy_end": (f"mean sampled entropy (nats per token) over the last {END_STEPS} "
                           f"steps", ".3f"),
    "completion/len_right_end": (f"mean length (tokens) of the right completions over the "
                                 f"last {END_STEPS} steps", ".1f"),
    "completion/len_wrong_end": (f"mean length (tokens) of the wrong completions over the "
                                 f"last {END_STEPS} steps", ".1f"),
    "group/zero_std_frac": ("step mean: groups whose rewards are all equal", ".3f"),
    "adv/var": ("step mean: variance of the advantages", ".3f"),
    "sample/draws": ("step mean: rollouts of prompts_per_step prompts (dynamic sampling)",
                     ".2f"),
}


def mean_ci(values, level: float = 0.95) -> tuple[float, float, float]:
    """-> (mean, ci_low, ci_high): the t-interval of the mean at ``level`` (NaN bounds for
    n < 2). For k comparisons at once, level = 1 - 0.05 / k keeps the chance of any false
    "real difference" under 5% (Bonferroni)."""
    v = [float(x) for x in values]
    n = len(v)
    if n == 0:
        return math.nan, math.nan, math.nan
    m = sum(v) / n
    if n < 2:
        return m, math.nan, math.nan
    from scipy.stats import t                 # scipy: a scikit-learn dependency
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1))
    half = float(t.ppf(1 - (1 - level) / 2, n - 1)) * sd / math.sqrt(n)   # t(0.975, 2) = 4.303
    return m, m - half, m + half


def time_to_target(history: list[dict], target: float) -> tuple[float | None, float | None]:
    """-> (steps trained, time/elapsed_s) at the first evaluation with eval/accuracy >= target
    (the base evaluation, step -1, counts as 0 steps); (None, None) if never reached."""
    for h in history:
        if h.get("eval/accuracy", -math.inf) >= target:
            return h["step"] + 1, h.get("time/elapsed_s", 0.0)
    return None, None


def steps_to_target(history: list[dict], target: float,
                    metric: str = "eval/accuracy") -> float | None:
    """Steps trained when ``metric`` (eval/accuracy, or one task's eval/accuracy/<task>) first
    reached ``target``, interpolated linearly between the evaluation before (a steps,
    accuracy a0 < target) and the first at or above it (b, a1): a + (target - a0) / (a1 - a0) * (b - a). The base (step -1) counts as 0
    steps; None if never reached. On an eval grid of 10 steps the grid value alone would give
    every seed 10, 20, ... and an interval of width 0 where the runs differ. A history with no
    ``metric`` at all is refused (a misspelt task would otherwise read as "never reached")."""
    if not any(metric in h for h in history):
        seen = sorted({k for h in history for k in h if k.startswith("eval/accuracy")})
        raise ValueError(f"no evaluation in this history has {metric!r}; it has {seen or 'none'}")
    before = None
    for h in history:
        if metric not in h:
            continue
        x, a = h["step"] + 1, h[metric]
        if a >= target:
            if before is None:
                return float(x)
            x0, a0 = before
            return x0 + (target - a0) / (a - a0) * (x - x0)
        before = (x, a)
    return None


PER_TASK = "eval/accuracy/"
"""A run of several tasks also has ``eval/accuracy/<task>``: held-out accuracy on that task's
examples at the last evaluation (``metric_info``)."""


def metric_info(metric: str) -> tuple[str, str]:
    """-> (what it is, format) of a METRICS name or of a per-task ``eval/accuracy/<task>``."""
    if metric.startswith(PER_TASK) and len(metric) > len(PER_TASK):
        return (f"held-out greedy accuracy on the {metric[len(PER_TASK):]} examples at the "
                f"last evaluation", ".3f")
    return lookup(METRICS, metric, "metric", f"or {PER_TASK}<task> for a run of several tasks")


def run_metrics(history: list[dict], target: float | None = None) -> dict:
    """One run's history -> {metric: value} for the METRICS it has (None: target missed),
    plus ``eval/accuracy/<task>`` per task when the run trained several."""
    evals = [h for h in history if "eval/accuracy" in h]
    steps = [h for h in history if h["step"] >= 0]
    out = {}
    if evals:
        out["eval/accuracy"] = evals[-1]["eval/accuracy"]
        out.update({k: v for k, v in evals[-1].items() if k.startswith(PER_TASK)})
        if evals[0]["step"] == -1:
            out["eval/gain"] = evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"]
        if target is not None:
            out["target/steps"] = steps_to_target(history, target)
        if "eval/format" in evals[-1]:
            out["eval/format"] = evals[-1]["eval/format"]
    for k in ("group/zero_std_frac", "adv/var", "sample/draws"):
        vals = [h[k] for h in steps if k in h]
        if vals:
            out[k] = sum(vals) / len(vals)
    trained = [h for h in steps if "reward/mean" in h]
    for k in ("policy/entropy", "completion/len_right", "completion/len_wrong"):
        vals = [h[k] for h in trained[-END_STEPS:] if k in h]
        if vals:
            out[k + "_end"] = sum(vals) / len(vals)
    return out


ROUNDING = 1e-6
"""Paired differences no larger than this fraction of the values compared are float rounding
(float32 metrics carry about 7 digits): no verdict from them."""

MIN_SEEDS = 3
"""Fewest values an interval may give a verdict from: with 2 a 95% t-interval reaches 12.7
standard errors either side of the mean (t on 1 degree of freedom; about 18 standard deviations
wide) or, when the 2 values agree, is zero wide; either way it says nothing."""


def can_tell(n: int, ci_low: float, ci_high: float) -> bool:
    """Whether an interval over n values may give a verdict: n >= MIN_SEEDS and a width
    above float rounding (1e-9 of the bounds' size: differences computed from equal values,
    0.7 - 0.6 and 0.8 - 0.7, differ in their last bits). A zero-width interval means the
    values are identical, not that the mean is certain."""
    return n >= MIN_SEEDS and ci_high - ci_low > 1e-9 * max(abs(ci_low), abs(ci_high))


NOT_A_NUMBER = ("a paired difference is NaN or infinite, as a run's value of the metric is; "
                "Results.per_run() names the run")
"""Why a comparison gives no verdict when a value is not a number (its interval is NaN, which
``can_tell`` refuses like a zero-width one). No ": " in it: primary_test keeps the sentence's
text after the last one."""


def censored(d: dict) -> str:
    """" (k more where an arm never reached the target, ...)" for a ``compare`` dict with
    censored seeds, else "": a time to target never reached is only known to be longer than
    the run, so it is no difference of steps, and it is said, not silently dropped (no ": "
    in it: primary_test keeps a sentence's text after the last one)."""
    k = d.get("censored", 0)
    return (f" ({k} more where an arm never reached the target, censored and left out of the "
            f"difference)" if k else "")


def difference_sentence(d: dict) -> str:
    """A ``Results.compare`` dict -> one sentence: is the difference real at 95%? No verdict
    from fewer than MIN_SEEDS paired seeds or a zero-width interval: "too few seeds to tell"."""
    head = f"{d['a']} - {d['b']} on {d['metric']}"
    if d["n"] < 2:
        return f"{head}: {d['n']} paired seed(s){censored(d)}, too few seeds to tell."
    what = (f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] "
            f"over {d['n']} paired seeds{censored(d)}: ")
    if not can_tell(d["n"], d["ci_low"], d["ci_high"]):
        why = (f"fewer than {MIN_SEEDS}" if d["n"] < MIN_SEEDS else NOT_A_NUMBER
               if not math.isfinite(d["mean"]) else "identical differences, a zero-width interval")
        return f"{head}: {what}too few seeds to tell ({why})."
    if d.get("rounding"):
        return (f"{head}: {what}no difference beyond float rounding of the values (every "
                f"paired difference within {ROUNDING:g} of their size): no verdict.")
    real = d["ci_low"] > 0 or d["ci_high"] < 0
    return (head + ": " + what
            + ("the interval excludes 0, a real difference." if real else
               "the interval includes 0, not distinguishable from seed noise."))


def lead_sentence(d: dict) -> str:
    """A comparison that is not the study's question: its interval, and at the sd's upper
    bound what it could have detected, without a verdict ("lead", not a test)."""
    head = f"lead: {d['a']} - {d['b']} on {d['metric']}"
    if not can_tell(d["n"], d["ci_low"], d["ci_high"]) or d.get("rounding"):  # MIN_SEEDS too
        return head + difference_sentence(d)[len(head) - len("lead: "):]
    text = (f"{head}: {d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] over "
            f"{d['n']} paired seeds{censored(d)}, interval "
            f"{'excludes' if d['excludes_zero'] else 'includes'} 0")
    if d.get("detectable") is not None:
        text += (f"; 80% power for {d['detectable']:.3g} at the sd's 95% upper bound "
                 f"(rough, at the observed sd: {d['detectable_rough']:.3g})")
    return text + "."


@dataclass
class Results:
    runs: list[dict]
    """One {"strategy", "seed", "history"} per run, in (strategy, seed) order."""
    target: float | None = None
    """The held-out accuracy the target/* metrics measure the way to (None: not measured)."""
    out_dir: str | None = None
    """The study's folder (None: a temporary one, gone)."""
    notes: list = field(default_factory=list)
    """Warnings about the study as a whole (mixed plugin versions)."""
    plan: dict | None = None
    """The pilot's forecast: seconds_per_step, total_s, sd, detectable, lines (None: none)."""
    grid: list = field(default_factory=list)
    """Steps trained at each evaluation (0: the base): what target/steps was measured on."""
    primary: dict | None = None
    """The study's question, declared before it ran: {"a", "b", "metric"} (a - b on metric,
    paired by seed); its verdict is a test, every other comparison a lead (``primary_test``).
    "default": True when run_experiment chose it; "declared": how it was declared when not
    before the run (a stored study's question, named from its write-up). None: no question
    declared (a table only)."""
    sequential: dict | None = None
    """Declared looks: {"looks": [seed counts], "spending", "alpha"} (sequential.py); None:
    one look."""
    looks: list = field(default_factory=list)
    """The seeds of each earlier look at this study's results (looks.json): a study grown by
    seeds after a look, without a declared sequential plan, tests its new seeds only."""
    disk: dict | None = None
    """What the study's folder holds on disk (``_disk``), None for a temporary folder."""

    @property
    def strategies(self) -> list[str]:
        return list(dict.fromkeys(r["strategy"] for r in self.runs))

    def per_run(self) -> list[dict]:
        """One row per run: strategy, seed and its run_metrics."""
        return [{"strategy": r["strategy"], "seed": r["seed"],
                 **run_metrics(r["history"], self.target)} for r in self.runs]

    def rows(self) -> list[dict]:
        """Tidy: one row per strategy x metric (strategy, metric, mean, ci_low, ci_high, n,
        values); a metric no run of the strategy has is left out; None values (target never
        reached) are not counted in n."""
        per, out = self.per_run(), []
        for s in self.strategies:
            for m in METRICS:
                vals = [r[m] for r in per if r["strategy"] == s and r.get(m) is not None]
                wanted = m.startswith("target/") and self.target is not None
                if vals or wanted:
                    mean, lo, hi = mean_ci(vals)
                    out.append({"strategy": s, "metric": m, "mean": mean, "ci_low": lo,
                                "ci_high": hi, "n": len(vals), "values": vals})
        return out

    def compare(self, a: str, b: str, metric: str = "eval/accuracy", seeds=None) -> dict:
        """Paired difference a - b on ``metric`` over the seeds both have (of ``seeds``:
        default all) -> {a, b, metric, mean, ci_low, ci_high, n, values, censored,
        excludes_zero}; excludes_zero is False when the interval cannot tell (``can_tell``:
        fewer than 3 seeds or a zero-width interval); censored: the seeds both arms ran on a
        target/* metric where either never reached the target (None), not in n."""
        for s in (a, b):
            lookup(self.strategies, s, "strategy")
        metric_info(metric)
        per = {(r["strategy"], r["seed"]): r.get(metric) for r in self.per_run()
               if seeds is None or r["seed"] in seeds}
        pairs = [(per[a, seed], per[b, seed]) for (s, seed) in per
                 if s == a and (b, seed) in per]
        cens = (sum(x is None or y is None for x, y in pairs) if metric.startswith("target/")
                else 0)
        pairs = [(x, y) for x, y in pairs if x is not None and y is not None]   # same seed
        diffs = [x - y for x, y in pairs]
        mean, lo, hi = mean_ci(diffs)
        # differences as small as float rounding of the values compared (two arms that
        # computed the same thing in another order) are no difference, however consistent
        scale = max((max(abs(x), abs(y)) for x, y in pairs), default=0.0)
        rounding = (can_tell(len(diffs), lo, hi)
                    and max(abs(d) for d in diffs) <= ROUNDING * scale)
        return {"a": a, "b": b, "metric": metric, "mean": mean, "ci_low": lo, "ci_high": hi,
                "n": len(diffs), "values": diffs, "censored": cens, "rounding": rounding,
                "excludes_zero": (can_tell(len(diffs), lo, hi) and not rounding
                                  and (lo > 0 or hi < 0))}

    def _table(self) -> tuple[list[str], list[list[str]]]:
        """Strategies as rows, metrics as "mean ± half-width" cells (n when not every seed)."""
        rows = {(r["strategy"], r["metric"]): r for r in self.rows()}
        metrics = [m for m in METRICS if any(rm == m for _, rm in rows)]
        seeds = len({r["seed"] for r in self.runs})   # the legend's count, for every arm:
        body = [[s] + [_cell(rows.get((s, m)), METRICS[m][1], seeds) for m in metrics]
                for s in self.strategies]                  # an arm short of a seed: "(2/3)"
        return ["strategy"] + metrics, body

    def to_markdown(self) -> str:
        """The table; below it, for a study with a declared question, the question's test
        and the leads (``question_lines``)."""
        head, body = self._table()
        lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        if self.primary is not None:
            lines += ["", *self.question_lines()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html
        head, body = self._table()
        th = "".join(f"<th>{h}</th>" for h in head)
        tr = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in body)
        below = ""
        if self.primary is not None:
            bold = lambda t: re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(t))  # noqa: E731
            items = [x for x in self.question_lines() if x]
            below = "".join(f"<li>{bold(x[2:])}</li>" if x.startswith("- ") else
                            f"<p>{bold(x)}</p>" for x in items)
        return (f"<table><thead><tr>{th}</tr></thead><tbody>{tr}</tbody></table>"
                f"<p>{self._legend()}</p>{below}")

    def _legend(self) -> str:
        n = len({r["seed"] for r in self.runs})
        if n < MIN_SEEDS:
            return (f"mean over {n} seed(s): too few seeds to tell, no interval "
                    f"(an interval needs at least {MIN_SEEDS})")
        text = f"mean ± half-width of the 95% t-interval over {n} seeds"
        if self.target is not None and self.grid:
            text += (f"; target/steps interpolated between the evaluations at steps "
                     f"{self.grid}")
        return text

    def __repr__(self) -> str:
        """Short: the strategies, seeds and runs, then the table (not every history)."""
        seeds = sorted({r["seed"] for r in self.runs})
        return (f"Results({len(self.strategies)} strategies x {len(seeds)} seeds {seeds}, "
                f"{len(self.runs)} runs, target={self.target})\n{self.to_markdown()}\n"
                f"{self._legend()}")

    def save(self, path, keys=None) -> None:
        """The study as a small JSON file: every run's history cut to ``keys`` (metric names;
        default all), its findings and device, and the study's target, grid, notes and plan; read back
        by ``Results.load`` (notebook 12 shows stored studies this way). ``step``,
        ``reward/mean`` (what marks a trained step for the *_end metrics) and the per-task
        ``eval/accuracy/<task>`` are always kept."""
        keys = None if keys is None else {"step", "reward/mean", *keys}
        keep = (lambda h: h) if keys is None else (
            lambda h: {k: h[k] for k in h if k in keys or k.startswith(PER_TASK)})
        runs = [{"strategy": r["strategy"], "seed": r["seed"],
                 "history": [keep(h) for h in r["history"]], "findings": r.get("findings", []),
                 "device": r.get("device")}
                for r in self.runs]
        write_lines_atomic(Path(path), [json.dumps(
            {"runs": runs, "target": self.target, "grid": self.grid, "notes": self.notes,
             "plan": self.plan, "primary": self.primary, "sequential": self.sequential,
             "looks": self.looks}, default=float)])

    @classmethod
    def from_folder(cls, out_dir) -> "Results":
        """The finished runs of the study in ``out_dir`` (its study.json and each run's
        result.json), without running anything: a study read while another part of it runs,
        or after. A run not finished yet is left out (``notes`` says which)."""
        root = Path(out_dir)
        spec = _read_json(root / STUDY_FILE, "the study's spec")
        runs, missing = [], []
        for name in spec["strategies"]:
            for s in spec["seeds"]:
                folder = root / "runs" / _slug(name) / f"seed{s}"
                if not (folder / RESULT_FILE).exists():
                    missing.append(f"{name} seed {s}")
                    continue
                runs.append(_run_row(name, s, folder, str(folder)))
        notes = [f"not finished: {', '.join(missing)}"] if missing else []
        grid = sorted({h["step"] + 1 for r in runs for h in r["history"]
                       if "eval/accuracy" in h})
        return cls(runs, spec["target"], out_dir=str(root), notes=notes, grid=grid,
                   primary=spec.get("primary"), sequential=spec.get("sequential"),
                   looks=_looks(root))

    def differences(self, reference: str, metrics=None, power: float = 0.8) -> list[dict]:
        """Every other strategy against ``reference``, paired by seed, on each of ``metrics``
        (default: every METRICS entry the runs have): ``compare``'s dict plus ``sd`` (of the
        paired differences), ``detectable`` (the smallest true difference these seeds find
        with probability ``power`` at the sd's one-sided 95% upper bound on n - 1 degrees of
        freedom: power.detectable; each comparison's own sd, no pooling, since arms need not
        share a spread), ``detectable_rough`` (the same at the observed sd: rough), both None
        below MIN_SEEDS or with no spread; ``role`` ("primary": the study's declared
        question, whose verdict is ``primary_test``'s; else "lead": an interval to follow up,
        not a test), ``sentence`` and ``verdict`` (a few words: "excludes 0", ...)."""
        per = self.per_run()
        metrics = [m for m in (metrics or METRICS) if any(m in r for r in per)]
        out = []
        for s in self.strategies:
            if s == reference:
                continue
            for m in metrics:
                d = self.compare(s, reference, m)
                if d["n"] == 0:
                    continue
                sd = float(torch.tensor(d["values"], dtype=torch.float64).std()) \
                    if d["n"] >= 2 else 0.0
                ok = (can_tell(d["n"], d["ci_low"], d["ci_high"]) and sd > 0     # a spread
                      and not d["rounding"])                                # beyond rounding
                found = detectable(sd, d["n"], d["n"] - 1, power) if ok else {}
                d.update(sd=sd, detectable=found.get("detectable"),
                         detectable_rough=found.get("rough"))
                d["role"] = "primary" if self._is_primary(s, reference, m) else "lead"
                d["verdict"] = ("excludes 0" if d["excludes_zero"] else
                                "too few seeds" if d["n"] < MIN_SEEDS else
                                "float rounding: no difference" if d["rounding"] else
                                "includes 0" if can_tell(d["n"], d["ci_low"], d["ci_high"])
                                else "not a number" if not math.isfinite(d["mean"])
                                else "no spread: every seed's difference is the same")
                d["sentence"] = (self.primary_test()["sentence"] if d["role"] == "primary"
                                 else lead_sentence(d))
                out.append(d)
        return out

    def _is_primary(self, a: str, b: str, metric: str) -> bool:
        p = self.primary
        return p is not None and (p["a"], p["b"], p["metric"]) == (a, b, metric)

    def primary_test(self) -> dict:
        """The test of the declared question (``primary``) -> ``compare``'s dict over the
        seeds tested plus ``p`` (paired t-test), ``level`` (the p it must reach), ``seeds``,
        ``rejects`` and ``sentence``. One look: level 0.05 over every seed; a study grown by
        seeds after a look without a declared plan is a new study: only the seeds added
        since the last look are tested (the rest become a lead); a declared sequential plan:
        the look's nominal level (sequential.nominal_levels)."""
        if self.primary is None:
            raise ValueError("this study declared no primary question (primary=)")
        a, b, metric = self.primary["a"], self.primary["b"], self.primary["metric"]
        seeds = sorted({r["seed"] for r in self.runs})
        head, level, how = f"primary question: {a} - {b} on {metric}", 0.05, ""
        if self.sequential:
            looks = self.sequential["looks"]
            if len(seeds) not in looks:
                d = self.compare(a, b, metric)
                return {**d, "p": math.nan, "level": None, "seeds": seeds, "rejects": False,
                        "sentence": f"{head}: {len(seeds)} seeds is not one of the declared "
                                    f"looks {looks}: no test (a lead only: "
                                    f"{lead_sentence(d)})"}
            k = looks.index(len(seeds))
            level = nominal_levels(looks, self.sequential.get("alpha", 0.05),
                                   self.sequential["spending"])[k]
            how = (f"look {k + 1} of {len(looks)} ({self.sequential['spending']} spending "
                   f"over looks at {looks} seeds), ")
        else:
            before = [set(x) for x in self.looks if set(x) < set(seeds)]
            if before:
                seen = max(before, key=len)
                seeds = [s for s in seeds if s not in seen]
                how = (f"a new study: the seeds added after a look at seeds {sorted(seen)}, "
                       f"{seeds} (the earlier seeds are a lead), ")
        d = self.compare(a, b, metric, seeds=seeds)
        p = paired_p(d["values"]) if can_tell(d["n"], d["ci_low"], d["ci_high"]) else math.nan
        rejects = bool(p <= level) and not d["rounding"] and d["n"] >= MIN_SEEDS
        what = (f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] over {d['n']} "
                f"paired seeds{censored(d)}" if d["n"] >= 2 else
                f"{d['n']} paired seed(s){censored(d)}")
        if d["n"] < MIN_SEEDS or not math.isfinite(p) or d["rounding"]:
            verdict = difference_sentence(d).split(": ")[-1]
            verdict = "no test: " + verdict[0].lower() + verdict[1:]
        else:
            sd = float(np.std(d["values"], ddof=1))
            found = detectable(sd, d["n"], d["n"] - 1)
            d.update(sd=sd, detectable=found["detectable"], detectable_rough=found["rough"])
            verdict = (f"p = {p:.3g} {'<=' if rejects else '>'} {level:.3g}: "
                       + ("rejects" if rejects else "does not reject") + " no difference"
                       f"; 80% power for {found['detectable']:.3g} at the sd's 95% upper "
                       f"bound (rough, at the observed sd: {found['rough']:.3g}).")
        return {**d, "p": p, "level": level, "seeds": seeds, "rejects": rejects,
                "sentence": f"{head} ({how}paired t-test): {what}: {verdict}"}

    def question_lines(self, reference: str | None = None, metrics=None) -> list[str]:
        """The study's question and its test, then every other comparison with ``reference``
        (default: the primary's b, else the first arm) on ``metrics`` (default: the
        primary's metric) as a lead: what markdown, HTML and ``grpo-lab study`` show below
        the table."""
        names = self.strategies
        if len(names) < 2:
            return []
        reference = reference or (self.primary or {}).get("b") or names[0]
        lines = []
        if self.primary is not None:
            said = self.primary.get("declared") or (
                "declared before the study ran" if not self.primary.get("default") else
                "by default: the second arm against the first on eval/accuracy, declared "
                "before the study ran")
            lines += [f"**Primary question** ({said}):", "",
                      self.primary_test()["sentence"], ""]
        metrics = metrics or [(self.primary or {}).get("metric", "eval/accuracy")]
        leads = [d for d in self.differences(reference, metrics) if d["role"] == "lead"]
        if leads:
            lines += ["**Leads** (intervals to follow up, not tests: a lead that excludes 0 "
                      "is a question for a new study):", ""]
            lines += [f"- {d['sentence']}" for d in leads]
        return lines

    @classmethod
    def load(cls, path) -> "Results":
        """A study written by ``save``."""
        d = _read_json(Path(path), "a study written by Results.save")
        if not isinstance(d, dict) or "runs" not in d:      # e.g. data/studies/*_samples.json
            raise ValueError(f"{path} is not a study written by Results.save (no 'runs' in it)")
        return cls(d["runs"], d["target"], notes=d["notes"], plan=d["plan"], grid=d["grid"],
                   primary=d.get("primary"), sequential=d.get("sequential"),
                   looks=d.get("looks", []))

    def plot(self, metric: str = "eval/accuracy", ax=None):
        """Mean of ``metric`` vs step per strategy, with a min-max band over seeds -> Figure."""
        import matplotlib.pyplot as plt
        fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(7, 4))
        for s in self.strategies:
            curves = [{h["step"]: h[metric] for h in r["history"] if metric in h}
                      for r in self.runs if r["strategy"] == s]
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            if not steps:
                continue
            vals = torch.tensor([[c[t] for t in steps] for c in curves])  # (seeds, steps)
            line, = ax.plot(steps, vals.mean(0), label=f"{s} (n={len(curves)})")
            ax.fill_between(steps, vals.min(0).values, vals.max(0).values,
                            color=line.get_color(), alpha=0.2)
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric}: mean over seeds, band = min-max")
        ax.legend(fontsize=8)
        return fig


def _cell(r: dict | None, fmt: str, seeds: int) -> str:
    if r is None or r["n"] == 0:
        return "-" if r is None else f"never (0/{seeds})"
    text = format(r["mean"], fmt)
    if r["n"] >= MIN_SEEDS:      # fewer: no interval shown (a 2-seed one is noise or zero wide)
        text += " ± " + format((r["ci_high"] - r["ci_low"]) / 2, fmt.lstrip("+"))
    return text + (f" ({r['n']}/{seeds})" if r["n"] < seeds else "")


# ---------------------------------------------------------------- the study runner
STUDY_FILE = "study.json"        # the study's spec: what a resume must match
BASE_FILE = "base.json"          # the shared base evaluations, one per evaluation setting
RESULT_FILE = "result.json"      # in a run's folder once it finished: history and findings
LOOKS_FILE = "looks.json"        # the seeds of each look at the study's results
EVAL_FIELDS = ("policy", "base_checkpoint", "task", "eval_size", "answer_format",
               "system_prompt", "reward_weights", "max_new_tokens", "hf", "plugins")
"""What the base policy's evaluation depends on (greedy: not the seed, not the training
knobs); runs that agree on these share one evaluation of the base."""


@dataclass
class Job:
    """One (strategy, seed) run, everything a worker needs in it: a spawned worker (macOS,
    Windows) inherits no module state, so nothing is read from globals."""
    name: str
    seed: int
    cfg: object                   # TrainConfig, out_dir = the run's folder
    base_eval: dict | None        # the shared step -1 evaluation (None: the run evaluates)
    reward_models: dict           # reward_model.ACTIVE of the caller (use_reward_model)
    keep: bool = True             # keep the run's checkpoint once it has its result.json


KEEP = ("none", "final", "all")
"""What a study keeps of its runs' checkpoints once each run has its result.json: none (the
default: a study reads only result.json; a checkpoint lives while its run is unfinished, so
a stopped run resumes from it), final (every run's last checkpoint, the trained policy),
all (the pilot's too)."""
CHECKPOINT = "checkpoint.safetensors"


def _drop_checkpoint(folder: Path) -> None:
    """Delete a run's checkpoint: the file and, for ckpt_format dcp, its shard folder."""
    import shutil
    (folder / CHECKPOINT).unlink(missing_ok=True)
    shutil.rmtree(folder / "checkpoint.dcp", ignore_errors=True)


def _read_json(path: Path, what: str):
    """A study file -> its JSON; unreadable: an error naming the path and what to do."""
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({type(e).__name__}: {e}): {what}") from None


RESULT_BAD = "delete it and resume the study to run this run again"


def _write_json(path: Path, obj) -> None:
    write_lines_atomic(path, [json.dumps(obj) + "\n"])


def _run_job(job: Job, on_step=None) -> tuple[str, int, str | None]:
    """Train ``job`` into its folder, write its report and result.json (history, and as
    findings the trainer's health lines and the run's warnings, e.g. a grouper that fell
    back to by_prompt) -> (name, seed, None), or (name, seed, traceback). A folder holding
    the checkpoint of a stopped run resumes from it (exactly: trainer.py); without
    ``job.keep`` the checkpoint is deleted once result.json is written."""
    try:
        from grpo_lab.training import reward_model
        reward_model.ACTIVE.update(job.reward_models)
        folder = Path(job.cfg.out_dir)
        resume = (folder / CHECKPOINT).exists()
        steps_here: list = []                         # the steps trained in this call

        def each_step(metrics, policy):
            steps_here.append(metrics["step"])
            if on_step is not None:
                on_step(metrics, policy)
        said = io.StringIO()                          # the trainer's health lines, kept
        with contextlib.redirect_stdout(said), warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("default")          # each distinct warning once
            history = train(job.cfg, resume=resume, progress=False, on_step=each_step,
                            base_eval=job.base_eval)
        findings = [line for line in said.getvalue().splitlines()
                    if line.strip() and not line.startswith("grpo-lab: note: took over")]
        findings += [f"warning: {w.category.__name__}: {w.message}" for w in warned]
        if resume:
            findings.insert(0, f"resumed from its checkpoint: steps {steps_here[0]}-"
                               f"{steps_here[-1]} trained now" if steps_here else
                               "resumed from its checkpoint: every step was done")
        write_report(history, job.cfg.out_dir, to_dict(job.cfg))
        _write_json(folder / RESULT_FILE,
                    {"strategy": job.name, "seed": job.seed, "history": history,
                     "findings": findings, "checkpoint_bytes": _size(folder, "checkpoint*"),
                     "device": job.cfg.speed.device or "cpu"})
        if not job.keep:
            _drop_checkpoint(folder)
        return job.name, job.seed, None
    except Exception:
        return job.name, job.seed, traceback.format_exc()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("_") or "arm"


def _eval_key(cfg) -> str:
    d = to_dict(cfg)
    return json.dumps({k: d[k] for k in EVAL_FIELDS} | {"max_new": max_new_tokens(cfg)},
                      sort_keys=True, default=str)


def _run_row(name: str, seed: int, folder: Path, out_dir: str | None) -> dict:
    """A finished run as ``Results.runs`` holds it, read from its folder's result.json."""
    r = _read_json(folder / RESULT_FILE, RESULT_BAD)
    return {"strategy": name, "seed": seed, "history": r["history"], "findings": r["findings"],
            "out_dir": out_dir, "device": r.get("device")}


def _base_evaluations(jobs: list, root: Path, device: str = "") -> dict:
    """{eval key: the base policy's evaluation} for every setting the runs use, each
    evaluated once (here, on every core, or on ``device``: the study's first GPU) and kept in
    root/base.json; its samples go to root/base/samples.jsonl."""
    path = root / BASE_FILE
    done = _read_json(path, "the base policy's evaluations; delete it to evaluate again") \
        if path.exists() else {}
    for name, seed, cfg in jobs:
        key = _eval_key(cfg)
        if key in done or not cfg.eval_size:
            continue
        rows: list = []
        try:
            load_plugins(cfg.plugins)
            run = setup(on_device(cfg, device) if device else cfg)
            done[key] = evaluate_tasks(run.policy, run.eval_sets, cfg.reward_weights,
                                       max_new_tokens(cfg), samples=rows)
        except Exception as e:
            raise RuntimeError(f"the base evaluation of strategy {name!r}, seed {seed} "
                               f"failed: {type(e).__name__}: {e}") from e
        (root / "base").mkdir(exist_ok=True)
        append_samples(root / "base", -1, rows)
        _write_json(path, done)
        del run
        if device:
            torch.cuda.empty_cache()           # the runs' GPU memory, not this process's cache
    return done


def _run_all(jobs: list[Job], processes: int, method: str, progress: bool,
             in_process: bool, devices: list[str] = ()) -> None:
    """Run ``jobs``, here one after another (``in_process``) or each in a worker process of
    its own (``processes`` at once, started by ``method``: workers.py), a line per evaluation
    and the trainer's health lines named by strategy and seed. With ``devices`` (GPUs) each
    run trains on a free one of the first ``processes`` (placement.py): never two at once on
    one."""
    if not jobs:
        return
    slots = Slots(list(devices)[:processes]) if devices else None

    def place(j: Job) -> Job:                 # a run starts: its device is a free slot
        return j if slots is None else dataclasses.replace(j, cfg=on_device(j.cfg, slots.take()))

    def release(j: Job) -> None:              # it ended: the slot is free again
        if slots is not None:
            slots.give(j.cfg.speed.device)
    steps = {(j.name, j.seed): j.cfg.steps for j in jobs}
    bar = tqdm(total=sum(steps.values()), desc=f"{len(jobs)} runs", disable=not progress)
    out = sys.stdout                  # here, not the run's captured stdout (its health lines)
    say = (lambda line: bar.write(line, file=out)) if progress else (lambda _line: None)

    def show(j: Job, row: dict) -> None:      # a metrics row: the bar, and a line per evaluation
        bar.update()
        if "eval/accuracy" in row:
            extra = "".join(f", {k} {row[k]:.3f}" for k in ("eval/format",) if k in row)
            say(f"[{j.name} seed {j.seed}] step {row['step'] + 1}/{j.cfg.steps}: eval/accuracy "
                f"{row['eval/accuracy']:.3f}{extra}")

    def finished(name, seed, err):
        if err is not None:
            raise RuntimeError(f"run of strategy {name!r}, seed {seed} failed:\n{err}")
        folder = next(Path(j.cfg.out_dir) for j in jobs if (j.name, j.seed) == (name, seed))
        for line in _read_json(folder / RESULT_FILE, RESULT_BAD)["findings"]:
            say(f"[{name} seed {seed}] {line}")

    threads = torch.get_num_threads()      # train() sets its own; give the caller back its own
    try:
        if in_process:
            for j in jobs:
                j = place(j)
                res = _run_job(j, lambda m, policy, j=j: show(j, m))
                release(j)
                finished(*res)
            return
        seen = {(j.name, j.seed): 1 for j in jobs}            # metrics.jsonl lines read (step -1)
        done: set = set()

        def tick():                                   # progress: the runs' metrics files
            for j in jobs:
                key = (j.name, j.seed)
                log = Path(j.cfg.out_dir) / "metrics.jsonl"
                if key in done or not log.exists():
                    continue
                for text in log.read_text().splitlines()[seen[key]:]:
                    try:
                        row = json.loads(text)
                    except json.JSONDecodeError:      # a line being written: next time
                        break
                    seen[key] += 1
                    show(j, row)

        def result(job, res):
            if isinstance(res, BaseException):        # the worker's own wrapper failed
                res = (job.name, job.seed, f"{type(res).__name__}: {res}")
            key = (job.name, job.seed)
            done.add(key)
            release(job)
            bar.update(max(0, steps[key] - seen[key] + 1))
            finished(*res)

        run_in_workers(jobs, processes, method, _run_job, result, tick,
                       describe=lambda j: f"{j.name} seed {j.seed}", on_start=place)
    finally:
        bar.close()
        torch.set_num_threads(threads)


def _plan(pilot_runs: list, pilot_wall_s: float, pilot_procs: int, cfgs: list, n_pending: int,
          processes: int, seeds, sd, effect, pilot_steps: int, sd_df: int | None = None) -> dict:
    """The cost forecast and the detectable difference -> a dict with the sentences. Cost:
    a run's steps x the pilot's seconds a step, its evaluations x the pilot's seconds an
    evaluation, plus the pilot's per-run overhead (start, policy load, report: its wall time
    per wave minus its steps and evaluation), per wave of ``processes`` runs."""
    plan: dict = {"lines": []}
    if pilot_runs:
        rows = [h for r in pilot_runs for h in r if h["step"] >= 0]
        s_step = sum(h["time/step_s"] for h in rows) / len(rows)
        evals = [r[-1]["time/elapsed_s"] - sum(h["time/step_s"] for h in r if h["step"] >= 0)
                 for r in pilot_runs if "eval/accuracy" in r[-1]]
        s_eval = max(0.0, sum(evals) / len(evals)) if evals else 0.0
        pilot_waves = math.ceil(len(pilot_runs) / pilot_procs)
        overhead = max(0.0, pilot_wall_s / pilot_waves - pilot_steps * s_step - s_eval)
        per_run = [c.steps * s_step + len(_grid(c)[1:]) * s_eval + overhead for c in cfgs]
        waves = math.ceil(n_pending / processes)
        total = waves * (sum(per_run) / len(per_run))
        plan.update(seconds_per_step=s_step, seconds_per_eval=s_eval, overhead_s=overhead,
                    total_s=total)
        plan["lines"].append(
            f"cost here: {s_step:.2f} s a step, {s_eval:.1f} s an evaluation and {overhead:.1f} "
            f"s a run to start (pilot: {len(pilot_runs)} seeds x {pilot_steps} steps of the "
            f"first arm, {pilot_procs} at once) -> {n_pending} runs in {waves} wave(s) of "
            f"{processes}: about {total / 60:.1f} min")
        accs = [r[-1]["eval/accuracy"] for r in pilot_runs if "eval/accuracy" in r[-1]]
        if sd is None and len(accs) >= 2:
            m = sum(accs) / len(accs)
            spread = math.sqrt(sum((a - m) ** 2 for a in accs) / (len(accs) - 1))
            plan["pilot_sd"] = spread
            if spread > 0:
                sd, sd_df = math.sqrt(2) * spread, len(accs) - 1
                plan["sd_source"] = (f"sqrt(2) x the pilot's seed-to-seed sd of eval/accuracy "
                                     f"after {pilot_steps} steps, {spread:.4f} on {sd_df} "
                                     f"degrees of freedom (no pairing credit; the spread after "
                                     f"the study's steps is usually larger)")
            elif cfgs and cfgs[0].eval_size:
                # a fallback, not a measurement: the spread of a binomial accuracy on
                # eval_size items at p = 0.5 (its largest), per run, sqrt(2) for a difference
                sd, sd_df = math.sqrt(2 * 0.25 / cfgs[0].eval_size), None
                plan["sd_source"] = (f"assumed: the pilot's {len(accs)} seeds agree exactly "
                                     f"(sd 0 says nothing), so sqrt(2) x 0.5 / "
                                     f"sqrt(eval_size={cfgs[0].eval_size}), a binomial spread "
                                     f"of the held-out accuracy at p = 0.5; lengthen the pilot "
                                     f"or pass sd= from a finished study")
    if sd is not None:
        plan.setdefault("sd_source", "given" + (f", estimated on {sd_df} degrees of freedom"
                                                if sd_df is not None else
                                                " without its degrees of freedom: taken as "
                                                "exact (pass sd_df to bound it)"))
        plan.update(sd=sd, sd_df=sd_df)
        n = len(seeds)
        if n < MIN_SEEDS:
            plan["lines"].append(f"can detect: nothing with {n} seed(s); a comparison gives no "
                                 f"verdict from fewer than {MIN_SEEDS}")
        else:
            d = detectable(sd, n, sd_df)
            plan.update(detectable=d["detectable"], detectable_rough=d["rough"],
                        sd_bound=d["sd_bound"])
            bound = (f"the 95% upper bound {d['sd_bound']:.4f} of the sd of the difference"
                     if sd_df is not None else f"the sd of the difference, {sd:.4f}")
            plan["lines"].append(
                f"can detect: a paired difference in eval/accuracy of {d['detectable']:.3f} or "
                f"more, 80% of the time at alpha 0.05, with {n} seeds (paired t-test at "
                f"{bound}; sd {plan['sd_source']})"
                + (f"; rough, at the observed sd {sd:.4f}: {d['rough']:.3f}"
                   if sd_df is not None else ""))
        if effect is not None:
            plan["seeds_for_effect"] = seeds_needed(effect, sd, df=sd_df)
            plan["lines"].append(f"seeds needed to see a difference of {effect} at 80% power: "
                                 f"{plan['seeds_for_effect']}"
                                 + (" (at the sd's 95% upper bound)" if sd_df is not None
                                    else ""))
    return plan


def run_experiment(strategies: dict[str, dict], seeds=(0, 1, 2), base: dict | None = None,
                   processes: int | None = None, target: float | None = None,
                   progress: bool = True, *, base_preset: str = "defaults",
                   out_dir: str | None = None, resume: bool = False, pilot_steps: int = 0,
                   sd: float | None = None, effect: float | None = None,
                   sd_df: int | None = None, primary=None, sequential: dict | None = None,
                   start_method: str | None = None, keep: str = "none",
                   plan_only: bool = False, in_process: bool | None = None,
                   devices="auto") -> Results:
    """Train every strategy (TrainConfig overrides on top of ``base``, itself overrides of
    the ``base_preset`` preset: "defaults", "smollm_cpu", any) with every seed -> Results.

    Paired by step: every run trains ``steps`` steps on the same eval grid (a time budget or
    a target_accuracy given is refused, a preset's is turned off; arms that change steps or
    eval_every are refused), so seed s of two strategies draws the same prompts at step s.
    Runs go to ``processes`` worker processes (default: one per core, at most one per run;
    1 runs them here unless ``in_process`` is False) of cores // processes threads each,
    started by ``start_method`` (default fork where there is one and a worker has one thread,
    else spawn: a forked worker of several threads can hang in OpenMP; nothing is read from
    this process's globals, reward models set by use_reward_model travel with each run).

    ``out_dir``: the study's folder (default: a temporary one, deleted at the end): each run
    keeps its folder (runs/<strategy>/seed<s>: metrics, samples, report, result.json once
    finished, and its checkpoint as ``keep`` says); the base policy is evaluated once per evaluation setting
    (base.json, its samples in base/); ``resume`` continues a study there, running only the
    runs without a result.json (the spec must be the same, but for seeds added: a study
    grows by seeds without rerunning the ones it has). ``pilot_steps`` > 0: first train
    the first arm that many steps on each seed, then print what the study will cost here and
    the smallest paired difference it can detect (80% power, alpha 0.05: power.py) from the
    pilot's seed spread or from ``sd`` (the seed-to-seed sd of a paired difference,
    estimated on ``sd_df`` degrees of freedom), each at the sd's 95% upper bound, and, given
    ``effect``, the seeds that difference needs; ``plan_only``: stop there (Results
    with no runs, its ``plan`` set; no study.json is written). ``target``: a held-out
    accuracy; the target/steps metric measures the steps to it (interpolated between
    evaluations). ``primary``: the study's question, (a, b) or (a, b, metric) or a dict:
    a - b on metric (default eval/accuracy), paired by seed; stored in study.json before any
    run; its verdict is a test (``Results.primary_test``), every other comparison a lead.
    Default: the second arm against the first on eval/accuracy. ``sequential``: looks
    declared in advance, {"looks": [3, 5], "spending": "obrien_fleming" or "pocock",
    "alpha": 0.05} (sequential.py): seeds must be one of the looks, and each look tests at
    its spent level; without it, a study grown by seeds after a look tests only the seeds
    added since (a new study). ``keep``: the checkpoints kept once runs finish (KEEP). ``in_process``:
    train here rather than in worker processes (default: when ``processes`` is 1).
    ``devices``: where the runs train (placement.py): "auto" (every GPU torch sees, else the
    CPU), "cpu", GPU indices ("0,2", ["cuda:1"]) or an int (the first N GPUs). On N GPUs at
    most N runs train at once (``processes``, default N), each on a GPU of its own, in spawned
    workers; the base is evaluated on the first. Each run's device is in its result.json and
    ``Results.runs``; study.json records the devices used.

    Stopping: SIGINT, SIGTERM or SIGHUP kill the workers at once and raise
    ``workers.StudyInterrupted``; kill -9 of this process ends them too (workers.py). A run
    stopped part-way resumes from its own last checkpoint (every ``ckpt_every`` steps) when
    the study is resumed."""
    lookup(KEEP, keep, "keep")
    _check_study_inputs(strategies, seeds, processes, target, pilot_steps)
    base = dict(base or {})
    for where, d in [("base", base), *((f"strategy {n!r}", s) for n, s in strategies.items())]:
        if {"seed", "out_dir"} & set(d) or "device" in (d.get("speed") or {}):
            raise ValueError(f"{where} sets seed, out_dir or speed.device: run_experiment sets "
                             f"them per run (devices= places the runs on GPUs)")
        if d.get("time_budget_s"):      # a budget cuts runs at different steps: not paired
            raise ValueError(f"{where} sets time_budget_s={d['time_budget_s']!r}: "
                             "run_experiment trains every run for the same steps so that "
                             "seeds pair up; set steps (or time_budget_s=0) instead")
        if d.get("target_accuracy"):
            raise ValueError(f"{where} sets target_accuracy={d['target_accuracy']!r}, which "
                             f"stops runs at different steps; pass target= to measure the "
                             f"steps to it instead")
    if resume and out_dir is None:
        raise ValueError("resume=True continues the study in out_dir: give out_dir")
    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {seeds}")
    primary = _primary(strategies, primary)
    sequential = _sequential(sequential, len(seeds))
    slugs = {}
    for name in strategies:
        if _slug(name) in slugs:
            raise ValueError(f"strategies {slugs[_slug(name)]!r} and {name!r} share the folder "
                             f"name {_slug(name)!r}: rename one")
        slugs[_slug(name)] = name
    cores = os.cpu_count() or 1
    n_jobs = len(strategies) * len(seeds)
    gpus = study_devices(devices)
    if gpus and processes and processes > len(gpus):
        raise ValueError(f"processes={processes} is more runs at once than the {len(gpus)} "
                         f"GPU(s) {gpus}: a study trains one run per GPU")
    processes = max(1, min(processes or (len(gpus) if gpus else cores), n_jobs))
    threads = int(base.get("threads") or max(1, cores // processes))
    if processes * threads > cores:
        raise ValueError(f"{processes} processes x threads={threads} is more than the {cores} "
                         f"cores here: lower processes or threads")
    # fork is quick (nothing imported again) but not safe for a worker of several threads:
    # this process's OpenMP team (libgomp, torch's CPU threads) does not survive a fork, and a
    # child that starts a parallel region waits on its barrier for ever (seen: a 2-thread
    # worker forked after the base evaluation hung in gomp_team_barrier_wait_end)
    if start_method == "fork" and threads > 1:
        raise ValueError(f"start_method='fork' with threads={threads} per worker can hang in "
                         f"OpenMP after the fork: use spawn or forkserver, or threads=1")
    # CUDA cannot run in a child forked from a process that initialised it (the study
    # evaluates the base on its first GPU): on GPUs the workers are spawned
    if start_method == "fork" and gpus:
        raise ValueError(f"start_method='fork' cannot train on the GPUs {gpus}: CUDA does not "
                         f"run in a forked child; use spawn or forkserver, or devices='cpu'")
    method = start_method or ("fork" if threads == 1 and not gpus and "fork" in
                              multiprocessing.get_all_start_methods() else "spawn")
    tmp = None if out_dir is not None else tempfile.TemporaryDirectory(prefix="grpo_lab_exp_")
    root = Path(out_dir if out_dir is not None else tmp.name)
    in_process = processes == 1 if in_process is None else in_process
    try:
        with stop_on_signals():
            return _study(strategies, seeds, base, processes, threads, method, target,
                          progress, base_preset, root, resume, pilot_steps, sd, effect,
                          out_dir, keep, plan_only, in_process, sd_df, primary, sequential,
                          gpus)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _check_study_inputs(strategies, seeds, processes, target, pilot_steps) -> None:
    """Raise ValueError naming the first of run_experiment's arguments that is not of its kind."""
    if not isinstance(strategies, dict) or not strategies:
        raise ValueError(f"strategies is a dict of arm name -> its config overrides, at least "
                         f"one (e.g. {{'baseline': {{}}}}), got {strategies!r:.80}")
    for name, overrides in strategies.items():
        if not isinstance(name, str) or not name.strip() or not isinstance(overrides, dict):
            raise ValueError(f"strategy {name!r}: an arm is a non-empty name with a dict of "
                             f"config overrides ({{}}: the base itself), got {overrides!r:.80}")
    if isinstance(seeds, (int, str)):
        raise ValueError(f"seeds is a list of seeds (e.g. range(3) or [0, 1, 2]), got {seeds!r}")
    if processes is not None:
        check_number("processes", processes, lambda x: x >= 1 and x == int(x), "a whole number "
                     ">= 1 (None: one per core)")
    if target is not None:
        check_number("target", target, lambda x: 0 < x <= 1, "a held-out accuracy in (0, 1]")
    check_number("pilot_steps", pilot_steps, lambda x: x >= 0 and x == int(x), "a whole number >= 0")


def _study(strategies, seeds, base, processes, threads, method, target, progress,
           base_preset, root: Path, resume, pilot_steps, sd, effect, out_dir, keep, plan_only,
           in_process, sd_df, primary, sequential, gpus) -> Results:
    spec = json.loads(json.dumps({"strategies": strategies, "seeds": list(seeds), "base": base,
                                  "base_preset": base_preset, "target": target}, default=str))
    spec.update(primary=primary, sequential=sequential)
    placed = {"devices": gpus or ["cpu"]}     # where this session's runs train: not matched
    spec_path = root / STUDY_FILE
    if spec_path.exists():
        saved = _read_json(spec_path, "the study's spec; restore it, or start the study in "
                                      "another out_dir")
        if not resume:
            raise ValueError(f"{root} holds a study ({STUDY_FILE}): resume=True (grpo-lab "
                             f"study --resume) continues it; or choose another out_dir")
        diff = {k: [saved.get(k), v] for k, v in spec.items() if saved.get(k) != v
                and (k in saved or k not in ("primary", "sequential"))}   # older study.json
        if set(diff) == {"seeds"} and set(saved["seeds"]) < set(spec["seeds"]):
            diff = {}                   # more seeds: the finished runs stay, the new ones run
        if diff:
            listed = "; ".join(f"{k}: saved {a!r}, given {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"cannot resume the study in {root}: {listed}")
    writable_folder(root)
    if not plan_only:
        _write_json(spec_path, spec | placed)
    cfgs, jobs_cfg = {}, []
    for name, overrides in strategies.items():
        try:
            cfg = preset(base_preset, **merge(base, overrides, {
                "threads": threads, "time_budget_s": 0.0, "target_accuracy": 0.0,
                "out_dir": "unused"}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"strategy {name!r} ({overrides}): {e}") from None
        cfgs[name] = cfg
        jobs_cfg += [(name, s, dataclasses.replace(
            cfg, seed=s, out_dir=str(root / "runs" / _slug(name) / f"seed{s}"))) for s in seeds]
    first = next(iter(cfgs.values()))
    for name, cfg in cfgs.items():                      # the same steps and eval grid
        for f in ("steps", "eval_every", "eval_size"):
            if getattr(cfg, f) != getattr(first, f):
                raise ValueError(f"strategy {name!r} has {f}={getattr(cfg, f)!r} where "
                                 f"{next(iter(cfgs))!r} has {getattr(first, f)!r}: every arm "
                                 f"trains the same steps on the same eval grid, so runs pair "
                                 f"by step")
    from grpo_lab.training import reward_model
    models = dict(reward_model.ACTIVE)
    done = {(n, s) for n, s, c in jobs_cfg if (Path(c.out_dir) / RESULT_FILE).exists()}
    todo = [(n, s, c) for n, s, c in jobs_cfg if (n, s) not in done]
    if progress and done:
        print(f"study {root}: {len(done)} of {len(jobs_cfg)} runs already finished, "
              f"{len(todo)} to run")
    base_evals = _base_evaluations(todo, root, gpus[0] if gpus else "") if todo else {}
    plan = None
    if plan_only and not (pilot_steps or sd is not None):
        raise ValueError("plan_only needs a pilot (pilot_steps > 0) or sd=: there is nothing "
                         "to plan from")
    if todo and (pilot_steps or sd is not None):
        pilots = []
        if pilot_steps:
            name = next(iter(cfgs))
            pilots = [Job(f"pilot {name}", s, dataclasses.replace(
                cfgs[name], seed=s, steps=pilot_steps, eval_every=pilot_steps, ckpt_every=10**9,
                out_dir=str(root / "pilot" / f"seed{s}")),
                base_evals.get(_eval_key(cfgs[name])), models, keep == "all") for s in seeds]
            for j in pilots:                  # a pilot always starts afresh
                _drop_checkpoint(Path(j.cfg.out_dir))
                (Path(j.cfg.out_dir) / RESULT_FILE).unlink(missing_ok=True)
            t0 = time.perf_counter()
            _run_all(pilots, min(processes, len(pilots)), method, progress, in_process, gpus)
            wall = time.perf_counter() - t0
        runs = [_read_json(Path(j.cfg.out_dir) / RESULT_FILE, "the pilot's; delete it")["history"]
                for j in pilots]
        plan = _plan(runs, wall if pilots else 0.0, min(processes, max(1, len(pilots))),
                     [c for _, _, c in todo], len(todo), processes, seeds, sd, effect,
                     pilot_steps, sd_df)
        for line in plan["lines"]:
            print(line)
    if plan_only:
        return Results([], target, out_dir=out_dir, plan=plan, grid=_grid(first))
    head = (f"study: {len(strategies)} arms x {len(seeds)} seeds = {len(jobs_cfg)} runs of "
            f"{first.steps} steps (preset {base_preset!r}), {processes} process(es) x "
            f"{threads} thread(s), start method {method}"
            + (f", one run per GPU of {', '.join(gpus)}" if gpus else ""))
    if progress:
        print(head)
    _run_all([Job(n, s, c, base_evals.get(_eval_key(c)), models, keep != "none")
              for n, s, c in todo], processes, method, progress, in_process, gpus)
    runs = [_run_row(n, s, Path(c.out_dir), c.out_dir if out_dir else None)
            for n, s, c in jobs_cfg]
    notes = []
    versions: dict = {}
    for r in runs:
        key = json.dumps(r["history"][0].get("plugins/sha256", {}), sort_keys=True)
        versions.setdefault(key, []).append(f"{r['strategy']} seed {r['seed']}")
    if len(versions) > 1:
        notes.append("mixed plugin versions in one study (a plugin file changed between "
                     "runs): " + "; ".join(f"{', '.join(v)}: {k}" for k, v in versions.items()))
        warnings.warn(notes[-1], RuntimeWarning, stacklevel=3)
    looks = _looks(root)
    grown = [x for x in looks if set(x) < set(seeds)]
    if grown and primary is not None and not sequential:
        notes.append(f"grown by seeds after a look at seeds {max(grown, key=len)}: the primary "
                     f"test is a new study's, on the seeds added since")
    if list(seeds) not in looks:
        _write_json(root / LOOKS_FILE, looks + [list(seeds)])
    return Results(runs, target, out_dir=out_dir, notes=notes, plan=plan,
                   grid=_grid(first), primary=primary, sequential=sequential,
                   looks=looks + [list(seeds)], disk=_disk(root, keep) if out_dir else None)


def _primary(strategies: dict, primary) -> dict | None:
    """``run_experiment``'s primary= -> {"a", "b", "metric"} (and "default": True when not
    given); a name or metric that is not the study's is an error naming it."""
    names = list(strategies)
    if primary is None:
        return (None if len(names) < 2 else
                {"a": names[1], "b": names[0], "metric": "eval/accuracy", "default": True})
    if isinstance(primary, dict):
        a, b, metric = primary.get("a"), primary.get("b"), primary.get("metric", "eval/accuracy")
    elif isinstance(primary, (list, tuple)) and len(primary) in (2, 3):
        a, b, metric = (*primary, "eval/accuracy")[:3]
    else:
        raise ValueError(f"primary must be (a, b) or (a, b, metric): arm a against arm b, got "
                         f"{primary!r}")
    for x in (a, b):
        lookup(names, x, "strategy", "(primary= names two of the study's arms)")
    if a == b:
        raise ValueError(f"primary compares {a!r} with itself: name two arms")
    metric_info(metric)
    return {"a": a, "b": b, "metric": metric}


def _sequential(sequential, n_seeds: int) -> dict | None:
    """``run_experiment``'s sequential= -> {"looks", "spending", "alpha"}; the study's seeds
    must be one of its looks."""
    if not sequential:
        return None
    seq = {"spending": "obrien_fleming", "alpha": 0.05, **sequential}
    unknown = set(seq) - {"looks", "spending", "alpha"}
    if unknown or "looks" not in seq:
        raise ValueError(f"sequential takes looks (seed counts), spending and alpha, got "
                         f"{sorted(sequential)}")
    nominal_levels(seq["looks"], seq["alpha"], seq["spending"])     # checks every field
    seq["looks"] = [int(n) for n in seq["looks"]]
    if n_seeds not in seq["looks"]:
        raise ValueError(f"{n_seeds} seeds is not one of the declared looks {seq['looks']}: "
                         f"a sequential study runs to a look")
    return seq


def _looks(root: Path) -> list:
    """The seeds of each earlier look at the study in ``root`` (looks.json; [] if none)."""
    path = Path(root) / LOOKS_FILE
    return _read_json(path, "the study's looks; restore it") if path.exists() else []


def _size(folder: Path, pattern: str = "*") -> int:
    """Bytes of the files under ``folder`` that match ``pattern`` (folders: their files)."""
    return sum(f.stat().st_size for p in Path(folder).glob(pattern)
               for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())


def _disk(root: Path, keep: str) -> dict:
    """What the study's folder holds: bytes in all, a run's folder, the checkpoints kept, and
    one run's checkpoint (what --keep final costs a run) -> a dict with a ``line``."""
    runs = sorted(Path(root).glob("runs/*/seed*"))
    ckpts = sum(_size(f, "checkpoint*") for f in [*runs, *Path(root).glob("pilot/seed*")])
    one = max((_read_json(f / RESULT_FILE, RESULT_BAD).get("checkpoint_bytes", 0)
               for f in runs if (f / RESULT_FILE).exists()), default=0)
    per_run = sum(_size(f) for f in runs) / max(1, len(runs))
    total, mb = _size(root), lambda b: f"{b / 1e6:.1f} MB"       # noqa: E731
    return {"bytes": total, "per_run_bytes": per_run, "checkpoint_bytes": ckpts,
            "checkpoint_would_be": one, "keep": keep,
            "line": f"disk: {mb(total)} in {root} ({mb(per_run)} a run); --keep {keep}: "
                    f"{mb(ckpts)} of checkpoints kept; a run's checkpoint is {mb(one)}"}


def _grid(cfg) -> list[int]:
    """Steps trained at each evaluation of a run of ``cfg`` (the base: 0)."""
    if not cfg.eval_size:
        return []
    return [0] + sorted({s + 1 for s in range(cfg.steps)
                         if (cfg.eval_every and (s + 1) % cfg.eval_every == 0)
                         or s == cfg.steps - 1})


def record_gradients(steps: int = 30, **overrides) -> dict:
    """Train ``steps`` single-process steps (default: supervised fine-tuning of the base
    policy, 64 demonstrations a step, lr 1e-3) and keep each step's gradient -> {"names",
    "shapes", "grads" (steps, numel) float32, "config"}: what the sharder widget replays."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="grpo_lab_record_") as tmp:
        cfg = preset("defaults", **{"objective": "supervised", "prompts_per_step": 64,
                                    "lr": 1e-3, "warmup_steps": 5, "weight_decay": 0.01,
                                    "grad_clip": 0.0, "eval_every": 0, "eval_size": 1,
                                    "time_budget_s": 0.0, "threads": 1, **overrides,
                                    "steps": steps, "out_dir": tmp})
        policy_ref = {}

        def keep(metrics, policy):
            policy_ref["p"] = policy
            rows.append(torch.cat([p.grad.reshape(-1) for p in policy.parameters()]))  # (numel,)

        train(cfg, progress=False, on_step=keep)
    named = list(policy_ref["p"].named_parameters())
    return {"names": [n for n, _ in named], "shapes": [tuple(p.shape) for _, p in named],
            "grads": torch.stack(rows), "config": to_dict(cfg)}            # (steps, numel)
