"""The Architecture page's picture: the package's layers, and one GRPO step's path through them.

    python tools/draw_architecture.py [--out docs/reference/architecture.png]

The layers are ``grpo_lab.LAYERS`` (top to bottom); the step is ``tools/step_trace.py``'s trace
of one real trainer step (defaults preset, toy policy, one process). Each file the step enters
is a box in its layer's band, numbered in the order the step first enters it and labelled with
the lines of its functions the step runs; an arrow runs from a file to each file it calls. Nothing is drawn by
hand, so the picture is redrawn, not edited, after a change.
"""
from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import matplotlib                                      # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt                        # noqa: E402

import grpo_lab                                        # noqa: E402
from step_trace import trace_step, report              # noqa: E402

SHORT = ("teaching, CLI", "harnesses", "the loop", "one step, config", "mechanisms",
         "distributed", "the floor")


def layer_of(module: str) -> int:
    """The index in grpo_lab.LAYERS of the layer holding ``module`` ('training.step')."""
    for i, (_, names) in enumerate(grpo_lab.LAYERS):
        for n in names:
            if n == module or (n.endswith(".*") and module.startswith(n[:-1])):
                return i
    raise ValueError(f"{module!r} is in no layer of grpo_lab.LAYERS")


def module_of(rel: str) -> str:
    """'grpo_lab/training/step.py' -> 'training.step' ('grpo_lab/tasks/__init__.py' -> 'tasks')."""
    parts = Path(rel).with_suffix("").parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def draw(out: Path) -> dict:
    t = trace_step("defaults", None)
    counts = report(t, show=False)
    counts["step"] = report(t, False, t.step_order, "the step alone: collect to the update")
    files, lines = [], {}
    for code in t.order:
        rel = str(Path(code.co_filename).relative_to(ROOT))
        n = len(inspect.getsourcelines(code)[0])
        lines[rel] = lines.get(rel, 0) + n
        if rel not in files:
            files.append(rel)
    bands = []                          # (layer, folder): the mechanisms layer by folder
    for i, (_, names) in enumerate(grpo_lab.LAYERS):
        folders = sorted({n.split(".")[0] for n in names if n.endswith(".*")})
        bands += [(i, f) for f in folders] if len(folders) > 1 else [(i, "")]
    def band(f):
        i = layer_of(module_of(f))
        return (i, module_of(f).split(".")[0]) if (i, module_of(f).split(".")[0]) in bands else (i, "")
    per_band: dict = {}
    for f in files:
        per_band.setdefault(band(f), []).append(f)
    width = max(len(v) for v in per_band.values())
    fig, ax = plt.subplots(figsize=(3.0 + 1.6 * width, 0.8 * len(bands) + 0.8))
    pos = {}
    for r, (i, folder) in enumerate(bands):
        y = len(bands) - 1 - r
        ax.axhspan(y - 0.5, y + 0.5, color="#f3f3f3" if i % 2 else "#e8eef6", zorder=0)
        ax.text(-0.55, y, SHORT[i] + (f": {folder}/" if folder else ""), ha="right",
                va="center", fontsize=9, weight="bold")
        for j, f in enumerate(per_band.get((i, folder), [])):
            pos[f] = (j * 1.6 + 0.7, y)
    for k, f in enumerate(files):
        x, y = pos[f]
        ax.text(x, y, f"{k + 1}. {Path(f).stem if Path(f).stem != '__init__' else Path(f).parent.name}"
                      f"\n{lines[f]} lines", ha="center", va="center", fontsize=8, zorder=3,
                bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="#4a6fa5"))
    rel = {c: str(Path(c).relative_to(ROOT)) for pair in t.calls for c in pair}
    for a, b in sorted((rel[a], rel[b]) for a, b in t.calls):
        if a not in pos or b not in pos:
            continue
        (x0, y0), (x1, y1) = pos[a], pos[b]
        up = y1 > y0                             # a call back up: a hook or callback
        ax.annotate("", (x1, y1), (x0, y0), zorder=2,
                    arrowprops=dict(arrowstyle="->", color="#888888" if up else "#c0504d",
                                    alpha=0.7 if up else 0.45, ls="--" if up else "-",
                                    connectionstyle="arc3,rad=0.15", shrinkA=14, shrinkB=14))
    ax.set_xlim(-0.6 - 2.2, width * 1.6 + 0.1)
    ax.set_ylim(-0.6, len(bands) - 0.4)
    ax.axis("off")
    step = counts["step"]
    ax.set_title(f"One GRPO step through the layers: {step['lines']} lines of functions in "
                 f"{step['files']} files for the step alone, {counts['lines']} in "
                 f"{counts['files']} from on_step to on_step\n(numbers: order of first entry; "
                 f"arrows: calls; dashed: a call back up, to a function the caller was handed)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return counts


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs/reference/architecture.png")
    a = p.parse_args(argv)
    draw(a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
