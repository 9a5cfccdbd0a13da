"""The learners' notebooks here are stubs: every check in them fails on purpose, so nbval
must not run them as ordinary notebooks (`make test` collects notebooks/ with --nbval-lax).
tests/test_exercise_notebooks.py runs them and asserts each check fails with its hint; the
solutions in solutions/ stay collected and must pass."""
from pathlib import Path

collect_ignore = [p.name for p in Path(__file__).parent.glob("*.ipynb")] + ["make_exercises.py"]
