"""A run's report: one PNG of the curves a person wants to see, and a short markdown summary."""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import matplotlib.pyplot as plt

from grpo_lab import __version__
from grpo_lab.algorithm import health, samples

PANELS = [  # (metrics drawn together, title, y label)
    (("reward/mean",), "mean reward (train samples)", "reward"),
    (("eval/accuracy", "eval/format"), "held-out greedy accuracy", "accuracy"),
    (("loss/kl",), "KL to reference (k3)", "KL (nats/token)"),
    (("clip/high_frac", "clip/low_frac"), "tokens clipped", "fraction"),
    (("completion/mean_len",), "completion length", "tokens"),
    (("group/zero_std_frac",), "groups with equal rewards", "fraction (no signal)"),
]
FONT = 9          # points: >= 9 pt at 100% zoom (the figure is drawn at notebook width)
WIDTH_IN = 9.0    # about a JupyterLab cell's width at 100 dpi: shown unscaled, not shrunk


def running_mean(y: list[float], window: int = 0) -> list[float]:
    """Trailing mean over ``window`` points (default: 2% of the run, at least 1). A NaN or
    infinite point is left out of the windows it falls in (NaN where a window holds no other):
    in the running sum it would make every later mean NaN, blanking the rest of the curve."""
    window = window or max(1, len(y) // 50)
    ok = [math.isfinite(v) for v in y]
    out, acc, n = [], 0.0, 0
    for i, v in enumerate(y):
        old = i >= window and ok[i - window]
        acc += (v if ok[i] else 0.0) - (y[i - window] if old else 0.0)
        n += ok[i] - old
        out.append(acc / n if n else math.nan)
    return out


def drawn_panels(history: list[dict]) -> list[tuple[tuple[str, ...], str, str]]:
    """The ``PANELS`` that have something to show, each with only its metrics that do: a metric
    never logged, or 0 at every step (the KL at beta = 0 in older runs, the clip fractions when
    mu = 1: nothing is ever clipped), is left out, and a panel with none left is left out."""
    return [(shown, name, ylabel) for keys, name, ylabel in PANELS
            if (shown := tuple(k for k in keys if any(h.get(k) for h in history)))]


def plot_history(history: list[dict], title: str = "", target: float | None = None):
    """The panels of ``drawn_panels`` (reward, accuracy, KL, clip fractions, length, equal-reward
    groups) in rows of 3 at notebook width, a y label on each, ``target`` (e.g. the run's
    ``target_accuracy``) as a dashed line on the accuracy panel -> matplotlib Figure."""
    panels = drawn_panels(history)
    if not panels:
        raise ValueError("nothing to plot: the history has none of the metrics "
                         f"{[k for keys, _, _ in PANELS for k in keys]}")
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(WIDTH_IN, 2.6 * nrows + (0.3 if title else 0)),
                             squeeze=False, layout="constrained")
    for ax in axes.flat[len(panels):]:
        ax.remove()
    for ax, (keys, name, ylabel) in zip(axes.flat, panels):
        for k in keys:
            rows = [h for h in history if k in h]
            x, y = [h["step"] for h in rows], [h[k] for h in rows]
            if k.startswith("eval/"):
                ax.plot(x, y, marker="o", ms=3, label=k[5:])
            else:  # per-step values are noisy: faint raw curve, bold running mean
                line, = ax.plot(x, y, alpha=0.25, lw=0.8)
                ax.plot(x, running_mean(y), color=line.get_color(), lw=1.5, label=k.split("/")[1])
        if target and "eval/accuracy" in keys:
            ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:.0%}")
        if len(ax.get_legend_handles_labels()[1]) > 1:
            ax.legend(fontsize=FONT, frameon=False)
        ax.set_title(name, fontsize=FONT + 1)
        ax.set_xlabel("step", fontsize=FONT)
        ax.set_ylabel(ylabel, fontsize=FONT)
        ax.tick_params(labelsize=FONT)
    if title:
        fig.suptitle(title, fontsize=FONT + 2)
    return fig


def summary(history: list[dict]) -> dict:
    evals = [h for h in history if "eval/accuracy" in h]
    train = [h for h in history if "reward/mean" in h]
    return {
        "base_accuracy": evals[0]["eval/accuracy"] if evals else None,
        "final_accuracy": evals[-1]["eval/accuracy"] if evals else None,
        "best_accuracy": max(h["eval/accuracy"] for h in evals) if evals else None,
        "steps": len(train),
        "wall_time_s": history[-1].get("time/elapsed_s", 0.0) if history else 0.0,
        "first_reward": train[0]["reward/mean"] if train else None,
        "last_reward": train[-1]["reward/mean"] if train else None,
    }


def budget_note(history: list[dict], cfg: dict) -> list[str]:
    """Lines saying what ended the run when it was not the step count: the target accuracy
    (``target_accuracy``: at which step and second), or the time budget, with the step reached,
    the median seconds per step (a busy machine shows up here) and the target missed."""
    steps = [h for h in history if h.get("step", -1) >= 0]
    budget, planned = cfg.get("time_budget_s") or 0, cfg.get("steps")
    target = cfg.get("target_accuracy") or 0
    if not steps or planned is None:
        return []
    last = steps[-1]
    if target and last.get("eval/accuracy", -1.0) >= target:
        return [f"**Reached the target** held-out accuracy {target:.0%} ({last['eval/accuracy']:.1%}) "
                f"at step {last['step']} after {last.get('time/elapsed_s', 0.0):.0f} s of "
                f"training, and stopped there (target_accuracy).", ""]
    if not budget or last["step"] + 1 >= planned:
        return []
    times = [h["time/step_s"] for h in steps if "time/step_s" in h]
    median = statistics.median(times) if times else float("nan")
    missed = (f" The target {target:.0%} was not reached (best "
              f"{max(h['eval/accuracy'] for h in history if 'eval/accuracy' in h):.1%})."
              if target and any("eval/accuracy" in h for h in history) else "")
    return [f"**Stopped by the time budget** ({budget:.0f} s) after step {last['step']} of "
            f"{planned}: {median:.3f} s per step (median). If that is slower than usual, the "
            f"machine was busy (other processes, or more torch threads than free cores); "
            f"`--resume --time_budget_s 0` continues the run.{missed}", ""]


