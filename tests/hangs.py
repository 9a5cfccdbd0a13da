"""Hang checks that measure progress, not wall time.

A test that a fault ends a run (a rank dies, stalls, loops) must fail when the run hangs and
must not fail because the machine is busy. So its bound starts at the fault (a time stamp
the faulty code writes with ``stamp``), not at the test's start (process start-up and the
steps before the fault are the slow part on a loaded machine), and it is

    the launcher's own timeout + the launcher's own grace + k * calibration

The timeout and grace are the fixed waits the code under test applies (a collective's
``timeout_s``, ``spawn``'s 5 s join): load does not stretch them. The calibration is a piece
of the same test's work timed on this machine now (the processes' start-up, a training
step): what happens after the fault (a rank raising, processes exiting, the parent noticing)
is work of the same kind, and load stretches both alike. A real hang adds a wait that is
none of these (torch's 30 s between SIGTERM and SIGKILL, a stall of minutes) and stays past
the bound while the calibration is small next to it; each test states that margin.
"""
import time
from pathlib import Path


def stamp(path) -> None:
    """Write the time now to ``path`` (wall-clock seconds: comparable across processes)."""
    Path(path).write_text(repr(time.time()))


def stamped(path) -> float:
    return float(Path(path).read_text())


def fault_to_error_bound(timeout_s: float, grace_s: float, calibration_s: float,
                         k: float = 1.0) -> float:
    """The longest a fault may take to become the error: the launcher's timeout and grace
    plus ``k`` times the calibration measured in the same test."""
    return timeout_s + grace_s + k * calibration_s


def assert_ended_in_time(fault_at: float, error_at: float, timeout_s: float, grace_s: float,
                         calibration_s: float, k: float = 1.0) -> None:
    took = error_at - fault_at
    bound = fault_to_error_bound(timeout_s, grace_s, calibration_s, k)
    assert took < bound, (f"{took:.1f} s from the fault to the error, over {bound:.1f} s "
                          f"(timeout {timeout_s} s + grace {grace_s} s + {k} x "
                          f"{calibration_s:.1f} s of calibration): a hang, not slowness")
