"""Sharder explorer: a policy, a number of ranks and a re-shard interval, over recorded steps.

Pick the assignment policy, the number of ranks and how often to re-shard; the explorer replays
recorded gradients of the toy policy (``experiments.record_gradients``) through
``replay.replay_sharding`` (importance.update_moments + shard_plan.assign, pure) and shows, at the
chosen step, which rank owns which shard, and over all steps the per-rank Adam bytes, the
importance each rank holds, the imbalance and the bytes migrated by re-shards. Every number is
in ``parts["data"]``; the widget only wires controls to the replay and draws with matplotlib.
"""
from __future__ import annotations

import ipywidgets as W
import numpy as np
from matplotlib.figure import Figure

from grpo_lab.distributed.importance import IMPORTANCE
from grpo_lab.distributed.replay import replay_sharding
from grpo_lab.training.experiments import record_gradients
from grpo_lab.distributed.shard_plan import POLICIES
from grpo_lab.teaching.widgets import show_figure


def sharder_explorer(recording: dict | None = None, steps: int = 30, plots: bool = True):
    """-> (box, parts). parts: policy, ranks, interval, score, step (controls); summary (HTML);
    out (the plots, drawn when ``plots``); data (the replay and the chosen step's numbers)."""
    rec = recording if recording is not None else record_gradients(steps=steps)
    n_steps = len(rec["grads"])
    parts = {
        "policy": W.Dropdown(options=list(POLICIES), value="importance_round_robin",
                             description="policy"),
        "ranks": W.IntSlider(value=2, min=2, max=8, description="ranks"),
        "interval": W.IntSlider(value=min(10, n_steps), min=0, max=n_steps,
                                description="re-shard every",
                                style={"description_width": "initial"}),   # the whole label
        "score": W.Dropdown(options=list(IMPORTANCE), value="seed", description="importance"),
        "step": W.IntSlider(value=n_steps - 1, min=0, max=n_steps - 1, description="step"),
        "summary": W.HTML(), "out": W.Output(), "data": {},
    }

    last = {}                                         # the replay of the current controls

    def refresh(_=None):
        key = tuple(parts[k].value for k in ("policy", "ranks", "interval", "score"))
        if last.get("key") != key:                    # moving the step slider replays nothing
            last.update(key=key, replay=replay_sharding(rec, *key))
        r = last["replay"]
        t = parts["step"].value
        data = parts["data"]
        data.clear()
        data.update(r, step=t, owner_now=r["owner"][t], loads_now=r["loads"][t],
                    imbalance_now=r["imbalance"][t], total_migrated=sum(r["migrated_bytes"]),
                    reshards=sum(1 for m in r["moved"] if m))
        loads = ", ".join(f"{b / 1024:.0f}" for b in r["loads"][t])
        parts["summary"].value = (
            f"step {t}: {len(r['shards'])} shards; Adam state per rank (KiB) {loads}; "
            f"imbalance {r['imbalance'][t]:.3f}; migrated so far "
            f"{sum(r['migrated_bytes'][:t + 1]) / 1e6:.3f} MB in "
            f"{sum(1 for m in r['moved'][:t + 1] if m)} re-shards that moved shards")
        if plots:
            parts["out"].clear_output(wait=True)
            with parts["out"]:
                show_figure(_figure(r, t, parts["ranks"].value))

    for name in ("policy", "ranks", "interval", "score", "step"):
        parts[name].observe(refresh, names="value")
    refresh()
    box = W.VBox([W.HBox([parts["policy"], parts["score"]]),
                  W.HBox([parts["ranks"], parts["interval"]]), parts["step"],
                  parts["summary"], parts["out"]])
    return box, parts


def _figure(r: dict, t: int, n_ranks: int) -> Figure:
    fig = Figure(figsize=(9, 6.5), layout="constrained")    # notebook width, 9 pt text
    ax = fig.subplots(2, 2)
    numel = np.array([s.numel for s in r["shards"]])
    left = np.concatenate([[0], np.cumsum(numel)[:-1]])
    owner = np.array(r["owner"][t])
    colors = [f"C{o}" for o in owner]
    ax[0, 0].barh(owner, numel, left=left, color=colors, edgecolor="k", linewidth=0.3)
    ax[0, 0].set_yticks(range(n_ranks))
    ax[0, 0].set(xlabel="parameter elements (shards in model order)", ylabel="owner rank")
    ax[0, 0].set_title(f"assignment at step {t}", fontsize=10)
    loads = np.array(r["loads"]) / 1024                                   # (steps, N)
    for k in range(n_ranks):
        ax[0, 1].plot(loads[:, k], label=f"rank {k}", color=f"C{k}")
    ax[0, 1].set_title("Adam state per rank (KiB)", fontsize=10)
    ax[0, 1].legend(fontsize=9, ncols=2)
    scores = np.array(r["scores"]).T                                      # (S, steps)
    im = ax[1, 0].imshow(np.log10(scores + 1e-12), aspect="auto", cmap="viridis")
    ax[1, 0].set_title("importance score per shard (log10) over steps", fontsize=10)
    ax[1, 0].set(xlabel="step", ylabel="shard")
    fig.colorbar(im, ax=ax[1, 0], fraction=0.046)
    ax[1, 1].plot(r["imbalance"], label="imbalance (max/mean bytes)")
    ax2 = ax[1, 1].twinx()
    ax2.bar(range(len(r["migrated_bytes"])), np.array(r["migrated_bytes"]) / 1e6, color="C3",
            alpha=0.5, label="migrated MB")
    ax[1, 1].set_title("imbalance (line) and migrated MB (bars)", fontsize=10)
    ax[1, 1].set_xlabel("step")
    for a in [*ax.flat, ax2]:
        a.tick_params(labelsize=9)
        a.xaxis.label.set_fontsize(9)
        a.yaxis.label.set_fontsize(9)
    return fig
