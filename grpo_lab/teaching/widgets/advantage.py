"""Advantage explorer: edit one group's rewards, see each estimator's advantages and how
much every token of every completion is pushed (the gradient of the GRPO loss).

Pure computation is ``explain_group``; the widget wires sliders to it and draws.
"""
from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import torch

from grpo_lab.algorithm.advantages import ADVANTAGES
from grpo_lab.algorithm.loss import AGGREGATIONS, grpo_loss
from grpo_lab.teaching.widgets import show_figure


def explain_group(rewards, lengths, estimator="grpo", aggregation="seq_mean_token_mean",
                  max_len=None) -> dict:
    """One group, on-policy (ratio 1) -> advantages of every estimator and the per-token push.

    ``token_push[i][t]`` = -d loss / d log pi(o_it): positive means "make this token more
    likely". It is A_i times the aggregation's weight of that token, which is where
    seq_mean_token_mean favours short completions (weight 1 / (G |o_i|)).

    ``loss`` is the value the trainer logs; ``grad_norm`` is ||d loss / d log pi|| over the
    real tokens. At ratio 1 the loss is minus the weighted sum of the advantages, which is 0
    under seq_mean_token_mean (each completion weighs 1/G and the advantages have zero mean),
    while its gradient is A_i times each token's weight: not 0 unless every A_i is.
    """
    r = torch.tensor([float(x) for x in rewards])                          # (G,)
    G = len(rewards)
    if len(lengths) != G:
        raise ValueError(f"{len(lengths)} lengths for {G} rewards")
    L = max(lengths)
    ids = torch.zeros(G, dtype=torch.long)
    advs = {name: fn(r, ids) for name, fn in ADVANTAGES.items()}           # each (G,)
    mask = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]       # (G, L)
    logp = torch.zeros(G, L, requires_grad=True)
    loss, _ = grpo_loss(logp, logp.detach(), advs[estimator], mask,
                        aggregation=aggregation, max_len=max_len or L)
    (grad,) = torch.autograd.grad(loss, logp)                              # (G, L)
    push = (-grad).masked_fill(~mask, float("nan"))
    return {"rewards": r.tolist(), "advantages": {k: v.tolist() for k, v in advs.items()},
            "token_push": push.tolist(), "loss": loss.item(), "grad_norm": float(grad.norm())}


def advantage_explorer(rewards=(1.0, 0.0, 0.0, 1.0, 0.5, 0.0), lengths=None,
                       estimator="grpo", aggregation="seq_mean_token_mean"):
    """-> (box, parts). parts: reward_i sliders, estimator/aggregation dropdowns,
    "advantages" (HTML table), "data" (the latest ``explain_group`` result), "plot" (Output)."""
    G = len(rewards)
    if G < 2:
        raise ValueError(f"a group needs at least 2 rewards, got {G}")
    lengths = list(lengths or [2 + (i % 4) for i in range(G)])
    if len(lengths) != G:
        raise ValueError(f"{len(lengths)} lengths for {G} rewards")
    parts: dict = {f"reward_{i}": W.FloatSlider(value=float(v), min=0.0, max=1.0, step=0.05,
                                                description=f"r{i} (len {lengths[i]})",
                                                continuous_update=False)
                   for i, v in enumerate(rewards)}
    parts.update(estimator=W.Dropdown(options=sorted(ADVANTAGES), value=estimator,
                                      description="estimator"),
                 aggregation=W.Dropdown(options=sorted(AGGREGATIONS), value=aggregation,
                                        description="aggregation"),
                 advantages=W.HTML(), plot=W.Output(), data={})

    def update(_=None):
        rs = [parts[f"reward_{i}"].value for i in range(G)]
        d = explain_group(rs, lengths, parts["estimator"].value, parts["aggregation"].value)
        parts["data"].clear()
        parts["data"].update(d)
        head = "".join(f"<th>r{i}</th>" for i in range(G))
        rows = "".join(f"<tr><td>{k}</td>" + "".join(f"<td>{a:+.3f}</td>" for a in v) + "</tr>"
                       for k, v in d["advantages"].items())
        parts["advantages"].value = (f"<table><tr><th>estimator</th>{head}</tr>{rows}</table>"
                                     f"<p>loss (on-policy, ratio 1) = {d['loss']:+.4f}; its gradient's norm "
                                     f"= {d['grad_norm']:.4f} (the value is a sum of advantages that cancel, "
                                     f"the gradient is each token's advantage times its weight)</p>")
        with parts["plot"]:
            parts["plot"].clear_output(wait=True)
            fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 2.8))
            a1.bar(range(G), d["advantages"][parts["estimator"].value])
            a1.axhline(0, color="k", lw=0.5)
            a1.set(title=f"advantages ({parts['estimator'].value})", xlabel="completion")
            lim = max(1e-9, max(abs(x) for row in d["token_push"] for x in row if x == x))
            im = a2.imshow(d["token_push"], cmap="coolwarm", aspect="auto", vmin=-lim, vmax=lim)
            a2.set(title="per-token push  -dL/dlogp", xlabel="token", ylabel="completion")
            fig.colorbar(im, ax=a2)
            fig.tight_layout()
            show_figure(fig)

    for k, w in parts.items():
        if isinstance(w, (W.FloatSlider, W.Dropdown)):
            w.observe(update, names="value")
    update()
    sliders = W.VBox([parts[f"reward_{i}"] for i in range(G)])
    box = W.VBox([W.HBox([sliders, W.VBox([parts["estimator"], parts["aggregation"]])]),
                  parts["advantages"], parts["plot"]])
    return box, parts
