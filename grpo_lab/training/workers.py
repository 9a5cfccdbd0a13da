"""A study's worker processes, which end with the study however the study ends.

A study (experiments.py) trains each run in a worker process of its own, ``processes`` at
once. The ways a study can end early, and what happens to its workers:

  * SIGINT (Ctrl-C), SIGTERM or SIGHUP reaches the study: ``stop_on_signals`` turns it into
    ``StudyInterrupted``, and ``run_in_workers`` kills every worker before the exception
    leaves it. The step in progress is dropped: each run resumes from its last checkpoint.
    (A Ctrl-C in a terminal also reaches the workers; they ignore it until the trainer's own
    handler takes over, which only notes it: the study decides.)
  * kill -9 of the study: it cannot act, so each worker watches it. On Linux the kernel sends
    the worker SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``); on every platform a
    thread in the worker waits on the parent's sentinel (``multiprocessing.parent_process()``:
    a pipe on POSIX, a process handle on Windows) and ends the worker when it fires. Both work
    under fork, spawn and forkserver.
  * a worker fails or is killed: its error comes back through its pipe, or its exit code is
    named.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from contextlib import contextmanager
from multiprocessing.connection import wait

__all__ = ["StudyInterrupted", "stop_on_signals", "run_in_workers", "watch_parent"]

STOP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, s))
"""What stops a study (SIGHUP: the terminal closed; not on Windows)."""


class StudyInterrupted(KeyboardInterrupt):
    """The study stopped on a signal; its workers were killed. ``exit_code``: 128 + signal."""

    def __init__(self, signum: int):
        self.signum, self.exit_code = signum, 128 + signum
        super().__init__(f"{signal.Signals(signum).name} received")


@contextmanager
def stop_on_signals():
    """Within: SIGINT, SIGTERM and SIGHUP raise ``StudyInterrupted`` (in the main thread; in
    another thread handlers cannot be set and nothing changes). A second signal while the
    first is being handled is ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = []

    def handle(signum, frame):
        if not fired:
            fired.append(signum)
            raise StudyInterrupted(signum)

    old = {s: signal.signal(s, handle) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def watch_parent() -> None:
    """In a worker: end this process when the one that started it dies (module docstring)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        except (OSError, AttributeError):
            pass
    parent = multiprocessing.parent_process()
    if parent is not None:        # also covers a parent that died before the prctl above
        def wait_then_exit():
            parent.join()
            os._exit(1)
        threading.Thread(target=wait_then_exit, name="watch parent", daemon=True).start()


def _worker(target, job, conn) -> None:
    """A worker's body: watch the parent, leave Ctrl-C to it, run ``target(job)``, send the
    result (or the interruption) back."""
    watch_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the study decides what a Ctrl-C does
    for s in STOP_SIGNALS[1:]:                        # not the study's handlers (under fork)
        signal.signal(s, signal.SIG_DFL)
    try:
        result = target(job)
    except BaseException as e:                        # KeyboardInterrupt included: no traceback
        result = e if isinstance(e, Exception) else RuntimeError(f"{type(e).__name__}: {e}")
    conn.send(result)
    conn.close()


def run_in_workers(jobs: list, processes: int, method: str, target, on_result,
                   on_tick=None, describe=str, on_start=None) -> None:
    """Run ``target(job)`` for each of ``jobs`` in its own process (``processes`` at once,
    started by ``method``), calling ``on_result(job, result)`` here as each ends (a worker
    that died without a result: a RuntimeError naming ``describe(job)`` and its exit code)
    and ``on_tick()`` about every half second. ``on_start(job)``, called as a job starts,
    returns the job to run (a study gives it a free GPU: placement.py); ``on_result`` gets
    that job. On any exception (``StudyInterrupted``, an
    error raised by ``on_result``) every worker still running is killed before it leaves."""
    ctx = multiprocessing.get_context(method)
    queue, running = list(jobs), {}                   # reader connection -> (process, job)
    try:
        while queue or running:
            while queue and len(running) < processes:
                job = queue.pop(0)
                job = on_start(job) if on_start is not None else job
                r, w = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_worker, args=(target, job, w),
                                name=f"grpo_lab worker: {describe(job)}")
                p.start()
                w.close()                             # the child holds the writing end
                running[r] = (p, job)
            ready = wait(list(running) + [p.sentinel for p, _ in running.values()], 0.5)
            for r in list(running):
                p, job = running[r]
                if r in ready or p.sentinel in ready:
                    try:
                        result = r.recv()
                    except EOFError:
                        p.join()
                        result = RuntimeError(f"the worker process of {describe(job)} ended "
                                              f"without a result (exit code {p.exitcode})")
                    p.join()
                    r.close()
                    del running[r]
                    on_result(job, result)
            if on_tick is not None:
                on_tick()
    finally:
        for r, (p, _) in running.items():
            p.kill()                                  # SIGKILL; TerminateProcess on Windows
        for r, (p, _) in running.items():
            p.join()
            r.close()
