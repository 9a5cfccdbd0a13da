"""Make the learners' notebooks from the solutions, so the two never drift.

    python notebooks/exercises/make_exercises.py          # write notebooks/exercises/*.ipynb
    python notebooks/exercises/make_exercises.py --check  # exit 1 if one is out of date

The solutions (``solutions/*.ipynb``) are the source, marked as nbgrader marks its source
notebooks, and this script applies nbgrader's two rules to code cells (``nbgrader generate_assignment``
does the same; it is not a dependency because it brings a database and a server extension
for grading, which a workshop does not need):

  * ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` -> ``# YOUR CODE HERE`` and
    ``raise NotImplementedError()`` at the marker's indentation;
  * ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` -> removed (the solution asserts
    that its check passes; the learner sees the verdict without a traceback).

Outputs are cleared and the kernelspec is python3, as for every stored notebook.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SOLUTIONS = HERE / "solutions"
MARKERS = {"SOLUTION": ["# YOUR CODE HERE", "raise NotImplementedError()"], "HIDDEN TESTS": []}


def strip_markers(source: str, where: str = "cell") -> str:
    """Apply the two nbgrader rules to one cell's source; unbalanced markers raise."""
    out, inside, indent = [], None, ""
    for n, line in enumerate(source.splitlines(), 1):
        text = line.strip()
        begin = [m for m in MARKERS if text == f"### BEGIN {m}"]
        end = [m for m in MARKERS if text == f"### END {m}"]
        if begin:
            if inside:
                raise ValueError(f"{where} line {n}: {text!r} inside an open {inside} block")
            inside, indent = begin[0], line[:len(line) - len(line.lstrip())]
            out += [indent + s for s in MARKERS[inside]]
        elif end:
            if inside != end[0]:
                raise ValueError(f"{where} line {n}: {text!r} without its BEGIN marker")
            inside = None
        elif inside is None:
            out.append(line)
    if inside:
        raise ValueError(f"{where}: ### BEGIN {inside} is never closed")
    return "\n".join(out).rstrip("\n")


def make_exercise(solution: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(solution, as_version=4)
    n_solutions = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        n_solutions += "### BEGIN SOLUTION" in cell.source
        cell.source = strip_markers(cell.source, f"{solution.name} cell {i}")
        cell.outputs, cell.execution_count = [], None
        cell.metadata = {}
    if n_solutions == 0:
        raise ValueError(f"{solution} has no ### BEGIN SOLUTION block: nothing to exercise")
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"}, "language_info": {"name": "python"}}
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only verify the exercises are current")
    args = ap.parse_args(argv)
    solutions = sorted(SOLUTIONS.glob("*.ipynb"))
    if not solutions:
        raise SystemExit(f"no solution notebooks in {SOLUTIONS}")
    stale = []
    for sol in solutions:
        text = nbformat.writes(make_exercise(sol)) + "\n"
        target = HERE / sol.name
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(target.name)
        else:
            target.write_text(text)
            print(f"wrote {target.relative_to(HERE.parent.parent)}")
    if stale:
        print(f"out of date (run {Path(__file__).name}): {stale}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
