"""Where the repository and its data live: the one place that knows.

``REPO_ROOT`` is the folder above the package (a checkout, or the site-packages folder of an
install); ``DATA_DIR`` its ``data/`` (held-out sets, base policies, the task mixture).
``resolve_path`` lets notebooks (run from notebooks/) and the CLI (run from the root) share
config values such as ``data/base_policy.safetensors``.
"""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
BASE_POLICY = DATA_DIR / "base_policy.safetensors"


def resolve_path(path: str | Path) -> Path:
    """``path`` as given if it exists, else relative to the repository root, so that
    notebooks (run from notebooks/) and the CLI (run from the root) share config values."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    return REPO_ROOT / path if (REPO_ROOT / path).exists() else path


def checkout_dir(name: str) -> Path:
    """``name`` (bench or notebooks) beside the installed package, in a repository checkout."""
    path = REPO_ROOT / name
    if not path.is_dir():
        raise FileNotFoundError(f"no {name}/ directory at {path}: 'grpo-lab {name}' needs a "
                                f"checkout of the grpo_lab repository (pip install -e .)")
    return path
