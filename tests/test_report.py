"""Report helpers: running mean by hand, summary of a history."""
from grpo_lab.report import running_mean, summary, write_report


def test_running_mean_by_hand():
    assert running_mean([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert running_mean([5.0], 3) == [5.0]


def test_summary():
    h = [{"step": -1, "eval/accuracy": 0.5, "time/elapsed_s": 0.0},
         {"step": 0, "reward/mean": 1.0, "time/elapsed_s": 1.0},
         {"step": 1, "reward/mean": 2.0, "eval/accuracy": 0.75, "time/elapsed_s": 2.0}]
    s = summary(h)
    assert (s["base_accuracy"], s["final_accuracy"], s["steps"], s["wall_time_s"]) == \
        (0.5, 0.75, 2, 2.0)


def test_report_says_when_the_time_budget_ended_the_run(tmp_path):
    from grpo_lab.report import budget_note
    h = [{"step": -1, "eval/accuracy": 0.5}, {"step": 0, "time/step_s": 0.5, "reward/mean": 0.1},
         {"step": 1, "time/step_s": 0.9, "reward/mean": 0.2, "eval/accuracy": 0.6}]
    note = budget_note(h, {"time_budget_s": 300.0, "steps": 3000})
    assert "Stopped by the time budget** (300 s) after step 1 of 3000: 0.900 s per step" in note[0]
    assert budget_note(h, {"time_budget_s": 300.0, "steps": 2}) == []     # it finished
    assert budget_note(h, {"time_budget_s": 0.0, "steps": 3000}) == []    # no budget
    md = write_report(h, tmp_path, {"time_budget_s": 300.0, "steps": 3000, "task": "addition"})
    assert "Stopped by the time budget" in md.read_text()


def test_kl_panel_says_it_was_not_computed_when_beta_is_0():
    from grpo_lab.report import plot_history
    h = [{"step": s, "reward/mean": 0.1 * s, "loss/kl": 0.0} for s in range(5)]
    texts = [t.get_text() for t in plot_history(h).axes[2].texts]
    assert texts == ["beta = 0: no reference policy,\nKL not computed"]
    h[3]["loss/kl"] = 0.01                                        # a measured KL is drawn
    ax = plot_history(h).axes[2]
    assert not ax.texts and len(ax.lines) == 2


def test_report_says_whether_the_target_was_reached():
    from grpo_lab.report import budget_note
    h = [{"step": -1, "eval/accuracy": 0.5}, {"step": 0, "time/step_s": 0.5},
         {"step": 1, "time/step_s": 0.9, "eval/accuracy": 0.91, "time/elapsed_s": 1.4}]
    cfg = {"time_budget_s": 300.0, "steps": 3000, "target_accuracy": 0.9}
    assert budget_note(h, cfg)[0].startswith(
        "**Reached the target** held-out accuracy 90% (91.0%) at step 1 after 1 s")
    h[-1]["eval/accuracy"] = 0.8                     # the budget ended it before the target
    note = budget_note(h, cfg)[0]
    assert "Stopped by the time budget** (300 s) after step 1 of 3000: 0.900 s" in note
    assert note.endswith("The target 90% was not reached (best 80.0%).")
