"""Topology explorer: step through an all-reduce schedule, phase by phase, on a two-level cluster.

Pick a schedule (``topology.SCHEDULES``), the cluster's shape (nodes x GPUs per node, N = their
product), the inter-node latency alpha and bandwidth 1/beta, and the message size; the explorer
builds the schedule's phases (``topology.schedule``), times them (``topology.simulate``) and
shows, for the chosen phase, who sends how many bytes to whom (ranks on a circle, one colour
per node, red arrows cross nodes), and the closed form's time against N for every schedule at
the current alpha, beta and size. Inside a node: NVLink-like 1 us and 450 GB/s (fixed).
Figures are rendered to PNG into ``ipywidgets.Image`` parts, so they show with or without
matplotlib's inline backend; every number is in ``parts["data"]``.
"""
from __future__ import annotations

import io

import ipywidgets as W
import numpy as np
from matplotlib.figure import Figure

from grpo_lab.distributed.topology import SCHEDULES, Cluster, closed_form, schedule, simulate

ALPHA_INTRA, BETA_INTRA = 1e-6, 1 / 450e9


def explorer_cluster(nodes: int, gpus: int, alpha_us: float, gbps: float) -> Cluster:
    """The explorer's cluster: alpha in microseconds, inter-node bandwidth in GB/s."""
    return Cluster(nodes, gpus, ALPHA_INTRA, BETA_INTRA, alpha_us * 1e-6, 1 / (gbps * 1e9),
                   name="explorer")


def topology_explorer(plots: bool = True):
    """-> (box, parts). parts: schedule, nodes, gpus, alpha_us, gbps, size, phase (controls);
    summary (HTML); phase_image, curve_image (PNG images, drawn when ``plots``); data."""
    wide = {"style": {"description_width": "initial"}}
    parts = {
        "schedule": W.Dropdown(options=list(SCHEDULES), value="ring", description="schedule"),
        "nodes": W.SelectionSlider(options=[1, 2, 4, 8, 16], value=4, description="nodes M", **wide),
        "gpus": W.SelectionSlider(options=[1, 2, 4, 8], value=4, description="GPUs/node g", **wide),
        "alpha_us": W.FloatLogSlider(value=5, base=10, min=-1, max=3, description="alpha between (us)",
                                     **wide),
        "gbps": W.FloatLogSlider(value=50, base=10, min=0, max=3, description="GB/s between", **wide),
        "size": W.FloatLogSlider(value=1e6, base=10, min=2, max=11, description="message (B)", **wide),
        "phase": W.IntSlider(value=0, min=0, max=0, description="phase", **wide),
        "summary": W.HTML(), "phase_image": W.Image(format="png"),
        "curve_image": W.Image(format="png"), "data": {},
    }
    data = parts["data"]

    def rebuild(_=None):
        c = explorer_cluster(parts["nodes"].value, parts["gpus"].value, parts["alpha_us"].value,
                             parts["gbps"].value)
        name, n = parts["schedule"].value, parts["size"].value
        kw = {"chunks": 4} if SCHEDULES[name].takes_chunks else {}
        data.pop("error", None)
        try:
            phases = schedule(name, c, n, **kw)
            closed = closed_form(name, c, n, **kw)
        except ValueError as e:                      # e.g. halving-doubling with P not 2^k
            phases, closed = [], None
            data["error"] = str(e)
        data.update(cluster=c, phases=phases, closed_form_s=closed, sim=simulate(phases, c))
        parts["phase"].max = max(0, len(phases) - 1)
        redraw()
        if plots:
            parts["curve_image"].value = _png(_curve(c, n, name))

    def redraw(_=None):
        c, phases, sim = data["cluster"], data["phases"], data["sim"]
        k = min(parts["phase"].value, max(0, len(phases) - 1))
        ph = phases[k] if phases else None
        data.update(phase=k, transfers=[] if ph is None else
                    list(zip(ph.src.tolist(), ph.dst.tolist(), ph.nbytes.tolist())))
        closed = data["closed_form_s"]
        parts["summary"].value = (
            f"<b>{parts['schedule'].value}</b> on N = {c.size} ranks: "
            + (f"<span style='color:#b00'>{data['error']}</span>" if "error" in data else
               "one rank holds the whole gradient: nothing to exchange (0 phases, 0 bytes)"
               if ph is None else
               f"{len(phases)} phases, simulated {sim.time * 1e3:.4g} ms, closed form "
               f"{closed * 1e3:.4g} ms; {sim.total_bytes / 1e6:.4g} MB on the wire "
               f"(2(N-1)n = {2 * (c.size - 1) * parts['size'].value / 1e6:.4g} MB), "
               f"{sim.inter_node_bytes / max(sim.total_bytes, 1):.0%} between nodes. "
               f"Phase {k}: {ph.label}, {len(ph.src)} messages of {ph.nbytes[0]:.4g} B, "
               f"{sim.phase_times[k] * 1e6:.4g} us"))
        if plots and ph is not None:
            parts["phase_image"].value = _png(_phase_figure(c, ph))

    for key in ("schedule", "nodes", "gpus", "alpha_us", "gbps", "size"):
        parts[key].observe(rebuild, names="value")
    parts["phase"].observe(redraw, names="value")
    rebuild()
    box = W.VBox([W.HBox([parts["schedule"], parts["nodes"], parts["gpus"]]),
                  W.HBox([parts["alpha_us"], parts["gbps"], parts["size"]]), parts["phase"],
                  parts["summary"], W.HBox([parts["phase_image"], parts["curve_image"]])])
    return box, parts


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)      # the two side by side fit a notebook cell
    return buf.getvalue()


