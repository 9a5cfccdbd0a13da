"""Lesson 13's episode explorer and its pure functions, driven without a browser."""
from __future__ import annotations

import json

import pytest
import torch

from grpo_lab.agents import step as agent_step  # noqa: F401 (the environments)
from grpo_lab.agents.credit import step_advantages, step_groups
from grpo_lab.agents.environments import get_environment
from grpo_lab.agents.episodes import sample_episodes
from grpo_lab.agents.quick import warm_start
from grpo_lab.tasks import TASKS
from grpo_lab.teaching.agents_lesson import calculator_run, episode_tokens, step_group_view
from grpo_lab.teaching.widgets.episodes import episode_explorer
from scripts import load_script

G = 6


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    torch.set_num_threads(1)                    # a short warm-up: the base writes no guesses
    model, _ = warm_start("guess_digit", 60, tmp_path_factory.mktemp("w") / "w.safetensors")
    held = TASKS["guess_digit"].eval_fn()
    ep = sample_episodes(model, [held[-7], held[0]], get_environment("guess_digit"), G,
                         generator=[torch.Generator().manual_seed(i) for i in range(2)])
    return model, ep


def test_tokens_carry_the_loss_mask(sampled):
    model, ep = sampled
    r = ep.scored.rollout
    for row in range(2 * G):
        toks = episode_tokens(model, ep, row)
        assert len(toks) == int(r.completion_mask[row].sum())
        assert sum(own for _, own in toks) == int(r.loss_mask[row].sum())
        # observations are the environment's: bracketed in the text, masked here
        assert [t for t, own in toks if not own] == [c for c in "".join(
            s.split("]")[0] for s in ep.scored.texts[row].split("[")[1:])]


def test_step_groups_are_the_credit_modules(sampled):
    model, ep = sampled
    view = step_group_view(model, ep, 1, G)
    pidx = ep.scored.rollout.prompt_index
    mine = {k: m for k, m in step_groups(ep.turns, pidx).items() if k[0] == 1}
    assert sorted(len(g["members"]) for g in view["groups"]) == sorted(len(m) for m in mine.values())
    first = view["groups"][0]               # every episode starts from the whole range
    assert first["key"] == (4, 6) and {(j, 0) for j in range(G)} <= set(first["members"])
    # (a guess the feedback rules out, "?", leaves the state as it was: that turn joins it too)
    adv = step_advantages(ep.turns, pidx, 0.95)
    for j, e in enumerate(view["episodes"]):
        assert e["row"] == G + j
        assert [t["A_step"] for t in e["turns"]] == pytest.approx(adv[G + j])
        for t, turn in enumerate(e["turns"]):
            assert (j, t) in view["groups"][turn["group"]]["members"]
    with pytest.raises(ValueError, match="prompt 2 is out of range"):
        step_group_view(model, ep, 2, G)


def test_slider_steps_through_the_episodes(sampled):
    model, ep = sampled
    box, parts = episode_explorer(model, ep, G, prompt=0)
    seen = set()
    for j in range(G):
        parts["episode"].value = j                                    # observers fire
        assert f"episode {j}:" in parts["text"].value
        assert parts["tokens"] == episode_tokens(model, ep, j)
        assert parts["groups"].value.count("<b>e") == len(parts["view"]["episodes"][j]["turns"])
        seen.add(parts["text"].value)
    assert len(seen) == G


def test_calculator_run_absent_or_checked(tmp_path):
    assert calculator_run(tmp_path / "none.json") is None
    run = {"command": "x", "cpu": "y", "steps": [{"step": 0, "heldout_acc": 0.0,
                                                 "call_rate": 0.0, "well_formed": 0.0}],
           "before": [], "after": []}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert calculator_run(tmp_path / "run.json") == run
    del run["after"]
    (tmp_path / "bad.json").write_text(json.dumps(run))
    with pytest.raises(ValueError, match="no 'after'"):
        calculator_run(tmp_path / "bad.json")


def test_lesson_13_calculator_cell_runs_with_and_without_the_record(capsys):
    """The lesson's section 4 (tools/make_nb13.py) on a recorded run of the documented shape,
    and with none: the curve and the samples, or the sentence saying where the run is kept."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    from IPython.display import display
    gen = load_script("tools/make_nb13.py")
    (src,) = [c[1] for c in gen.CELLS if "calculator_run()" in c[1]]
    run = {"command": "cmd", "cpu": "AMD EPYC",
           "steps": [{"step": s, "heldout_acc": s / 40, "call_rate": s / 30, "well_formed": 0.9}
                     for s in (0, 10, 20, 30)],
           "before": [{"prompt": "What is 964 times 59?", "completion": "5000", "reward": 0.0}],
           "after": [{"prompt": "What is 964 times 59?", "completion": "56876", "reward": 1.0}]}
    env = {"pd": pd, "plt": plt, "display": display, "calculator_run": lambda: run}
    exec(src, env)
    assert "held-out accuracy 0.00 -> 0.75, tool-call rate 0.00 -> 1.00" in capsys.readouterr().out
    env["calculator_run"] = lambda: None
    exec(src, env)
    assert "data/agents/calculator_run.json" in capsys.readouterr().out
    plt.close("all")
