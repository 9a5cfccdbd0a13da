"""The exercise notebooks: generated from the solutions, and every check fails on the stubs.

The solutions (notebooks/exercises/solutions/) run under nbval with the rest of notebooks/
and assert that their checks pass. Here: the learners' versions are current (the script
that makes them from the solutions has nothing to change), and run as a learner first
runs them, every check cell prints a failed verdict with a hint and nothing raises.
"""
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent

EXERCISES = ROOT / "notebooks" / "exercises"
sys.path.insert(0, str(EXERCISES))
import make_exercises  # noqa: E402

STUBS = sorted(EXERCISES.glob("*.ipynb"))


def test_there_is_one_exercise_per_solution():
    names = [p.name for p in STUBS]
    assert names == sorted(p.name for p in (EXERCISES / "solutions").glob("*.ipynb"))
    assert {"advantages.ipynb", "loss.ipynb", "grouping.ipynb", "compression.ipynb"} <= set(names)


def test_exercises_are_generated_from_the_solutions():
    r = subprocess.run([sys.executable, str(EXERCISES / "make_exercises.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_nbval_does_not_collect_the_stubs_but_collects_the_solutions():
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--nbval-lax",
                        "-p", "no:cacheprovider", "notebooks/exercises"], cwd=ROOT,
                       capture_output=True, text=True)
    collected = {line.split("::")[0] for line in r.stdout.splitlines() if "::" in line}
    assert collected == {f"notebooks/exercises/solutions/{p.name}" for p in STUBS}, r.stdout


@pytest.mark.parametrize("text, msg", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without its BEGIN"),
    ("### BEGIN SOLUTION\n### BEGIN HIDDEN TESTS", "inside an open SOLUTION block"),
])
def test_unbalanced_markers_are_named(text, msg):
    with pytest.raises(ValueError, match=msg):
        make_exercises.strip_markers(text, "demo cell 3")


def test_markers_become_nbgrader_stubs_at_their_indentation():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n" \
          "ok = f(1)\n### BEGIN HIDDEN TESTS\nassert ok\n### END HIDDEN TESTS"
    assert make_exercises.strip_markers(src) == \
        "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\nok = f(1)"


@pytest.mark.parametrize("path", STUBS, ids=[p.stem for p in STUBS])
def test_every_check_fails_on_the_stub_with_its_hint(path):
    nb = nbformat.read(path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert sum("# YOUR CODE HERE" in s for s in code) >= 1
    assert not any("### " in s for s in code), "a marker survived"
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(EXERCISES)}}).execute()
    checks = [c for c in nb.cells if c.cell_type == "code" and "check_" in c.source
              and "import" not in c.source]
    assert checks
    for cell in checks:
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert "FAIL" in text and "hint: not written yet" in text, (path.name, cell.source, text)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors, errors
    # "Run All" on a stub shows no reference code: no printed source (a `def` line), and no
    # printed line of a solution block
    shown = "".join(o.get("text", "") + "".join(o.get("data", {}).get("text/plain", ""))
                    for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert not re.search(r"^\s*def \w+\(", shown, re.M), shown
    solution = nbformat.read(EXERCISES / "solutions" / path.name, as_version=4)
    hidden = [line.strip() for c in solution.cells if c.cell_type == "code"
              for block in c.source.split("### BEGIN SOLUTION")[1:]
              for line in block.split("### END SOLUTION")[0].splitlines() if len(line.strip()) > 12]
    assert not [line for line in hidden if line in shown], path.name
