"""Checkpoint files: safetensors (no pickle), written atomically.

A file is written to a temporary name beside its target, flushed to disk and renamed
over the target with ``os.replace``, which is atomic on POSIX: a run killed mid-write
leaves the previous checkpoint intact, never a half-written one.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file


REPO_ROOT = Path(__file__).resolve().parent.parent


def resolve_path(path: str | Path) -> Path:
    """``path`` as given if it exists, else relative to the repository root, so that
    notebooks (run from notebooks/) and the CLI (run from the root) share config values."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    return REPO_ROOT / path if (REPO_ROOT / path).exists() else path


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, or not one of ours."""


def atomic_save_tensors(tensors: dict[str, torch.Tensor], path: str | Path,
                        metadata: dict[str, str]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file({k: v.detach().contiguous() for k, v in tensors.items()}, tmp, metadata)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_tensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    path = resolve_path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
        tensors = load_file(str(path))
    except (SafetensorError, OSError, json.JSONDecodeError, RuntimeError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file "
                              f"(truncated or foreign?): {e}") from e
    return tensors, meta