def nonfinite_note(history: list[dict]) -> list[str]:
    """A line naming each metric that is NaN or infinite at some step, with the steps: the
    table shows such a value as "nan%" and the curves leave it out, neither saying why."""
    bad: dict[str, list] = {}
    for h in history:
        for k, v in h.items():
            if isinstance(v, float) and not math.isfinite(v):
                bad.setdefault(k, []).append(h.get("step"))
    if not bad:
        return []
    listed = "; ".join(f"{k} at step{'s' if len(s) > 1 else ''} "
                       f"{', '.join(map(str, s[:5]))}{', ...' if len(s) > 5 else ''}"
                       for k, s in bad.items())
    return [f"**Not a number** (NaN or infinite) in the history: {listed}. A value computed "
            f"from these is NaN too; the curves leave them out.", ""]


def fast_path_note(out: Path) -> list[str]:
    """The fast-path probe's choice (speed.fast_path="probe"), as out/config.json records it."""
    from grpo_lab.training.config_file import FAST_PATH_KEY
    from grpo_lab.training.speed_probe import choice_line
    try:
        record = json.loads((out / "config.json").read_text()).get(FAST_PATH_KEY)
    except (OSError, ValueError):
        return []
    return [f"**Fast path** (speed.fast_path=probe, speed_probe.py): {choice_line(record)}.", ""] \
        if record else []


def write_report(history: list[dict], out_dir: str | Path, cfg_dict: dict | None = None) -> Path:
    """Write ``report.png`` and ``report.md`` into ``out_dir`` -> path of the markdown."""
    out = Path(out_dir)
    s = summary(history)
    drawn = bool(drawn_panels(history))              # a run stopped before its first step: none
    if drawn:
        fig = plot_history(history, f"GRPO on {cfg_dict.get('task', '?') if cfg_dict else '?'}",
                           target=(cfg_dict or {}).get("target_accuracy") or None)
        fig.savefig(out / "report.png", dpi=110)
        plt.close(fig)
    lines = ["# GRPO run report", "", f"Written by grpo_lab {__version__}.", ""]
    if s["base_accuracy"] is None:
        lines += ["No held-out evaluation (eval_size=0).", ""]
    else:
        lines += [
            "| held-out greedy accuracy | value |", "|---|---|",
            f"| base checkpoint | {s['base_accuracy']:.1%} |",
            f"| after training | {s['final_accuracy']:.1%} |",
            f"| best during training | {s['best_accuracy']:.1%} |",
            f"| change | {100 * (s['final_accuracy'] - s['base_accuracy']):+.1f} points |", ""]
        fmt = [h["eval/format"] for h in history if "eval/format" in h]
        if fmt:
            lines[-1:] = [f"| requested answer format, base -> after | {fmt[0]:.1%} -> "
                          f"{fmt[-1]:.1%} |", ""]
    lines += [f"{s['steps']} steps in {s['wall_time_s']:.0f} s of training.", ""]
    lines += nonfinite_note(history)
    lines += budget_note(history, cfg_dict or {})
    lines += fast_path_note(out)
    lines += health.report_lines(history, cfg_dict)           # "nothing is being learned"
    lines += samples.markdown(samples.read(out))              # before/after completions
    for h in history:
        if "resume/overrides" in h:
            changed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in h["resume/overrides"].items())
            lines += [f"**Resumed at step {h['step']} with a changed config** ({changed}): the "
                      f"steps before and after it ran under different settings.", ""]
    lines += ["![curves](report.png)", ""] if drawn else []
    if cfg_dict:
        lines += ["## Config", "", "```json", json.dumps(cfg_dict, indent=1, default=_plain), "```",
                  ""]
    (out / "report.md").write_text("\n".join(lines))
    return out / "report.md"


def comm_summary(history: list[dict]) -> dict:
    """Totals of a data-parallel run's steps: bytes per step (mean), total bytes, bytes the
    process wrote (wchar, mean), training time, final held-out accuracy."""
    steps = [h for h in history if h.get("step", -1) >= 0]
    total = sum(h.get("comm/bytes", 0) for h in steps)
    wc = [h["comm/wchar_bytes"] for h in steps if h.get("comm/wchar_bytes") is not None]
    accs = [h["eval/accuracy"] for h in history if "eval/accuracy" in h]
    return {"comm/bytes_per_step": total / len(steps) if steps else None,
            "comm/bytes_total": total,
            "comm/wchar_per_step": sum(wc) / len(wc) if wc else None,
            "time/train_s": sum(h["time/step_s"] for h in steps),
            "eval/accuracy": accs[-1] if accs else None}


def _plain(value):
    """A sub-config left as its dataclass (``vars(cfg)``) written as the dict it holds."""
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} in the config is not JSON serializable")
