"""Compression explorer: one gradient tensor through the protocol, stage by stage.

original values -> FP8 (error map, values flushed to zero) -> Top-K mask -> residual kept for
the next step (the "step" button applies another step with error feedback) -> index gaps ->
code lengths -> bytes. All numbers come from ``compression.trace_step``, the widget only wires
the controls (density, fp8 format, index codec) to it and draws with plain matplotlib.
"""
from __future__ import annotations

import ipywidgets as W
import numpy as np
import torch
from matplotlib.figure import Figure

from grpo_lab.distributed.codecs import CODECS
from grpo_lab.distributed.compression import FP8_FORMATS, trace_step
from grpo_lab.teaching.widgets import show_figure


def default_tensor(seed: int = 0) -> torch.Tensor:
    """A 32 x 64 heavy-tailed 'gradient' (Student-t, 3 dof, scaled like real gradients)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn((32, 64), generator=g)                                  # (R, C)
    chi2 = torch.randn((3, 32, 64), generator=g).pow(2).sum(0)              # (R, C), 3 dof
    return z / (chi2 / 3).sqrt() * 1e-3


def compression_explorer(tensor: torch.Tensor | None = None, seed: int = 0, plots: bool = True):
    """-> (box, parts). parts: density, format, codec, step, reset (controls); ratio, bytes,
    fp8, bits, steps (HTML values); out (the Output with the plots, drawn when ``plots``)."""
    x = default_tensor(seed) if tensor is None else tensor.detach().float()
    if x.dim() == 1:
        x = x[None, :]
    state = {"residual": torch.zeros_like(x), "steps": 0}
    parts = {
        "density": W.FloatLogSlider(value=0.05, base=10, min=-3, max=0, step=0.05,
                                    description="density"),
        "format": W.Dropdown(options=sorted(FP8_FORMATS), value="e4m3", description="fp8"),
        "codec": W.Dropdown(options=list(CODECS), value="huffman", description="indices"),
        "step": W.Button(description="step (error feedback)", layout=W.Layout(width="auto")),
        "reset": W.Button(description="reset residual", layout=W.Layout(width="auto")),
        "ratio": W.HTML(), "bytes": W.HTML(), "fp8": W.HTML(), "bits": W.HTML(),
        "steps": W.HTML(), "out": W.Output(),
    }

    def current():
        return trace_step(x, state["residual"], parts["density"].value, parts["format"].value,
                          parts["codec"].value)

    def show(tr):
        parts["ratio"].value = f"{tr['raw_bytes'] / tr['topk_bytes']:.2f}"
        parts["bytes"].value = (f"fp32 {tr['raw_bytes']} B | fp8 {tr['fp8_bytes']} B "
                                f"({tr['raw_bytes'] / tr['fp8_bytes']:.2f}x) | top-k {tr['topk_bytes']} B "
                                f"(k={tr['k']}: {4 * tr['k']} B values + {tr['index_bytes']} B indices)")
        parts["fp8"].value = (f"{parts['format'].value}: {tr['flushed']} of {tr['n']} values "
                              f"flushed to zero, rel. L2 error "
                              f"{float(tr['fp8_error'].norm() / tr['x'].norm().clamp(min=1e-30)):.2%}")
        parts["bits"].value = (f"{tr['bits_per_index']:.2f} bits/index, bound n*H(k/n)/k = "
                               f"{tr['bound']:.2f}")
        parts["steps"].value = (f"step {state['steps']}: residual L2 "
                                f"{float(state['residual'].norm()):.3g}")
        if plots:
            parts["out"].clear_output(wait=True)
            with parts["out"]:
                show_figure(_figure(tr))

    def refresh(_=None):
        show(current())

    def step(_=None):
        tr = current()
        state["residual"], state["steps"] = tr["residual"], state["steps"] + 1
        refresh()

    def reset(_=None):
        state["residual"], state["steps"] = torch.zeros_like(x), 0
        refresh()

    for name in ("density", "format", "codec"):
        parts[name].observe(refresh, names="value")
    parts["step"].on_click(step)
    parts["reset"].on_click(reset)
    refresh()
    box = W.VBox([W.HBox([parts["density"], parts["format"], parts["codec"]]),
                  W.HBox([parts["step"], parts["reset"], parts["steps"]]),
                  W.HTML("<b>top-k ratio vs fp32:</b>"), parts["ratio"], parts["bytes"],
                  parts["fp8"], parts["bits"], parts["out"]])
    return box, parts


def _figure(tr) -> Figure:
    """Eight panels in 4 rows of 2 at notebook width (9 in), 9 pt text."""
    fig = Figure(figsize=(9, 9.5), layout="constrained")
    ax = fig.subplots(4, 2).T.reshape(2, 4)     # ax[0]: the four images, ax[1]: the four plots
    images = [("original", tr["x"]), ("fp8 error", tr["fp8_error"]),
              ("top-k mask", tr["mask"].float()), ("residual (next step)", tr["residual"])]
    for a, (title, t) in zip(ax[0], images):
        im = a.imshow(t.numpy(), aspect="auto", cmap="gray" if "mask" in title else "RdBu_r")
        a.set_title(title, fontsize=10)
        fig.colorbar(im, ax=a, fraction=0.046).ax.tick_params(labelsize=9)
    x = tr["x"].flatten().double().numpy()                   # float64: a constant 1e6 bins too
    ax[1, 0].hist(x, bins=80 if x.max() > x.min() else 1, log=True)
    ax[1, 0].set_title("values (log count)", fontsize=10)
    ax[1, 0].locator_params(axis="x", nbins=4)                 # 9 pt tick labels must not touch
    ax[1, 1].hist(tr["gaps"], bins=50)
    ax[1, 1].set_title("index gaps", fontsize=10)
    ax[1, 2].plot(np.sort(tr["gaps"]), np.asarray(tr["code_lengths"])[np.argsort(tr["gaps"])], ".")
    ax[1, 2].axhline(tr["bound"], color="k", ls="--", label="bound")
    ax[1, 2].set_title("code length per gap (bits)", fontsize=10)
    ax[1, 2].legend(fontsize=9)
    sizes = {"fp32": tr["raw_bytes"], "fp8": tr["fp8_bytes"], "top-k": tr["topk_bytes"],
             "indices": tr["index_bytes"]}
    ax[1, 3].bar(list(sizes), list(sizes.values()))
    ax[1, 3].set_title("bytes", fontsize=10)
    for a in ax.flat:
        a.tick_params(labelsize=9)
    return fig
