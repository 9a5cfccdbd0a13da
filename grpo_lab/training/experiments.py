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
``preset("defaults", **base, **strategy, seed=s)`` (the field defaults: lr 1e-4, beta 0.02,
not the time-tuned demo) with one thread and no time budget, in its
own temporary out_dir. Runs share the base policy and held-out sets, so seed s of two
strategies draws the same prompts at step s: differences are paired by seed.

Interval: the 95% Student-t interval of the mean over seeds, mean ± t(0.975, n-1) * sd / sqrt(n)
(sd with n-1). With 3 seeds t = 4.303, so the half-width is 2.5 standard deviations of the
runs: wide on purpose; it is what 3 seeds can support.
"""
from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import tempfile
import traceback
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from grpo_lab.training.config import preset, to_dict
from grpo_lab.registry import lookup
from grpo_lab.training.trainer import train

__all__ = ["run_experiment", "Results", "METRICS", "mean_ci", "run_metrics", "time_to_target",
           "difference_sentence", "can_tell", "MIN_SEEDS"]

METRICS = {  # name -> (what it is, format); the per-run summary of one history
    "eval/accuracy": ("held-out greedy accuracy at the last evaluation", ".3f"),
    "eval/gain": ("last eval/accuracy minus the base policy's (step -1)", "+.3f"),
    "target/steps": ("steps trained when eval/accuracy first reached the target; "
                     "n counts the runs that reached it", ".0f"),
    "target/seconds": ("time/elapsed_s at that evaluation", ".1f"),
    "group/zero_std_frac": ("step mean: groups whose rewards are all equal", ".3f"),
    "adv/var": ("step mean: variance of the advantages", ".3f"),
    "sample/draws": ("step mean: rollouts of prompts_per_step prompts (dynamic sampling)",
                     ".2f"),
}


def t_quantile(df: int, level: float = 0.95) -> float:
    """t(1 - (1 - level) / 2, df): Student's t two-sided quantile (scipy, a scikit-learn dep);
    t(0.975, 2) = 4.303."""
    from scipy.stats import t
    return float(t.ppf(1 - (1 - level) / 2, df))


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
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1))
    half = t_quantile(n - 1, level) * sd / math.sqrt(n)
    return m, m - half, m + half


def time_to_target(history: list[dict], target: float) -> tuple[float | None, float | None]:
    """-> (steps trained, time/elapsed_s) at the first evaluation with eval/accuracy >= target
    (the base evaluation, step -1, counts as 0 steps); (None, None) if never reached."""
    for h in history:
        if h.get("eval/accuracy", -math.inf) >= target:
            return h["step"] + 1, h.get("time/elapsed_s", 0.0)
    return None, None


def run_metrics(history: list[dict], target: float | None = None) -> dict:
    """One run's history -> {metric: value} for the METRICS it has (None: target missed)."""
    evals = [h for h in history if "eval/accuracy" in h]
    steps = [h for h in history if h["step"] >= 0]
    out = {}
    if evals:
        out["eval/accuracy"] = evals[-1]["eval/accuracy"]
        if evals[0]["step"] == -1:
            out["eval/gain"] = evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"]
        if target is not None:
            out["target/steps"], out["target/seconds"] = time_to_target(history, target)
    for k in ("group/zero_std_frac", "adv/var", "sample/draws"):
        vals = [h[k] for h in steps if k in h]
        if vals:
            out[k] = sum(vals) / len(vals)
    return out


MIN_SEEDS = 3
"""Fewest values an interval may give a verdict from: with 2 a t-interval is 12.7 standard
deviations wide or, when the 2 values agree, zero wide; either way it says nothing."""


def can_tell(n: int, ci_low: float, ci_high: float) -> bool:
    """Whether an interval over n values may give a verdict: n >= MIN_SEEDS and a width
    above float rounding (1e-9 of the bounds' size: differences computed from equal values,
    0.7 - 0.6 and 0.8 - 0.7, differ in their last bits). A zero-width interval means the
    values are identical, not that the mean is certain."""
    return n >= MIN_SEEDS and ci_high - ci_low > 1e-9 * max(abs(ci_low), abs(ci_high))


