import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("GRPO_LAB_QUICK", "1")


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    """Tests run from the repository root, as the README's commands do."""
    monkeypatch.chdir(ROOT)
