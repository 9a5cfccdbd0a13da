"""A time limit on one call of user code (a reward, grouper, estimator or task generator), on
every platform.

A plugin that loops forever would hang a run silently, on every rank. ``user_code(what)``
arms a watchdog for the block it guards (``guarded(what, *fns)`` only when one of ``fns`` is
user code, not the package's own); past ``LIMIT_S`` seconds the watchdog raises an
exception *inside* the guarded thread (CPython's ``PyThreadState_SetAsyncExc``: it lands at
the next bytecode, so a pure-Python loop stops there), and the block re-raises it as
``UserCodeTimeout`` with the traceback of where the code was when it was stopped, which
``errors.one_line`` turns into "file:line in function()". SIGALRM would do the same on POSIX
only, and only in the main thread.

What an asynchronous exception cannot stop: code that never returns to the interpreter (a C
call that blocks, a catastrophic regular expression). After ``GRACE_S`` more seconds the
watchdog prints the one-line error itself and ends the process (``os._exit(EXIT_CODE)``):
checkpoints are written atomically, so the last one is intact, and on several processes the
launcher stops the other ranks, as for any rank that dies.

The stop is a ``BaseException`` while it travels through the user's code, so a broad
``except Exception`` there cannot swallow it; only the guard turns it into a
``UserCodeTimeout`` (a ``TimeoutError``). A block inside a guarded block runs under the outer
deadline. ``LIMIT_S`` is set per run from ``TrainConfig.user_code_timeout_s`` (trainer.setup);
0 turns the limit off.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import sys
import threading
import time

LIMIT_S = 30.0
"""Longest one call of user code may run (seconds; 0: no limit)."""
GRACE_S = 10.0
"""How long a stopped call may take to notice the stop before the process is ended."""
EXIT_CODE = 2                       # the CLI's exit code for errors in the user's code


class UserCodeTimeout(TimeoutError):
    """A call of user code ran past ``LIMIT_S``."""


class _Stop(BaseException):
    """Raised inside the guarded thread by the watchdog; the guard re-raises it as a
    ``UserCodeTimeout``."""


def _raise_in(thread_id: int, exc) -> None:
    """Raise ``exc`` in the thread at its next Python call or loop turn. Never used to take a
    stop back (``exc`` NULL): on CPython 3.11 that leaves the interpreter's eval breaker set for
    good, so every later call takes its slow path and, under ``sys.settrace`` (a debugger,
    coverage, tools/step_trace.py), the next call loops forever. A stop not yet delivered when
    its block ends lands in the disarm's first Python call instead, which drops it
    (``user_code``'s ``finally``)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc))


class _Watchdog:
    """One daemon thread for the process; ``set`` (arm, disarm) is a lock and a notify."""

    def __init__(self):
        self.cv = threading.Condition()
        self.armed: dict | None = None    # thread, deadline, what, limit, stopped, hard
        self.thread: threading.Thread | None = None

    def set(self, what: str | None, limit: float = 0.0, grace: float = 0.0) -> None:
        """Arm the watchdog for the calling thread's call of ``what`` for ``limit`` seconds
        (and ``grace`` more), or disarm it (``what`` None); the thread is marked guarded."""
        _GUARDED.on = what is not None
        with self.cv:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="grpo_lab user-code "
                                               "watchdog", daemon=True)
                self.thread.start()
            self.armed = None if what is None else {
                "thread": threading.get_ident(), "deadline": time.monotonic() + limit,
                "what": what, "limit": limit, "grace": grace, "stopped": False}
            self.cv.notify()

    def _run(self) -> None:
        with self.cv:
            while True:
                a = self.armed
                if a is None:
                    self.cv.wait()
                    continue
                left = a["deadline"] - time.monotonic()
                if left > 0:                       # inf (a notebook's grace): until notified
                    self.cv.wait(left if left < math.inf else None)
                elif not a["stopped"]:
                    a["stopped"] = True
                    a["deadline"] = time.monotonic() + a["grace"]
                    _raise_in(a["thread"], _Stop)
                else:                              # stuck outside the interpreter: end it
                    sys.stderr.write(f"grpo-lab: error: UserCodeTimeout: "
                                     f"{message(a['what'], a['limit'])}; it did not stop within "
                                     f"{a['grace']:g} s more (blocked outside Python code), so "
                                     f"the process ends\n")
                    sys.stderr.flush()
                    os._exit(EXIT_CODE)


_WATCHDOG = _Watchdog()
_GUARDED = threading.local()


def message(what: str, limit: float) -> str:
    return (f"{what} did not return within {limit:g} s (an infinite loop, or far too much work "
            f"for one call?); the limit is TrainConfig.user_code_timeout_s "
            f"(--user_code_timeout_s, 0: no limit)")


@contextlib.contextmanager
def user_code(what: str, limit_s: float | None = None, grace_s: float | None = None):
    """Run the block under a time limit of ``limit_s`` (default ``LIMIT_S``) seconds; past it,
    ``UserCodeTimeout`` naming ``what`` (e.g. "reward function 'mine'") is raised where the
    block was. ``grace_s`` (default ``GRACE_S``; ``float("inf")``: never, as in a notebook,
    whose kernel must survive) bounds how long a stop may take to land before the process
    ends."""
    limit = LIMIT_S if limit_s is None else limit_s
    if not limit or limit <= 0 or getattr(_GUARDED, "on", False):
        yield
        return
    _WATCHDOG.set(what, limit, GRACE_S if grace_s is None else grace_s)
    try:
        yield
    except _Stop as e:
        raise UserCodeTimeout(message(what, limit)).with_traceback(e.__traceback__) from None
    finally:
        while True:              # a stop landing inside disarm (the call had just returned)
            try:                 # is dropped; the disarm must finish, or the watchdog ends us
                _WATCHDOG.set(None)
                break
            except _Stop:
                pass


def _user(*fns) -> bool:
    """One of ``fns`` is user code: defined outside grpo_lab's own modules (a plugin's, a
    notebook's, a test's); the package's own records run unguarded."""
    return any(not getattr(f, "__module__", "").startswith("grpo_lab.") for f in fns)


def guarded(what: str, *fns):
    """``user_code(what)`` when one of ``fns`` is user code, else a context that does nothing."""
    return user_code(what) if _user(*fns) else contextlib.nullcontext()


def guard(what: str, fn, *also):
    """``fn`` run under ``user_code(what)`` at every call when it or one of ``also`` (what it
    calls) is user code, else ``fn`` itself: ``guarded``'s choice made once, not per call."""
    if not _user(fn, *also):
        return fn

    @functools.wraps(fn)
    def limited(*args, **kwargs):
        with user_code(what):
            return fn(*args, **kwargs)
    return limited
