"""When does compression pay? The learner moves the link bandwidth and watches the verdict flip.

A thin view over ``distributed.scaling.compression_pays``: a link (a preset sets latency and
bandwidth; the slider moves the bandwidth), a model size, a codec (measured on this CPU, or an
assumed GPU-speed one), the number of ranks and how much of backward the communication may hide
behind. It shows the exposed seconds of the plain fp32 all-reduce and of the compressed exchange,
the verdict, and the break-even bandwidth, with both curves over bandwidth in one plot.
"""
from __future__ import annotations

import ipywidgets as W
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from grpo_lab.distributed.scaling import LINKS, MEASURED_CODECS, Link, compression_pays, exchange_seconds
from grpo_lab.teaching.widgets import show_figure

GB = 1e9


def compression_pays_explorer(params: float = 134.5e6, codec: str | None = None,
                              link: str = "100 Gb/s Ethernet", world: int = 8,
                              plots: bool = True):
    """-> (box, parts). parts: link (preset), bandwidth (GB/s, log), params (log), codec, world,
    overlap, backward_ms (controls); verdict, times (HTML); out (the plot); and "state", a dict
    whose "verdict" is the ``scaling.Verdict`` on display."""
    codec = codec or next(iter(MEASURED_CODECS))
    parts = {
        "link": W.Dropdown(options=list(LINKS), value=link, description="link"),
        "bandwidth": W.FloatLogSlider(value=LINKS[link].bandwidth / GB, base=10, min=-2, max=3,
                                      step=0.05, description="GB/s"),
        "params": W.FloatLogSlider(value=params, base=10, min=5, max=11, step=0.01,
                                   description="parameters"),
        "codec": W.Dropdown(options=list(MEASURED_CODECS), value=codec, description="codec",
                            layout=W.Layout(width="420px")),
        "world": W.IntSlider(value=world, min=2, max=64, description="ranks"),
        "overlap": W.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.05, description="overlap"),
        "backward_ms": W.FloatLogSlider(value=100.0, base=10, min=-1, max=4, step=0.1,
                                        description="bwd ms"),
        "verdict": W.HTML(), "times": W.HTML(), "out": W.Output(),
    }
    state = parts["state"] = {}

    def refresh(_=None):
        lk = Link(LINKS[parts["link"].value].alpha, parts["bandwidth"].value * GB)
        cd = MEASURED_CODECS[parts["codec"].value]
        hidden_ms = parts["overlap"].value * parts["backward_ms"].value
        v = compression_pays(parts["params"].value, lk, cd, parts["world"].value,
                             parts["overlap"].value, parts["backward_ms"].value / 1e3)
        state["verdict"] = v
        colour = "green" if v.pays else "firebrick"
        word = "PAYS" if v.pays else "does NOT pay"
        parts["verdict"].value = (f"<b style='color:{colour}'>compression {word}</b>: "
                                  f"{abs(v.saving_s) * 1e3:.3g} ms {'saved' if v.pays else 'lost'} "
                                  f"per exchange ({v.speedup:.2f}x); break-even bandwidth "
                                  f"{_bw(v.break_even_bandwidth)}")
        parts["times"].value = (f"plain fp32 all-reduce {v.plain_s * 1e3:.3g} ms | compressed "
                                f"{v.compressed_s * 1e3:.3g} ms (exposed, after {hidden_ms:.3g} ms "
                                f"of backward hides communication)")
        if plots:
            parts["out"].clear_output(wait=True)
            with parts["out"]:
                show_figure(_figure(parts, lk, cd, v))

    def preset(_=None):
        bandwidth = LINKS[parts["link"].value].bandwidth / GB
        if parts["bandwidth"].value == bandwidth:   # no change fires: the link's latency still must
            refresh()
        parts["bandwidth"].value = bandwidth                                    # fires refresh

    parts["link"].observe(preset, names="value")
    for name in ("bandwidth", "params", "codec", "world", "overlap", "backward_ms"):
        parts[name].observe(refresh, names="value")
    refresh()
    box = W.VBox([W.HBox([parts["link"], parts["bandwidth"]]),
                  W.HBox([parts["params"], parts["world"]]),
                  W.HBox([parts["codec"], parts["overlap"], parts["backward_ms"]]),
                  parts["verdict"], parts["times"], parts["out"]])
    return box, parts


def _bw(b: float) -> str:
    if b == 0:
        return "none (never pays)"
    if b == float("inf"):
        return "none (always pays)"
    return f"{b / GB:.3g} GB/s ({8 * b / GB:.3g} Gb/s)"


def _figure(parts, lk: Link, cd, v) -> Figure:
    bws = np.logspace(-2, 3, 200) * GB                                     # (200,) B/s
    hidden = parts["overlap"].value * parts["backward_ms"].value / 1e3
    args = (parts["params"].value, parts["world"].value)
    plain = [exchange_seconds(args[0], Link(lk.alpha, b), args[1], None, hidden) for b in bws]
    comp = [exchange_seconds(args[0], Link(lk.alpha, b), args[1], cd, hidden) for b in bws]
    fig = Figure(figsize=(7, 3.6))
    ax = fig.subplots()
    ax.loglog(bws / GB, np.array(plain) * 1e3, label="plain fp32 all-reduce")
    ax.loglog(bws / GB, np.array(comp) * 1e3, label=f"compressed ({cd.ratio:.0f}x fewer bytes)")
    ax.axvline(lk.bandwidth / GB, color="k", lw=1, label="this link")
    if 0 < v.break_even_bandwidth < float("inf"):
        ax.axvline(v.break_even_bandwidth / GB, color="gray", ls="--", label="break-even")
    for axis in (ax.xaxis, ax.yaxis):                  # plain tick labels: no mathtext to parse
        axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))     # (its parser is deep:
        axis.set_minor_formatter(NullFormatter())                          # a traceback in a kernel)
    ax.set(xlabel="link bandwidth (GB/s)", ylabel="exposed ms per exchange")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
