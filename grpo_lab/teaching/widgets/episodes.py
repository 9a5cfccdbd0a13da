"""Episode explorer: step through the G episodes of one prompt and see the step groups GiGPO
forms from them (anchor states: the turns taken from equal environment states).

Pure computation is ``agents_lesson.step_group_view``; the widget wires an episode slider to it
and draws: the chosen episode's tokens (policy's and masked), and a grid of every episode's
turns coloured by step group, the chosen episode's row framed.
"""
from __future__ import annotations

import html

import ipywidgets as W
import matplotlib.pyplot as plt

from grpo_lab.teaching.agents_lesson import episode_tokens, step_group_view
from grpo_lab.teaching.widgets import show_figure


def draw_tokens(tokens, ax, title: str = "") -> None:
    """One episode's tokens as a row of boxes: the policy's blue (trained on), the
    environment's grey and hatched (mask 0), the loss mask written under each."""
    for x, (text, own) in enumerate(tokens):
        ax.add_patch(plt.Rectangle((x, 0), 0.92, 1, color="tab:blue" if own else "0.85",
                                   hatch=None if own else "//", ec="0.4"))
        ax.text(x + 0.46, 0.5, "eos" if text == "<eos>" else text, ha="center", va="center",
                fontsize=8, color="white" if own else "black")
        ax.text(x + 0.46, -0.35, str(int(own)), ha="center", va="center", fontsize=8)
    ax.text(-0.2, -0.35, "mask", ha="right", va="center", fontsize=8)
    ax.set(xlim=(-1.2, max(len(tokens), 12)), ylim=(-0.7, 1.1), title=title)   # boxes of one width
    ax.axis("off")


def draw_groups(view: dict, ax, chosen: int | None = None) -> None:
    """Every episode's turns (rows: episodes, columns: turns), each cell the action taken,
    coloured by its step group; ``chosen``'s row framed."""
    cmap = plt.get_cmap("tab20")
    for j, ep in enumerate(view["episodes"]):
        for t, turn in enumerate(ep["turns"]):
            ax.add_patch(plt.Rectangle((t, j), 0.95, 0.9, color=cmap(turn["group"] % 20)))
            ax.text(t + 0.47, j + 0.45, f"{turn['action']}  {turn['A_step']:+.2f}",
                    ha="center", va="center", fontsize=8)
        ax.text(3.25 if not ep["turns"] else len(ep["turns"]) + 0.1, j + 0.45,
                f"return {ep['return']:.2f}", va="center", fontsize=8)
    if chosen is not None:
        ax.add_patch(plt.Rectangle((-0.05, chosen - 0.05), max(len(view["episodes"][chosen]["turns"]), 1)
                                   + 0.05, 1.0, fill=False, ec="k", lw=2))
    n_turns = max((len(e["turns"]) for e in view["episodes"]), default=1)
    ax.set(xlim=(-0.1, n_turns + 1.2), ylim=(len(view["episodes"]), -0.1),
           xticks=[t + 0.47 for t in range(n_turns)],
           xticklabels=[f"turn {t}" for t in range(n_turns)],
           yticks=[j + 0.45 for j in range(len(view["episodes"]))],
           yticklabels=[f"episode {j}" for j in range(len(view["episodes"]))],
           title="actions (and step advantage A^S), coloured by step group")
    ax.tick_params(length=0)


def groups_html(view: dict, chosen: int) -> str:
    """The step groups as a table; the chosen episode's turns in bold."""
    rows = []
    for n, g in enumerate(view["groups"]):
        members = ", ".join(
            (f"<b>e{j}.t{t}</b>" if j == chosen else f"e{j}.t{t}") +
            f" ({html.escape(view['episodes'][j]['turns'][t]['action'])}: "
            f"R {view['episodes'][j]['turns'][t]['R']:.2f}, A^S {a:+.2f})"
            for (j, t), a in zip(g["members"], g["A_step"]))
        rows.append(f"<tr><td>{n}</td><td>{html.escape(str(g['key']))}</td>"
                    f"<td>{len(g['members'])}</td><td style='text-align:left'>{members}</td></tr>")
    return ("<table><tr><th>group</th><th>state key</th><th>turns</th>"
            "<th style='text-align:left'>members (episode.turn: action, return R_t, step "
            "advantage)</th></tr>" + "".join(rows) + "</table>")


def episode_explorer(model, episodes, G: int, prompt: int = 0, gamma: float = 0.95,
                     step_norm: str = "std"):
    """-> (box, parts). parts: "episode" (IntSlider over the prompt's G episodes), "text" (HTML:
    the chosen episode, observations in brackets), "groups" (HTML table of the step groups),
    "view" (``step_group_view``'s dict), "tokens" (the chosen episode's ``episode_tokens``),
    "plot" (Output)."""
    view = step_group_view(model, episodes, prompt, G, gamma, step_norm)
    parts: dict = {"episode": W.IntSlider(value=0, min=0, max=G - 1, description="episode",
                                          continuous_update=False),
                   "text": W.HTML(), "groups": W.HTML(), "plot": W.Output(), "view": view,
                   "tokens": []}

    def update(_=None):
        j = parts["episode"].value
        ep = view["episodes"][j]
        parts["tokens"][:] = episode_tokens(model, episodes, ep["row"])
        parts["text"].value = (f"<p>episode {j}: <code>{html.escape(ep['text'])}</code> "
                               f"(ended: {ep['end']}, return {ep['return']:.2f}); "
                               f"{len(view['groups'])} step groups over the {G} episodes</p>")
        parts["groups"].value = groups_html(view, j)
        with parts["plot"]:
            parts["plot"].clear_output(wait=True)
            fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 1.6 + 0.45 * G),
                                         gridspec_kw={"height_ratios": [1.2, 0.45 * G]})
            draw_tokens(parts["tokens"], a1, f"episode {j}: blue = the policy's tokens (trained), "
                                            f"grey = the environment's (masked)")
            draw_groups(view, a2, j)
            fig.tight_layout()
            show_figure(fig)

    parts["episode"].observe(update, names="value")
    update()
    return W.VBox([parts["episode"], parts["text"], parts["plot"], parts["groups"]]), parts
