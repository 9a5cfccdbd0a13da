"""Report helpers: running mean by hand, summary of a history."""
from grpo_lab.report import running_mean, summary


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
