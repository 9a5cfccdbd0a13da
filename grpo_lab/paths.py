"""Where the repository and its data live: the one place that knows.

Two layouts, one set of names:

* a checkout of the repository (``pip install -e .``, or the plain tree on ``sys.path``):
  ``REPO_ROOT`` is the folder above the package, ``DATA_DIR`` its ``data/``;
* an installed wheel: ``data/`` and ``notebooks/`` travel inside the package as
  ``grpo_lab/data/`` and ``grpo_lab/_notebooks/`` (pyproject.toml maps the two top-level folders
  there), found through ``importlib.resources``; ``IN_CHECKOUT`` is then False and
  ``REPO_ROOT`` (the folder above the package, site-packages) holds no data.

``resolve_path`` lets notebooks (run from notebooks/), the CLI (run from the root) and an
installed package run from any folder share config values such as
``data/base_policy.safetensors``: a path that names shipped data finds the package's copy.
"""
from __future__ import annotations

import hashlib
import importlib.resources
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
# a checkout has pyproject.toml beside data/; site-packages has neither
IN_CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "data").is_dir()


def shipped(name: str) -> Path:
    """The folder ``name`` (data, _notebooks) inside the installed package, as a real path
    (safetensors and jupyter need files on disk, so an install without it is named)."""
    found = importlib.resources.files("grpo_lab") / name
    if not isinstance(found, Path) or not found.is_dir():
        raise FileNotFoundError(f"no {name}/ folder in the installed package at {found}: this "
                                f"grpo_lab is neither a repository checkout nor a complete, "
                                f"unzipped install (reinstall it from its wheel or repository: docs/setup.md)")
    return found


DATA_DIR = REPO_ROOT / "data" if IN_CHECKOUT else shipped("data")
BASE_POLICY = DATA_DIR / "base_policy.safetensors"


def resolve_path(path: str | Path) -> Path:
    """``path`` as given if it exists; else, for ``data/...``, the shipped data's copy; else
    (in a checkout) relative to the repository root; else ``path`` unchanged (the caller's
    "not found" then names what was asked for)."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    if path.parts[:1] == ("data",) and DATA_DIR.joinpath(*path.parts[1:]).exists():
        return DATA_DIR.joinpath(*path.parts[1:])
    if IN_CHECKOUT and (REPO_ROOT / path).exists():
        return REPO_ROOT / path
    return path


def notebooks_dir() -> Path:
    """The lessons: the checkout's notebooks/, else the copy inside the installed package."""
    return REPO_ROOT / "notebooks" if IN_CHECKOUT else shipped("_notebooks")


def checkout_dir(name: str) -> Path:
    """``name`` (e.g. bench) beside the package, in a repository checkout; a clear error in an
    installed package, which does not ship it."""
    path = REPO_ROOT / name
    if not IN_CHECKOUT or not path.is_dir():
        where = path if IN_CHECKOUT else f"{PACKAGE_DIR} (an installed package)"
        raise FileNotFoundError(f"no {name}/ directory at {where}: 'grpo-lab {name}' needs a "
                                f"checkout of the grpo_lab repository (git clone, then "
                                f"pip install -e .)")
    return path


def file_sha256(path: str | Path) -> str:
    """sha256 hex of a file's bytes, read 1 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