def difference_sentence(d: dict) -> str:
    """A ``Results.compare`` dict -> one sentence: is the difference real at 95%? No verdict
    from fewer than MIN_SEEDS paired seeds or a zero-width interval: "too few seeds to tell"."""
    head = f"{d['a']} - {d['b']} on {d['metric']}"
    if d["n"] < 2:
        return f"{head}: {d['n']} paired seed(s), too few seeds to tell."
    what = (f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] "
            f"over {d['n']} paired seeds: ")
    if not can_tell(d["n"], d["ci_low"], d["ci_high"]):
        why = (f"fewer than {MIN_SEEDS}" if d["n"] < MIN_SEEDS
               else "identical differences, a zero-width interval")
        return f"{head}: {what}too few seeds to tell ({why})."
    real = d["ci_low"] > 0 or d["ci_high"] < 0
    return (head + ": " + what
            + ("the interval excludes 0, a real difference." if real else
               "the interval includes 0, not distinguishable from seed noise."))


@dataclass
class Results:
    runs: list[dict]
    """One {"strategy", "seed", "history"} per run, in (strategy, seed) order."""
    target: float | None = None
    """The held-out accuracy the target/* metrics measure the way to (None: not measured)."""

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

    def compare(self, a: str, b: str, metric: str = "eval/accuracy") -> dict:
        """Paired difference a - b on ``metric`` over the seeds both have -> {a, b, metric,
        mean, ci_low, ci_high, n, values, excludes_zero}; excludes_zero is False when the
        interval cannot tell (``can_tell``: fewer than 3 seeds or a zero-width interval)."""
        for s in (a, b):
            lookup(self.strategies, s, "strategy")
        lookup(METRICS, metric, "metric")
        per = {(r["strategy"], r["seed"]): r.get(metric) for r in self.per_run()}
        pairs = [(per[a, seed], per.get((b, seed))) for (s, seed) in per if s == a]
        diffs = [x - y for x, y in pairs if x is not None and y is not None]  # same seed
        mean, lo, hi = mean_ci(diffs)
        return {"a": a, "b": b, "metric": metric, "mean": mean, "ci_low": lo, "ci_high": hi,
                "n": len(diffs), "values": diffs,
                "excludes_zero": can_tell(len(diffs), lo, hi) and (lo > 0 or hi < 0)}

    def _table(self) -> tuple[list[str], list[list[str]]]:
        """Strategies as rows, metrics as "mean ± half-width" cells (n when not every seed)."""
        rows = self.rows()
        metrics = [m for m in METRICS if any(r["metric"] == m for r in rows)]
        seeds = {s: sum(r["strategy"] == s for r in self.runs) for s in self.strategies}
        body = []
        for s in self.strategies:
            cells = [s]
            for m in metrics:
                r = next((r for r in rows if r["strategy"] == s and r["metric"] == m), None)
                cells.append(_cell(r, METRICS[m][1], seeds[s]))
            body.append(cells)
        return ["strategy"] + metrics, body

    def to_markdown(self) -> str:
        head, body = self._table()
        lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])

    def _repr_html_(self) -> str:
        head, body = self._table()
        th = "".join(f"<th>{h}</th>" for h in head)
        tr = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in body)
        return (f"<table><thead><tr>{th}</tr></thead><tbody>{tr}</tbody></table>"
                f"<p>{self._legend()}</p>")

    def _legend(self) -> str:
        n = len({r["seed"] for r in self.runs})
        if n < MIN_SEEDS:
            return (f"mean over {n} seed(s): too few seeds to tell, no interval "
                    f"(an interval needs at least {MIN_SEEDS})")
        return f"mean ± half-width of the 95% t-interval over {n} seeds"

    def __repr__(self) -> str:
        """Short: the strategies, seeds and runs, then the table (not every history)."""
        seeds = sorted({r["seed"] for r in self.runs})
        return (f"Results({len(self.strategies)} strategies x {len(seeds)} seeds {seeds}, "
                f"{len(self.runs)} runs, target={self.target})\n{self.to_markdown()}\n"
                f"{self._legend()}")

    def plot(self, metric: str = "eval/accuracy", ax=None):
        """Mean of ``metric`` vs step per strategy, with a min-max band over seeds -> Figure."""
        import matplotlib.pyplot as plt
        fig = ax.figure if ax is not None else plt.subplots(figsize=(7, 4))[0]
        ax = ax if ax is not None else fig.axes[0]
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


