"""Sharded training checkpoints with torch.distributed.checkpoint (DCP): each rank writes the
shards it holds, and a run saved on N ranks resumes on M (``ckpt_format="dcp"``).

The single-file checkpoint (checkpoint.py) gathers every weight and AdamW moment whole on
rank 0 (12 P bytes for P fp32 parameters: 4 P weights, 8 P moments) and writes one file; under
FSDP2, past what one rank holds, that gather is what breaks first. Here every rank
writes its own shards, and none ever holds more than its share:

    out_dir/checkpoint.safetensors        step, config, history, grouping, AdamW param groups,
                                          and {"dir", "files": {name: sha256}} of the folder
    out_dir/checkpoint.dcp/step-000001-x/ .metadata (which rank holds which slice of what)
                                          __<rank>_0.distcp (that rank's bytes of
                                          policy.<name> and optim.<index>.<name>)

The tensors are torch's own state dicts (``get_state_dict``: DTensors under FSDP2, plain
tensors on one process), under the single file's names; loading plans the reads from the
target's layout (``set_state_dict`` after DCP's ``load`` filled this run's tensors in place),
so the ranks that read need not be the ranks that wrote. A fresh optimizer has no state to
fill: ``get_state_dict`` first creates it (one zero-gradient AdamW step at lr 0), then every
moment and step count is overwritten from the folder.

Atomic in one rename, as the single file is: the shards go to a folder no checkpoint names
(``step-<step>-<random>``: a re-save of the same step never writes into the folder that is
committed), rank 0 hashes its files once every rank has written, then replaces the
checkpoint file (checkpoint.atomic_save_tensors) with one naming that folder and those
hashes, and only then deletes the other folders. A kill before that rename leaves the last
checkpoint and its folder whole; ``remove_unnamed`` deletes the unfinished folder at the
next start. A resume checks every file's sha256 first (checkpoint.verify_shards).

Deviation from DCP's own layout: the checksums and the commit are grpo_lab's (DCP writes
``.metadata`` last but checks nothing on read), and only tensors are stored in the folder
(the param groups go to the file's metadata, in torch.optim's index form).
"""
from __future__ import annotations

import contextlib
import secrets
import shutil
import warnings
from pathlib import Path

import torch

from grpo_lab.checkpoint import folder_manifest, save_training_checkpoint
from grpo_lab.rundir import SHARDS_DIR as FOLDER


def shard_folder(ckpt: Path) -> Path:
    """The folder beside the checkpoint file that holds its shard folders."""
    return ckpt.parent / FOLDER


@contextlib.contextmanager
def one_process_quiet():
    """DCP warns on every save and load without a process group that it assumes one process:
    here that is the intent (a run on one process), so the warning is noise."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _storage(t) -> tuple:
    """What two state-dict entries share when they are one tied tensor (DTensor: its shard)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return (local.data_ptr(), tuple(t.shape), local.stride()) if local.numel() else (id(t),)


def flat_state(model_sd: dict, optim_sd: dict) -> dict:
    """``get_state_dict``'s (model, optimizer) -> {"policy.<name>": t, "optim.<index>.<name>":
    t}: the single file's names, each tied tensor once (under its first name), the optimizer
    state keyed by the parameter's index in torch.optim's order (its groups' params in turn).
    The values are the state dicts' own tensors (loading into them fills the state dicts)."""
    flat, seen = {}, set()
    for k, v in model_sd.items():
        if _storage(v) not in seen:
            seen.add(_storage(v))
            flat[f"policy.{k}"] = v
    names = [n for g in optim_sd["param_groups"] for n in g["params"]]
    for index, name in enumerate(names):
        for k, v in optim_sd["state"].get(name, {}).items():
            flat[f"optim.{index}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return flat


def save_sharded(path: Path, policy, optimizer, cfg: dict, step: int, history: list[dict],
                 grouper_state: dict, group) -> None:
    """Every rank: its shards of the policy and ``optimizer`` into a new folder; rank 0 then
    commits it by replacing the checkpoint file ``path`` (module docstring)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    name = group.gather(f"step-{step:06d}-{secrets.token_hex(4)}")[0]     # rank 0's name
    folder = shard_folder(path) / name
    model_sd, optim_sd = get_state_dict(policy, optimizer)
    with one_process_quiet():               # returns once every rank's files are written
        dcp.save(flat_state(model_sd, optim_sd), no_dist=group.world == 1,
                 storage_writer=dcp.FileSystemWriter(str(folder)))
    if group.rank == 0:
        shards = {"dir": f"{FOLDER}/{name}", "files": folder_manifest(folder)}
        groups = optimizer.state_dict()["param_groups"]               # index form, no tensors
        save_training_checkpoint(path, policy, {"state": {}, "param_groups": groups}, cfg, step,
                                 history, grouper_state, weights={}, shards=shards)
        remove_unnamed(path, keep=folder)
    group.barrier()


def load_sharded(folder: Path, policy, optimizer, param_groups: list[dict], group) -> None:
    """Every rank: fill this run's policy and ``optimizer`` (any layout: sharded by FSDP2 on
    any number of ranks, or whole) from a DCP folder, and the saved param groups' settings."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(policy, optimizer)       # the targets, state created
    flat = flat_state(model_sd, optim_sd)
    with one_process_quiet():
        dcp.load(flat, storage_reader=dcp.FileSystemReader(str(folder)),
                 no_dist=group.world == 1)
    names = [n for g in optim_sd["param_groups"] for n in g["params"]]
    for index, name in enumerate(names):                  # the 0-dim step counts, as loaded
        for k in optim_sd["state"].get(name, {}):
            optim_sd["state"][name][k] = flat[f"optim.{index}.{k}"]
    if len(param_groups) != len(optim_sd["param_groups"]):
        raise ValueError(f"{folder} was saved with {len(param_groups)} parameter groups, this "
                         f"run has {len(optim_sd['param_groups'])}")
    for saved, now in zip(param_groups, optim_sd["param_groups"]):
        now.update({k: v for k, v in saved.items() if k != "params"})
    set_state_dict(policy, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


def remove_unnamed(path: Path, keep: Path | None) -> list[str]:
    """Delete every folder under checkpoint.dcp/ but ``keep`` (the one the checkpoint file
    names; None: it names none) -> their names: older checkpoints, a write killed before its
    commit. Rank 0 only, while no rank reads them."""
    gone = []
    root = shard_folder(path)
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if d.is_dir() and (keep is None or d.resolve() != keep.resolve()):
            shutil.rmtree(d)
            gone.append(d.name)
    if keep is None and root.is_dir():
        shutil.rmtree(root)
    return gone
