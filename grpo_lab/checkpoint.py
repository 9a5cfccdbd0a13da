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


# ---- training checkpoints: policy + optimizer state + grouper state + metrics so far ----

CKPT_TAG = "grpo_lab.train_checkpoint.v1"


def save_training_checkpoint(path, policy, optim_state: dict, cfg: dict, step: int,
                             history: list[dict], grouper_state: dict | None = None) -> None:
    """One safetensors file, written atomically: ``policy.*`` (the tied lm_head left out),
    ``optim.<param index>.<name>`` (torch.optim.AdamW's state_dict form, whole on any number
    of ranks), ``grouping.*``; the config, step, param groups and metrics as metadata."""
    tensors = {f"policy.{k}": v for k, v in policy.state_dict().items() if k != "lm_head.weight"}
    tensors.update({f"grouping.{k}": v for k, v in (grouper_state or {}).items()})
    for pid, st in optim_state["state"].items():
        for k, v in st.items():
            tensors[f"optim.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    meta = {"format": CKPT_TAG, "step": str(step), "config": json.dumps(cfg),
            "model_config": json.dumps(vars(policy.cfg)),
            "param_groups": json.dumps(optim_state["param_groups"]), "history": json.dumps(history)}
    atomic_save_tensors(tensors, path, meta)


def read_training_checkpoint(path) -> dict:
    """-> {"step", "config", "history", "model_config", "policy" (tensors), "optim"
    (AdamW state_dict form), "grouping" (tensors)}; a clear error for anything else."""
    tensors, meta = read_tensors(path)
    if meta.get("format") != CKPT_TAG:
        raise CheckpointError(f"{path} is not a grpo_lab training checkpoint "
                              f"(format tag {meta.get('format')!r}, expected {CKPT_TAG!r})")
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("optim."):
            _, pid, name = k.split(".", 2)
            state.setdefault(int(pid), {})[name] = v
    return {"step": int(meta["step"]), "config": json.loads(meta["config"]),
            "history": json.loads(meta["history"]),
            "model_config": json.loads(meta["model_config"]),
            "policy": policy_tensors(tensors),
            "optim": {"state": state, "param_groups": json.loads(meta["param_groups"])},
            "grouping": {k[len("grouping."):]: v for k, v in tensors.items()
                         if k.startswith("grouping.")}}


def policy_tensors(tensors: dict) -> dict:
    """The policy's weights inside a training checkpoint (keys saved as ``policy.<name>``)."""
    return {k[len("policy."):]: v for k, v in tensors.items() if k.startswith("policy.")}


def load_policy_any(path):
    """A policy (model.GPT) from a policy file (``model.save_policy``) or a training checkpoint."""
    from grpo_lab.model import GPT, GPTConfig, policy_from_tensors

    tensors, meta = read_tensors(path)
    if meta.get("format") != CKPT_TAG:
        return policy_from_tensors(tensors, meta, path)
    policy = GPT(GPTConfig(**json.loads(meta["model_config"])))
    policy.load_state_dict(policy_tensors(tensors), strict=False)
    return policy