def _die_with_parent() -> None:
    """Pool initializer: a worker ends when the experiment's process is killed (Linux
    prctl(PR_SET_PDEATHSIG, SIGTERM)); otherwise it would wait for work forever."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))
    except (OSError, AttributeError):
        pass


_JOBS: list = []  # (strategy, seed, config) of the running experiment; forked workers read it


def _run_one(i: int) -> tuple[int, list | None, str | None]:
    """Run job i in a fresh temporary out_dir -> (i, history, None) or (i, None, traceback)."""
    name, seed, cfg = _JOBS[i]
    try:
        with tempfile.TemporaryDirectory(prefix="grpo_lab_exp_") as tmp:
            return i, train(dataclasses.replace(cfg, out_dir=tmp), progress=False), None
    except Exception:
        return i, None, traceback.format_exc()


def run_experiment(strategies: dict[str, dict], seeds=(0, 1, 2), base: dict | None = None,
                   processes: int | None = None, target: float | None = None,
                   progress: bool = True) -> Results:
    """Train every strategy (TrainConfig overrides on top of ``base``, itself overrides of
    the "defaults" preset) with every seed -> Results. Runs go to ``processes`` forked worker
    processes (default: the CPU count; 1, or no fork, runs them here one after the other).
    ``target``: a held-out accuracy; the target/* metrics measure steps and seconds to it.
    A non-zero ``time_budget_s`` is refused (ValueError): runs stop at ``steps``, never on a
    clock, so that run s of two strategies covers the same prompts."""
    base = dict(base or {})
    for where, d in [("base", base), *((f"strategy {n!r}", s) for n, s in strategies.items())]:
        if {"seed", "out_dir"} & set(d):
            raise ValueError(f"{where} sets seed or out_dir: run_experiment sets both per run")
        if d.get("time_budget_s"):      # a budget cuts runs at different steps: not paired
            raise ValueError(f"{where} sets time_budget_s={d['time_budget_s']!r}: "
                             "run_experiment trains every run for the same steps so that "
                             "seeds pair up; set steps (or time_budget_s=0) instead")
    jobs = []
    for name, overrides in strategies.items():
        try:
            cfg = preset("defaults", **{**base, **overrides, "threads": 1, "time_budget_s": 0.0,
                                        "out_dir": "unused"})
        except (TypeError, ValueError) as e:
            raise ValueError(f"strategy {name!r} ({overrides}): {e}") from None
        jobs += [(name, s, dataclasses.replace(cfg, seed=s)) for s in seeds]
    processes = min(processes or os.cpu_count() or 1, len(jobs))
    fork = "fork" in multiprocessing.get_all_start_methods()
    _JOBS[:] = jobs
    histories = [None] * len(jobs)
    bar = tqdm(total=len(jobs), desc="runs", disable=not progress)
    threads = torch.get_num_threads()     # train() sets 1; give the caller back its own
    try:
        if processes > 1 and fork:
            with multiprocessing.get_context("fork").Pool(processes, _die_with_parent) as pool:
                done = pool.imap_unordered(_run_one, range(len(jobs)))
                for i, hist, err in done:
                    _store(histories, i, hist, err, jobs)
                    bar.update()
        else:
            for i in range(len(jobs)):
                _store(histories, *_run_one(i), jobs)
                bar.update()
    finally:
        bar.close()
        _JOBS.clear()
        torch.set_num_threads(threads)
    return Results([{"strategy": n, "seed": s, "history": h}
                    for (n, s, _), h in zip(jobs, histories)], target)


def _store(histories: list, i: int, hist, err: str | None, jobs: list) -> None:
    if err is not None:
        name, seed, _ = jobs[i]
        raise RuntimeError(f"run of strategy {name!r}, seed {seed} failed:\n{err}")
    histories[i] = hist


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
