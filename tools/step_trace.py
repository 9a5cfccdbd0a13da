"""What a reader opens to follow one GRPO step: a sys.settrace trace of one real trainer step.

    python tools/step_trace.py [--preset defaults] [--policy toy] [--list]

Runs ``trainer.train`` on one process for 3 steps (no evaluation, no checkpoint until the
end) and traces step 1 only, in two windows:

  * the step alone: from the loop's call of ``collect`` to the return of its ``step`` of the
    exchange (rollout, rewards, groups, advantages, loss, backward, the update), the functions
    first entered there;
  * on_step to on_step: from the ``on_step`` hook of step 0 to that of step 1, the loop itself,
    its clock, health check and trackers included (the setup and the warm-up step are not
    counted).

Counted in each, over the grpo_lab functions entered
(``call`` events whose code lives in the package; lambdas and comprehensions are not
functions of their own, they are read with the function around them) plus the trainer's loop function (``_train``, running
already when the trace starts):

  * functions: distinct functions entered;
  * lines: their source lines (``inspect.getsourcelines``), each function once;
  * files: distinct files among them;
  * file changes: in the order of first entry (the order a reader meets the functions), how
    often the next function lies in another file than the one before it; "per call" counts
    the same over every call (a decode loop's calls repeat);
  * if tests: ``if`` statements and conditional expressions (ast) inside the traced
    functions whose test line ran during the step ("on the path"), and all of them in
    those functions ("static").

``--list`` prints the functions (file, name, lines) in order of first entry.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import sys
import tempfile
import textwrap
from pathlib import Path

import grpo_lab

PKG = str(Path(grpo_lab.__file__).parent)


class Tracer:
    def __init__(self):
        self.order: list = []           # code objects in order of first entry
        self.seen: set = set()
        self.files_in_order: list[str] = []
        self.lines_hit: dict[str, set] = {}
        self.calls: set = set()          # (caller's file, callee's file), package files only
        self.loop = None                 # the trainer's loop function's code
        self.inside = None               # the frame of the exchange's step, once called
        self.in_step = False             # between the loop's collect and its exchange step
        self.step_order: list = []       # code objects first entered in that window

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if not code.co_filename.startswith(PKG):
            return None
        if event == "call":
            back = frame.f_back                      # the nearest package frame above
            while back is not None and not back.f_code.co_filename.startswith(PKG):
                back = back.f_back                   # (torch.no_grad's wrapper, ...)
            if back is not None and back.f_code is self.loop:
                if code.co_name == "collect":
                    self.in_step = True
                elif code.co_name == "step" and self.in_step:
                    self.inside = frame          # the update: the window ends at its return
            if self.in_step and code not in self.step_order and code.co_name not in (
                    "<lambda>", "<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<module>"):
                self.step_order.append(code)
            self.files_in_order.append(code.co_filename)
            if back is not None and back.f_code.co_filename != code.co_filename:
                self.calls.add((back.f_code.co_filename, code.co_filename))
            if code.co_name not in ("<lambda>", "<listcomp>", "<dictcomp>", "<setcomp>",
                                    "<genexpr>", "<module>") and code not in self.seen:
                self.seen.add(code)
                self.order.append(code)
        return self.local

    def local(self, frame, event, arg):
        if event == "return" and frame is self.inside:
            self.in_step, self.inside = False, None
        if event == "line":
            self.lines_hit.setdefault(frame.f_code.co_filename, set()).add(frame.f_lineno)
        return self.local


def source_of(code):
    lines, start = inspect.getsourcelines(code)
    return lines, start


def if_tests(code, hit: set) -> tuple[int, int]:
    """-> (if tests whose line ran, all if tests) in ``code``'s function (nested included)."""
    lines, start = source_of(code)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp))]
    ran = sum(1 for n in nodes if n.test.lineno + start - 1 in hit)
    return ran, len(nodes)


def trace_step(preset: str, policy: str | None) -> Tracer:
    from grpo_lab.training.config import preset as make
    from grpo_lab.training.trainer import train
    out = tempfile.mkdtemp(prefix="step_trace_")
    extra = {"policy": policy} if policy else {}
    cfg = make(preset, steps=3, eval_every=0, eval_size=0, ckpt_every=1000,
               time_budget_s=0.0, threads=1, out_dir=out, **extra)
    tracer = Tracer()
    loop = {}

    def on_step(metrics, _policy):
        if metrics["step"] == 0:
            loop["code"] = tracer.loop = sys._getframe(1).f_code   # the trainer's loop
            sys.settrace(tracer)
        elif metrics["step"] == 1:
            sys.settrace(None)

    train(cfg, progress=False, on_step=on_step)
    sys.settrace(None)
    tracer.order.insert(0, loop["code"])
    return tracer


def report(t: Tracer, show: bool, order=None, title: str = "on_step to on_step") -> dict:
    rows, ran_ifs, all_ifs, files = [], 0, 0, []
    for code in (t.order if order is None else order):
        lines, start = source_of(code)
        ran, n = if_tests(code, t.lines_hit.get(code.co_filename, set()))
        ran_ifs, all_ifs = ran_ifs + ran, all_ifs + n
        rel = str(Path(code.co_filename).relative_to(Path(PKG).parent))
        rows.append((rel, code.co_qualname, len(lines), ran, n))
        if rel not in files:
            files.append(rel)
    first = [r[0] for r in rows]
    changes = sum(1 for a, b in zip(first, first[1:]) if a != b)
    per_call = sum(1 for a, b in zip(t.files_in_order, t.files_in_order[1:]) if a != b)
    per_file = {f: sum(r[2] for r in rows if r[0] == f) for f in files}
    print(f"\n== {title}")
    if show:
        for r in rows:
            print(f"  {r[0]:44s} {r[1]:44s} {r[2]:4d} lines  if {r[3]}/{r[4]}")
    print(f"\n{'file':44s} lines (of traced functions)")
    for f, n in sorted(per_file.items(), key=lambda kv: -kv[1]):
        print(f"  {f:42s} {n:5d}")
    total = sum(r[2] for r in rows)
    calls = f" (per call {per_call})" if order is None else ""     # over the wide window
    print(f"\nfunctions {len(rows)}  lines {total}  files {len(files)}  file changes "
          f"{changes}{calls}  if tests on the path {ran_ifs} (static {all_ifs})")
    return {"functions": len(rows), "lines": total, "files": len(files),
            "file_changes": changes, "per_call": per_call, "ifs": ran_ifs, "ifs_static": all_ifs}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="defaults")
    p.add_argument("--policy", default=None, help="override the preset's policy kind")
    p.add_argument("--list", action="store_true", help="print every traced function")
    a = p.parse_args(argv)
    t = trace_step(a.preset, a.policy)
    return {"step": report(t, a.list, t.step_order, "the step alone: collect to the update"),
            "on_step": report(t, a.list)}


if __name__ == "__main__":
    main()
