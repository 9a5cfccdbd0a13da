"""Report helpers: running mean by hand, summary of a history."""
import json
import math

import pytest

from grpo_lab.training.report import running_mean, summary, write_report


def test_running_mean_by_hand():
    assert running_mean([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert running_mean([5.0], 3) == [5.0]


def test_a_nan_or_inf_point_is_left_out_of_the_running_mean_not_every_later_one():
    # window 2: [1], [1, NaN] -> 1, [NaN, 3] -> 3, [3, 5] -> 4, [5, 7] -> 6 (the old running
    # sum gave NaN from the NaN on: the bold curve ended there)
    assert running_mean([1.0, math.nan, 3.0, 5.0, 7.0], 2) == [1.0, 1.0, 3.0, 4.0, 6.0]
    assert running_mean([1.0, math.inf, 3.0, 5.0], 2) == [1.0, 1.0, 3.0, 4.0]
    out = running_mean([math.nan, math.nan, 3.0], 2)           # a window of NaN only: NaN
    assert math.isnan(out[0]) and math.isnan(out[1]) and out[2] == 3.0


def test_report_names_the_metrics_and_steps_that_are_nan_or_infinite(tmp_path):
    h = [{"step": -1, "eval/accuracy": 0.2, "time/elapsed_s": 0.0},
         {"step": 0, "reward/mean": 0.1, "loss/kl": math.inf, "time/elapsed_s": 1.0},
         {"step": 1, "reward/mean": 0.2, "loss/kl": math.inf, "eval/accuracy": math.nan,
          "time/elapsed_s": 2.0}]
    md = write_report(h, tmp_path, {"task": "addition"}).read_text()
    assert "| after training | nan% |" in md                 # the value as recorded, and why:
    assert ("**Not a number** (NaN or infinite) in the history: loss/kl at steps 0, 1; "
            "eval/accuracy at step 1.") in md
    clean = write_report(h[:1], tmp_path, {"task": "addition"}).read_text()
    assert "Not a number" not in clean


def test_summary():
    h = [{"step": -1, "eval/accuracy": 0.5, "time/elapsed_s": 0.0},
         {"step": 0, "reward/mean": 1.0, "time/elapsed_s": 1.0},
         {"step": 1, "reward/mean": 2.0, "eval/accuracy": 0.75, "time/elapsed_s": 2.0}]
    s = summary(h)
    assert (s["base_accuracy"], s["final_accuracy"], s["steps"], s["wall_time_s"]) == \
        (0.5, 0.75, 2, 2.0)


def test_report_says_when_the_time_budget_ended_the_run(tmp_path):
    from grpo_lab.training.report import budget_note
    h = [{"step": -1, "eval/accuracy": 0.5}, {"step": 0, "time/step_s": 0.5, "reward/mean": 0.1},
         {"step": 1, "time/step_s": 0.9, "reward/mean": 0.2, "eval/accuracy": 0.6}]
    note = budget_note(h, {"time_budget_s": 300.0, "steps": 3000})
    # the median of 0.5 and 0.9 s: 0.7 (the upper of the two middle values was said before)
    assert "Stopped by the time budget** (300 s) after step 1 of 3000: 0.700 s per step" in note[0]
    assert budget_note(h, {"time_budget_s": 300.0, "steps": 2}) == []     # it finished
    assert budget_note(h, {"time_budget_s": 0.0, "steps": 3000}) == []    # no budget
    md = write_report(h, tmp_path, {"time_budget_s": 300.0, "steps": 3000, "task": "addition"})
    assert "Stopped by the time budget" in md.read_text()


def _history(steps=40, kl=0.0, clip=0.0):
    h = [{"step": -1, "eval/accuracy": 0.5}]
    for s in range(steps):
        h.append({"step": s, "reward/mean": 0.1 * s, "loss/kl": kl * s, "clip/high_frac": clip,
                  "clip/low_frac": clip / 2, "completion/mean_len": 4.0 + s % 3,
                  "group/zero_std_frac": 0.5})
        if s % 10 == 9:
            h[-1]["eval/accuracy"] = 0.5 + 0.01 * s
    return h


def _titles(fig):
    return [ax.get_title() for ax in fig.axes]


def test_empty_panels_are_left_out_and_the_rest_fill_rows_of_three():
    from grpo_lab.training.report import plot_history
    fig = plot_history(_history(kl=0.0, clip=0.0))        # beta = 0, mu = 1: nothing to show
    assert _titles(fig) == ["mean reward (train samples)", "held-out greedy accuracy",
                            "completion length", "groups with equal rewards"]
    assert [ax.get_subplotspec().get_geometry()[:2] for ax in fig.axes] == [(2, 3)] * 4
    fig = plot_history(_history(kl=0.01, clip=0.1))       # all six: a full 2 x 3 grid
    assert len(fig.axes) == 6 and "KL to reference (k3)" in _titles(fig)
    clip = fig.axes[_titles(fig).index("tokens clipped")]
    assert [line.get_label() for line in clip.lines if not line.get_label().startswith("_")] \
        == ["high_frac", "low_frac"]
    only_reward = plot_history([{"step": 0, "reward/mean": 1.0}])
    assert _titles(only_reward) == ["mean reward (train samples)"]


def test_every_panel_has_a_y_label_readable_text_and_the_target_line():
    from grpo_lab.training.report import FONT, WIDTH_IN, plot_history
    fig = plot_history(_history(kl=0.01, clip=0.1), "GRPO on addition", target=0.9)
    assert fig.get_size_inches()[0] == WIDTH_IN
    assert all(ax.get_ylabel() for ax in fig.axes)
    acc = fig.axes[1]
    dashed = [line for line in acc.lines if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and list(dashed[0].get_ydata()) == [0.9, 0.9]
    assert "target 90%" in [t.get_text() for t in acc.get_legend().get_texts()]
    texts = [t for ax in fig.axes for t in [ax.title, ax.xaxis.label, ax.yaxis.label,
                                            *ax.get_xticklabels(), *ax.get_yticklabels()]]
    assert min(t.get_fontsize() for t in texts) >= FONT >= 9


def test_no_label_is_clipped_and_no_two_panels_overlap():
    """Drawn with the report's layout, every panel's box with its labels lies inside the figure
    and no two panels' boxes overlap (labels overprinting a neighbour)."""
    from grpo_lab.training.report import plot_history
    fig = plot_history(_history(kl=0.01, clip=0.1), "GRPO on addition", target=0.9)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    page = fig.bbox
    boxes = [ax.get_tightbbox(r) for ax in fig.axes]
    for b in boxes:
        assert page.x0 <= b.x0 and b.x1 <= page.x1 and page.y0 <= b.y0 and b.y1 <= page.y1, b
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)


def test_report_png_is_left_out_when_nothing_was_logged(tmp_path):
    md = write_report([{"step": -1}], tmp_path, {"task": "addition"}).read_text()
    assert "report.png" not in md and not (tmp_path / "report.png").exists()


def test_an_empty_history_is_a_report_of_0_steps_not_an_index_error(tmp_path):
    # a run stopped before its base evaluation was logged, or a history built by hand
    assert summary([])["wall_time_s"] == 0.0 and summary([])["steps"] == 0
    md = write_report([], tmp_path).read_text()
    assert "0 steps in 0 s of training." in md and "No held-out evaluation" in md


def test_report_says_whether_the_target_was_reached():
    from grpo_lab.training.report import budget_note
    h = [{"step": -1, "eval/accuracy": 0.5}, {"step": 0, "time/step_s": 0.5},
         {"step": 1, "time/step_s": 0.9, "eval/accuracy": 0.91, "time/elapsed_s": 1.4}]
    cfg = {"time_budget_s": 300.0, "steps": 3000, "target_accuracy": 0.9}
    assert budget_note(h, cfg)[0].startswith(
        "**Reached the target** held-out accuracy 90% (91.0%) at step 1 after 1 s")
    h[-1]["eval/accuracy"] = 0.8                     # the budget ended it before the target
    note = budget_note(h, cfg)[0]
    assert "Stopped by the time budget** (300 s) after step 1 of 3000: 0.700 s" in note
    assert note.endswith("The target 90% was not reached (best 80.0%).")


def test_a_samples_line_cut_by_a_kill_is_left_out_and_a_bad_middle_line_is_named(tmp_path):
    from grpo_lab.algorithm import samples
    one = {"task": "addition", "prompt": "1+1=", "completion": "2", "answer": "2",
           "reward": 1.0, "accuracy": 1.0, "stopped": True}
    row = json.dumps({"step": -1, "samples": [one]})
    (tmp_path / samples.FILE).write_text(row + "\n" + row.replace("-1", "10")[:30])  # killed
    assert samples.read(tmp_path) == [{"step": -1, "samples": [one]}]
    h = [{"step": -1, "eval/accuracy": 0.2, "time/elapsed_s": 0.0}]
    assert "1+1=" in write_report(h, tmp_path, {"task": "addition"}).read_text()
    (tmp_path / samples.FILE).write_text(row + "\n{oops\n\n" + row + "\n")
    with pytest.raises(ValueError, match=r"samples.jsonl:2 is not JSON .*'\{oops'"):
        samples.read(tmp_path)
