"""One line for an error, naming where it came from: what the CLI prints (``--debug``: the
traceback instead).

An error in a user's plugin, grouper, reward or estimator surfaces deep inside the trainer;
its traceback is long and its last line ("KeyError: 'x'") does not say whose code raised it.
``one_line`` keeps that last line and adds the innermost frame of code that is neither
grpo_lab's nor installed (stdlib, site-packages): the user's file, line and function; failing
that, the innermost grpo_lab frame. The trainer adds a note "at step N" (``add_note``) to
errors raised during the loop; notes are appended too.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from pathlib import Path

PACKAGE = str(Path(__file__).resolve().parent) + os.sep
INSTALLED = tuple({str(Path(p).resolve()) + os.sep for p in
                   (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                    sysconfig.get_paths()["platlib"], sys.base_prefix, sys.prefix)})


def origin(e: BaseException) -> str | None:
    """'file.py:LINE in function()' of the innermost user frame of ``e``'s traceback (else the
    innermost grpo_lab frame), or None without a traceback."""
    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ else []
    ours = None
    for i, f in reversed(list(enumerate(frames))):
        path = str(Path(f.filename).resolve()) if not f.filename.startswith("<") else f.filename
        if path.startswith(PACKAGE):
            ours = ours or f
        elif not path.startswith(INSTALLED) and not path.startswith("<frozen"):
            # a comprehension is a frame of its own (<listcomp>): name the function around it
            name = next((g.name for g in reversed(frames[:i + 1])
                         if g.filename == f.filename and not g.name.startswith("<")), f.name)
            return f"{Path(f.filename).name}:{f.lineno} in {name}()"
    if ours is not None:
        return f"grpo_lab/{Path(ours.filename).resolve().relative_to(PACKAGE)}:{ours.lineno} " \
               f"in {ours.name}()"
    return None


def one_line(e: BaseException) -> str:
    """'Type: first line of the message (raised at file:line in f(), at step N)'."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    where = [f"raised at {o}"] if (o := origin(e)) else []
    where += [n for n in getattr(e, "__notes__", []) if n]
    head = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return head + (f" ({', '.join(where)})" if where else "")
