"""Lesson 13's pure functions: an episode's tokens with their mask, the step groups GiGPO forms
over one prompt's G episodes, and the stored SmolLM2 calculator run.

    episode_tokens(model, episodes, row)      -> [(text, policy's?)] one per completion token
    step_group_view(model, episodes, prompt)  -> the prompt's G episodes and their step groups
    calculator_run(path=None)                 -> data/agents/calculator_run.json, or None

The widget (widgets/episodes.py) only draws what these return.
"""
from __future__ import annotations

import json
from pathlib import Path

from grpo_lab.agents.credit import discounted_returns, step_advantages, step_groups

CALCULATOR_RUN = ("agents", "calculator_run.json")
"""Where the SmolLM2 calculator run is recorded, under the package's data folder."""


def episode_tokens(model, episodes, row: int) -> list[tuple[str, bool]]:
    """Episode ``row``'s completion, token by token: (its text, ``<eos>`` for the end of an
    action; True when the policy sampled it, False for the environment's, masked) -> only the
    real tokens (padding left out)."""
    r = episodes.scored.rollout
    ids = r.completion_ids[row][r.completion_mask[row]].tolist()
    own = r.loss_mask[row][r.completion_mask[row]].tolist()
    return [("<eos>" if t == model.eos_id else model.decode([t]), bool(o))
            for t, o in zip(ids, own)]


def step_group_view(model, episodes, prompt: int, G: int, gamma: float = 0.95,
                    step_norm: str = "std") -> dict:
    """Prompt ``prompt``'s G episodes (rows prompt*G .. prompt*G+G-1) and GiGPO's step groups
    over them -> {"episodes": [{"row", "text", "return", "turns": [{"key", "action", "reward",
    "R", "A_step", "group"}]}], "groups": [{"key", "members": [(episode j, turn t)],
    "returns", "A_step"}]}: groups in order of first appearance, "group" the index of a turn's
    group; a group of one turn has A_step 0 (credit.step_advantages)."""
    turns = episodes.turns
    pidx = episodes.scored.rollout.prompt_index
    rows = list(range(prompt * G, prompt * G + G))
    if rows[-1] >= len(turns):
        raise ValueError(f"prompt {prompt} is out of range: the episodes hold "
                         f"{len(turns) // G} prompts of G={G}")
    mine = pidx[rows[0]]
    if (pidx[rows] != mine).any() or (prompt and pidx[rows[0] - 1] == mine) or \
            (rows[-1] + 1 < len(pidx) and pidx[rows[-1] + 1] == mine):
        raise ValueError(f"rows {rows[0]}-{rows[-1]} are not one prompt's episodes: G={G} is "
                         f"not the G the episodes were sampled with")
    adv = step_advantages(turns, pidx, gamma, step_norm)
    groups = {k: m for k, m in step_groups(turns, pidx).items() if k[0] == int(pidx[rows[0]])}
    order = sorted(groups, key=lambda k: min(groups[k]))              # first appearance
    index = {k: n for n, k in enumerate(order)}
    out_eps = []
    for j, i in enumerate(rows):
        R = discounted_returns([t.reward for t in turns[i]], gamma)
        ids = episodes.scored.rollout.completion_ids[i].tolist()
        out_eps.append({"row": i, "text": episodes.scored.texts[i],
                        "return": float(episodes.scored.rewards[i]), "end": episodes.end[i],
                        "turns": [{"key": t.key, "reward": t.reward, "R": R[n],
                                   "action": model.decode([x for x in ids[t.start:t.end]
                                                           if x != model.eos_id]),
                                   "A_step": adv[i][n], "group": index[(int(pidx[i]), t.key)]}
                                  for n, t in enumerate(turns[i])]})
    out_groups = []
    for k in order:
        members = [(i - rows[0], t) for i, t in groups[k]]
        out_groups.append({"key": k[1], "members": members,
                           "returns": [out_eps[j]["turns"][t]["R"] for j, t in members],
                           "A_step": [out_eps[j]["turns"][t]["A_step"] for j, t in members]})
    return {"episodes": out_eps, "groups": out_groups}


def calculator_run(path: str | Path | None = None) -> dict | None:
    """The SmolLM2 calculator run (``data/agents/calculator_run.json``: "command", "cpu",
    "steps" [{"step", "heldout_acc", "call_rate", "well_formed"}], "before" and "after"
    [{"prompt", "completion", "reward"}]) -> its dict, or None where it is not recorded (yet).
    A file that is there but lacks a key is an error naming the key."""
    if path is None:
        from grpo_lab.paths import DATA_DIR
        path = Path(DATA_DIR).joinpath(*CALCULATOR_RUN)
    path = Path(path)
    if not path.is_file():
        return None
    run = json.loads(path.read_text())
    for key in ("command", "cpu", "steps", "before", "after"):
        if key not in run:
            raise ValueError(f"{path}: the calculator run has no {key!r} (keys: {sorted(run)})")
    for key in ("step", "heldout_acc", "call_rate", "well_formed"):
        if run["steps"] and key not in run["steps"][0]:
            raise ValueError(f"{path}: the calculator run's steps have no {key!r}")
    return run
