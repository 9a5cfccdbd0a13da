"""Running a learner's function and judging it: the machinery every exercise check shares.

A check (``exercise_*.py``) hands the learner's function to ``call``, which returns its result
or a hint when it raised, was not written yet, or ran past ``TIME_LIMIT_S`` (an infinite loop
fails the check instead of hanging the cell; timelimit.user_code, so the limit holds on every
platform and in any thread). ``close`` compares with the reference at a tolerance;
``best_mistake`` picks, among the usual mistakes computed as variants of the reference, the
one that explains the learner's outputs on every case; ``report`` prints one verdict, PASS or
FAIL with the first failing case (one thing to fix at a time); ``check_against`` is the whole
loop for a check whose mistakes are variants of a formula.
"""
from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import numpy as np
import torch

from grpo_lab.timelimit import UserCodeTimeout, user_code

NOT_WRITTEN = "not written yet: replace `raise NotImplementedError()` with your code"


class Failure(NamedTuple):
    case: str          # which case, with its inputs
    expected: str
    got: str
    hint: str


def fmt(x, n: int = 8) -> str:
    """A short, rounded rendering of a tensor, array, list or number."""
    if torch.is_tensor(x):
        x = x.detach().cpu().tolist()
    elif isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        items = [fmt(v) for v in x[:n]]
        return "[" + ", ".join(items) + (", ..." if len(x) > n else "") + "]"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.4g}"
    return repr(x)


def report(name: str, failure: Failure | None, n_cases: int, reference: str) -> bool:
    if failure is None:
        print(f"PASS {name}: your function agrees with {reference} on all {n_cases} cases.")
        return True
    print(f"FAIL {name}: case {failure.case}\n   expected {failure.expected}\n"
          f"   got      {failure.got}\n   hint: {failure.hint}")
    return False


def require_function(name: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{name} needs your function (a callable), got "
                        f"{type(fn).__name__} {fn!r}")


TIME_LIMIT_S = 10.0
"""Longest one call of a learner's function may run (the cases are small: the library's
own functions take milliseconds); past it the check fails with a hint instead of hanging."""


_SLOW = weakref.WeakSet()        # functions that ran past the limit once (a redefinition is new)


def call(fn, *args, **kwargs):
    """-> (result, None) or (None, hint) when the learner's function raised or ran past
    ``TIME_LIMIT_S``."""
    slow = (f"your function did not return within {TIME_LIMIT_S:g} s on a small case: an "
            f"infinite loop? (a while loop whose condition never changes)")
    if fn in _SLOW:                                 # once is enough: the other cases fail fast
        return None, slow
    try:
        with user_code("your function", TIME_LIMIT_S, grace_s=float("inf")):   # the kernel lives
            return fn(*args, **kwargs), None
    except NotImplementedError:
        return None, NOT_WRITTEN
    except UserCodeTimeout:
        _SLOW.add(fn)
        return None, slow
    except Exception as e:                                    # the learner's bug, shown as a hint
        return None, f"your function raised {type(e).__name__}: {e}"


def as_tensor(x):
    try:
        return torch.as_tensor(np.asarray(x.detach() if torch.is_tensor(x) else x),
                               dtype=torch.float64)
    except Exception:
        return None


def close(a, b, tol: float = 1e-3) -> bool:
    a, b = as_tensor(a), as_tensor(b)
    return a is not None and b is not None and a.shape == b.shape and bool(
        torch.allclose(a, b.double(), rtol=tol, atol=tol))


def best_mistake(mistakes, failing, outputs, explains) -> str | None:
    """The hint of the mistake that explains the learner's output: among those that explain the
    failing case, the first that explains every case (cases tell mistakes apart), else the first.
    ``failing`` and each of ``outputs``: (args, output); ``explains(kind, args, output)``."""
    fitting = [(kind, hint) for kind, hint in mistakes if explains(kind, *failing)]
    for kind, hint in fitting:
        if all(explains(kind, a, o) for a, o in outputs):
            return hint
    return fitting[0][1] if fitting else None


def check_against(name, fn, cases, reference, mistakes, variant, ref_name, formula,
                   pack=as_tensor) -> bool:
    """Run ``fn`` on every case, compare with ``reference``; on the first failure, name the
    mistake (from ``mistakes``) that explains all its outputs, or give the formula."""
    def packed(out):
        try:
            return pack(out)
        except Exception:
            return None
    outputs = [(args, call(fn, *[a.clone() for a in args])) for _, args in cases]
    failure = None
    for (case, args), (_, (got, err)) in zip(cases, outputs):
        expected, got_t = reference(args), None if err else packed(got)
        if got_t is not None and close(got_t, expected, 1e-6):
            continue
        if err is None and got_t is None:
            err = f"return what the docstring says; got {type(got).__name__}"
        hint = err
        if hint is None:
            ok = [(a, packed(g)) for a, (g, e) in outputs if e is None and packed(g) is not None]
            hint = best_mistake(mistakes, (args, got_t), ok, lambda kind, a, o: close(
                o, variant(kind, *a), 1e-6)) or formula
        failure = Failure(case, fmt(expected.flatten()), "an error" if err else
                          fmt(got_t.flatten() if got_t is not None else got), hint)
        break
    return report(name, failure, len(cases), ref_name)