def _phase_figure(c: Cluster, ph) -> Figure:
    fig = Figure(figsize=(4.4, 4.4), layout="constrained")
    ax = fig.subplots()
    P, node = c.size, c.node()
    ang = 2 * np.pi * np.arange(P) / P
    xy = np.stack([np.cos(ang), np.sin(ang)], 1)                                   # (P, 2)
    ax.scatter(xy[:, 0], xy[:, 1], c=[f"C{k % 10}" for k in node], s=max(8, 300 // P), zorder=3)
    if P <= 32:
        for r in range(P):
            ax.annotate(str(r), 1.12 * xy[r], ha="center", va="center", fontsize=9)
    for s, d in zip(ph.src, ph.dst):
        ax.annotate("", xy[d], xy[s], arrowprops=dict(
            arrowstyle="->", lw=0.8, color="C3" if node[s] != node[d] else "0.4", alpha=0.7))
    ax.set_title(f"{ph.label}\n{len(ph.src)} messages of {ph.nbytes[0]:.3g} B "
                 f"(red: between nodes)", fontsize=9)
    # the rank labels sit at radius 1.12: keep them in
    ax.set(xlim=(-1.25, 1.25), ylim=(-1.25, 1.25), aspect="equal")
    ax.axis("off")
    return fig


def _curve(c: Cluster, n: float, current: str) -> Figure:
    fig = Figure(figsize=(4.8, 4.4), layout="constrained")
    ax = fig.subplots()
    Ms = [2 ** k for k in range(0, 11) if 2 ** k * c.gpus_per_node <= 4096]
    for name in SCHEDULES:
        t = [closed_form(name, Cluster(M, c.gpus_per_node, c.alpha_intra, c.beta_intra,
                                       c.alpha_inter, c.beta_inter), n) for M in Ms]
        ax.plot([M * c.gpus_per_node for M in Ms], t, label=name, lw=2.5 if name == current else 1)
    ax.axvline(c.size, color="k", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("N ranks (g per node fixed)", fontsize=9)
    ax.set_ylabel("all-reduce time (s), closed form", fontsize=9)
    ax.tick_params(labelsize=9)
    ax.set_title(f"{n:.3g} B, alpha {c.alpha_inter * 1e6:.3g} us,\n"
                 f"{1 / c.beta_inter / 1e9:.3g} GB/s between nodes", fontsize=9)
    ax.legend(fontsize=9)
    return fig
