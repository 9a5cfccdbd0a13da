import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("GRPO_LAB_QUICK", "1")


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    """Tests run from the repository root, as the README's commands do."""
    monkeypatch.chdir(ROOT)


@pytest.fixture
def forget_plugin():
    """Take away afterwards what the plugin files the test loaded registered (their records,
    their settings blocks): a block left registered would be in every later config, and a
    worker process that never loaded the plugin could not read it."""
    from grpo_lab import registry
    before = set(registry._BY_PATH)
    yield
    for path in set(registry._BY_PATH) - before:
        name = registry._BY_PATH.pop(path)[0].__name__
        registry._forget(name)
        sys.modules.pop(name, None)        # else a later load reuses it without running it


def _browser_runs_notebooks(items) -> bool:
    """True when this session's browser test will run every notebooks/*.ipynb in JupyterLab
    (it is selected, and chromium and playwright are here so it will not skip)."""
    import importlib.util
    import shutil

    wanted = any(i.nodeid.endswith("test_every_notebook_runs_clean_in_jupyterlab") for i in items)
    return (wanted and shutil.which("chromium") is not None
            and importlib.util.find_spec("playwright") is not None)


def pytest_collection_modifyitems(config, items):
    """Each notebook runs once: where the browser test runs the lessons (notebooks/*.ipynb)
    from JupyterLab's Run All and fails on any error output (every assert a notebook makes),
    nbval's run of the same notebooks is deselected; the exercises (notebooks/exercises/)
    stay under nbval. Without a browser nbval runs them all. GRPO_LAB_NBVAL_ALL=1 keeps both."""
    if os.environ.get("GRPO_LAB_NBVAL_ALL") == "1" or not _browser_runs_notebooks(items):
        return
    lessons = ROOT / "notebooks"
    twice = [i for i in items if i.path.suffix == ".ipynb" and i.path.parent == lessons]
    if twice:
        config.hook.pytest_deselected(items=twice)
        items[:] = [i for i in items if i not in twice]
