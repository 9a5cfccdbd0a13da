"""bench/bench_study_throughput.py's bookkeeping, by hand: a layout parsed or refused with the
offending text, and the histories compared without what a clock measured."""
import os
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
bench = load_script("bench/bench_study_throughput.py")


def test_a_layout_is_processes_x_threads_within_the_cores():
    assert bench.layout("1x1") == (1, 1)
    for bad in ("2by1", "x1", "0x1"):
        with pytest.raises(SystemExit, match=repr(bad)):
            bench.layout(bad)
    too_many = f"{(os.cpu_count() or 1) + 1}x1"
    with pytest.raises(SystemExit, match="more than the"):
        bench.layout(too_many)


def test_histories_compare_without_the_clock():
    a = [{"step": 0, "reward/mean": 0.5, "time/step_s": 1.0, "wall_s": 3.0}]
    b = [{"step": 0, "reward/mean": 0.5, "time/step_s": 2.0, "wall_s": 9.0}]
    assert bench.comparable(a) == bench.comparable(b) == [{"step": 0, "reward/mean": 0.5}]
    b[0]["reward/mean"] = 0.5 + 2 ** -20                 # one bit of a metric: not the same
    assert bench.comparable(a) != bench.comparable(b)


def test_histories_of_two_checkouts_compared_run_by_run():
    mine = {"2x1": {"preset:0": [{"step": 0, "reward/mean": 0.5}],
                    "lr:0": [{"step": 0, "reward/mean": 0.25}],
                    "lr:1": [{"step": 0, "reward/mean": 0.75}]}}
    theirs = {"2x1": {"preset:0": [{"step": 0, "reward/mean": 0.5}],
                      "lr:0": [{"step": 0, "reward/mean": 0.25 + 2 ** -30}]}}
    assert bench.same_as(mine, theirs) == ("2x1 preset:0 identical; 2x1 lr:0 DIFFERS; "
                                           "2x1 lr:1 absent")
