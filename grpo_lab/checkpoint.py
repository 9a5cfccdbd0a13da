"""Checkpoint files: safetensors (no pickle), finite, checksummed, written atomically.

A file is written to a temporary name beside its target, flushed to disk and renamed
over the target with ``os.replace``, which is atomic on POSIX: a run killed mid-write
leaves the previous checkpoint intact, never a half-written one (its ``.tmp`` file is deleted
at the next start, rundir.py). A failed write (disk full) says so and names the file. Files
get the mode the user's umask gives (mkstemp alone makes them 0600).

Nothing non-finite is written: ``atomic_save_tensors`` checks every floating tensor
before it creates the temporary file, so on a NaN or inf it raises ``FloatingPointError``
naming the tensor and the previous file stays byte for byte as it was.

Every file carries a content checksum in its safetensors metadata (key ``CHECKSUM_KEY``):
sha256 over, in sorted key order, each tensor's name, dtype, shape and raw bytes, then
every other metadata entry (so the run's config and history are covered too). ``read_tensors``
recomputes it and raises ``CheckpointError`` naming the file on a mismatch; a flip of any
bit either breaks the safetensors header (also a ``CheckpointError``) or changes what is
hashed. A grpo_lab file (format tag ``grpo_lab.*``) without a checksum (written before
checksums existed, or its checksum key damaged) is refused unless the caller passes
``allow_unsigned=True``; ``add_checksum(path)`` re-saves such a file, tensors bit-identical,
with one. A foreign file (no grpo_lab tag) is read unverified: callers refuse it by its tag.
The shipped ``data/base_*.safetensors`` carry checksums.

``load_state_strict`` loads tensors into a module and names every missing or unexpected
key and every shape mismatch (``load_state_dict(strict=True)`` raises a raw RuntimeError;
``strict=False`` silently keeps the random or base weights).

A sharded training checkpoint (``ckpt_format="dcp"``, distributed/dcp.py) keeps the weights
and AdamW moments in a torch.distributed.checkpoint folder beside the file, each rank's shards
in its own files, under the same names as here (``policy.<name>``, ``optim.<index>.<name>``);
the file holds the rest (step, config, history, grouping, param groups) and, in its checksummed
metadata (``SHARDS_KEY``), the folder's name and the sha256 of each of its files. Replacing the
file is the one atomic step that commits a sharded checkpoint: a folder the file does not name
is an unfinished write. ``read_training_checkpoint`` verifies every listed file (a truncated or
altered one is a ``CheckpointError`` naming it) and reads the tensors whole, on one process.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from grpo_lab.paths import file_sha256, resolve_path
from grpo_lab.rundir import current_umask


CHECKSUM_KEY = "grpo_lab.sha256"
OUR_TAG_PREFIX = "grpo_lab."      # every file we write has a "format" tag starting so


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt, or not one of ours."""


def content_checksum(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> str:
    """sha256 hex of the tensors (name, dtype, shape, bytes; sorted by name) and metadata."""
    h = hashlib.sha256(b"grpo_lab checkpoint v1\n")
    for key in sorted(tensors):
        t = tensors[key].detach().cpu().contiguous()
        h.update(json.dumps([key, str(t.dtype), list(t.shape), t.numel() * t.element_size()])
                 .encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())                 # raw bytes
    for key in sorted(k for k in metadata if k != CHECKSUM_KEY):
        h.update(json.dumps([key, metadata[key]]).encode())
    return h.hexdigest()


def check_finite(tensors: dict[str, torch.Tensor], what: str) -> None:
    """Raise FloatingPointError naming the first tensor holding a NaN or inf."""
    for key in sorted(tensors):
        t = tensors[key]
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            flat = t.detach().reshape(-1)
            bad = (~torch.isfinite(flat)).nonzero().flatten()
            raise FloatingPointError(f"{what}: tensor {key!r} holds {len(bad)} non-finite values "
                                     f"(first: {float(flat[bad[0]])} at flat index {int(bad[0])})")


def atomic_save_tensors(tensors: dict[str, torch.Tensor], path: str | Path,
                        metadata: dict[str, str]) -> None:
    """Write ``tensors`` and ``metadata`` (+ the checksum) to ``path`` atomically.

    Raises FloatingPointError, before touching the disk, if any tensor is not finite.
    """
    path = Path(path)
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    check_finite(tensors, f"refusing to write {path} (the previous file is left as it was)")
    if CHECKSUM_KEY in metadata:
        raise ValueError(f"metadata key {CHECKSUM_KEY!r} is reserved for the checksum")
    metadata = {**metadata, CHECKSUM_KEY: content_checksum(tensors, metadata)}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())           # mkstemp makes 0600: the user's umask
        os.replace(tmp, path)
    except (OSError, SafetensorError) as e:                # disk full, quota, read-only, ...
        why = getattr(e, "strerror", None) or str(e).strip().splitlines()[0]
        msg = f"writing {path} failed ({why}); the previous file is left as it was"
        code = getattr(e, "errno", None)
        raise (OSError(code, msg) if code else OSError(msg)) from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_tensors(path: str | Path, allow_unsigned: bool = False, shards: bool = True
                 ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """-> (tensors, metadata without the checksum), verified: readable, checksum matches,
    every floating tensor finite. Any failure is a ``CheckpointError`` naming the file. A
    sharded checkpoint's tensors include its folder's, verified and read whole (``shards``
    False: the file's own only)."""
    path = resolve_path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
        tensors = load_file(str(path))
    except (SafetensorError, OSError, json.JSONDecodeError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file "
                              f"(truncated or foreign?): {e}") from e
    saved = meta.pop(CHECKSUM_KEY, None)
    ours = str(meta.get("format", "")).startswith(OUR_TAG_PREFIX)
    if saved is None and ours and not allow_unsigned:
        raise CheckpointError(f"{path} has no content checksum (written before checksums "
                              f"existed, or its header is damaged); if you trust the file, "
                              f"grpo_lab.checkpoint.add_checksum({str(path)!r}) re-saves it "
                              f"with one")
    if saved is not None:
        actual = content_checksum(tensors, meta)
        if actual != saved:
            raise CheckpointError(f"{path} is corrupt: content checksum {actual[:16]}... does "
                                  f"not match the saved {saved[:16]}...")
    if shards and SHARDS_KEY in meta:
        folder = verify_shards(path, meta_field(meta, SHARDS_KEY, path))
        tensors = {**tensors, **read_shards_whole(folder)}
    try:
        check_finite(tensors, f"{path}")
    except FloatingPointError as e:
        raise CheckpointError(str(e)) from None
    return tensors, meta


def add_checksum(path: str | Path) -> None:
    """Re-save a file written before checksums existed with one (tensors bit-identical; a
    sharded checkpoint's folder stays as it is)."""
    tensors, meta = read_tensors(path, allow_unsigned=True, shards=False)
    atomic_save_tensors(tensors, resolve_path(path), meta)


def load_state_strict(module: torch.nn.Module, tensors: dict[str, torch.Tensor], path,
                      prefix: str = "") -> None:
    """Load the ``prefix``-named entries of ``tensors`` into ``module``, strictly.

    Every state entry of ``module`` must be given, except aliases of a tied parameter
    already given (the policy's ``lm_head.weight`` is ``wte.weight``); no entry may be
    unknown; shapes must agree. Otherwise a ``CheckpointError`` naming ``path`` and the
    keys, and ``module`` is left untouched.
    """
    given = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    expected = module.state_dict(keep_vars=True)

    def storage(k):  # tied parameters (lm_head.weight is wte.weight) share one storage
        v = expected[k]
        return (v.data_ptr(), tuple(v.shape), v.stride()) if v.numel() else k

    loaded = {storage(k) for k in given if k in expected}
    missing = [k for k in expected if k not in given and storage(k) not in loaded]
    unexpected = sorted(k for k in given if k not in expected)
    shapes = [f"{k}: file {tuple(given[k].shape)} vs module {tuple(expected[k].shape)}"
              for k in expected if k in given and given[k].shape != expected[k].shape]
    if missing or unexpected or shapes:
        parts = [f"{len(missing)} missing {[prefix + k for k in missing[:5]]}" if missing else "",
                 f"{len(unexpected)} unexpected {[prefix + k for k in unexpected[:5]]}"
                 if unexpected else "",
                 f"{len(shapes)} of another shape {shapes[:5]}" if shapes else ""]
        raise CheckpointError(f"{path} does not fit the {type(module).__name__}: "
                              + "; ".join(p for p in parts if p))
    module.load_state_dict(given, strict=False)


def check_optimizer_state(optim: dict, params: list, path) -> None:
    """``optim`` (AdamW's state_dict form, as ``read_training_checkpoint`` gives it) against the
    run's trainable parameters in the optimizer's order: every state index names one of them
    and every moment has its parameter's shape; otherwise a ``CheckpointError`` naming ``path``.
    torch's ``load_state_dict`` checks neither: a moment of another shape was a RuntimeError
    inside the first step after the resume (the sharder's reshape took it silently), the state
    of an index past the last was dropped without a word."""
    for pid, st in sorted(optim["state"].items()):
        if pid >= len(params):
            raise CheckpointError(f"{path} holds optimizer state of parameter {pid}; this run "
                                  f"trains {len(params)} parameters (0 to {len(params) - 1})")
        for name, v in st.items():
            if v.dim() and tuple(v.shape) != tuple(params[pid].shape):     # step: a scalar
                raise CheckpointError(f"{path}: tensor 'optim.{pid}.{name}' has shape "
                                      f"{tuple(v.shape)}, its parameter "
                                      f"{tuple(params[pid].shape)}")


# ---- training checkpoints: policy + optimizer state + grouper state + metrics so far ----

CKPT_TAG = "grpo_lab.train_checkpoint.v1"


def save_training_checkpoint(path, policy, optim_state: dict, cfg: dict, step: int,
                             history: list[dict], grouper_state: dict | None = None,
                             weights: dict | None = None, shards: dict | None = None) -> None:
    """One safetensors file, written atomically: ``policy.*`` (tied aliases such as the toy's
    lm_head left out),
    ``optim.<param index>.<name>`` (torch.optim.AdamW's state_dict form, whole on any number
    of ranks), ``grouping.*``; the config, step, param groups and metrics as metadata.
    ``weights``: the policy's state already gathered whole, tied aliases left out (a sharded
    policy's, exchanges.Exchange.model_state); None: ``policy``'s own. ``shards``: {"dir":
    the folder's name beside ``path``, "files": {file name: sha256}} of a sharded checkpoint
    whose folder holds the weights and moments (``weights`` and the state's tensors empty)."""
    weights = state_without_aliases(policy) if weights is None else weights
    tensors = {f"policy.{k}": v.cpu() for k, v in weights.items()}
    tensors.update({f"grouping.{k}": v for k, v in (grouper_state or {}).items()})
    tensors.update({f"optim.{pid}.{k}": v.cpu() if torch.is_tensor(v) else torch.tensor(v)
                    for pid, st in optim_state["state"].items() for k, v in st.items()})
    meta = {"format": CKPT_TAG, "step": str(step), "config": json.dumps(cfg),
            "model_config": json.dumps(vars(policy.cfg)),
            "param_groups": json.dumps(optim_state["param_groups"]), "history": json.dumps(history)}
    if shards is not None:
        meta[SHARDS_KEY] = json.dumps(shards)
    atomic_save_tensors(tensors, path, meta)


def meta_field(meta: dict, key: str, path, kind: type = dict, parse=json.loads):
    """``parse(meta[key])``, which must be a ``kind``; a CheckpointError naming the file and
    the field when it is absent, does not parse or is of another kind (a forged or
    hand-edited header, signed again)."""
    if key not in meta:
        raise CheckpointError(f"{path}: metadata {key!r} is missing")
    try:
        value = parse(meta[key])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: metadata {key!r} is not valid: {type(e).__name__}: "
                              f"{e}") from None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CheckpointError(f"{path}: metadata {key!r} is a {type(value).__name__}, not a "
                              f"{kind.__name__}")
    return value


def read_training_checkpoint(path, whole: bool = True) -> dict:
    """-> {"step", "config", "history", "model_config", "policy" (tensors), "optim"
    (AdamW state_dict form), "grouping" (tensors), "shards" (the verified folder of a sharded
    checkpoint, else None)}; a clear error for anything else. ``whole=False``: a sharded
    checkpoint's weights and moments are not read (distributed/dcp.py loads each rank's
    share): "policy" and the "optim" state are empty."""
    tensors, meta = read_tensors(path, shards=whole)
    if meta.get("format") != CKPT_TAG:
        raise CheckpointError(f"{path} is not a grpo_lab training checkpoint "
                              f"(format tag {meta.get('format')!r}, expected {CKPT_TAG!r})")
    folder = None
    if SHARDS_KEY in meta:                    # read_tensors verified it when it read it whole
        shards = meta_field(meta, SHARDS_KEY, path)
        folder = (verify_shards(resolve_path(path), shards) if not whole
                  else resolve_path(path).parent / shards["dir"])
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("optim."):
            pid, _, name = k[len("optim."):].partition(".")
            if not (pid.isdigit() and name):         # a forged or hand-edited header, signed again
                raise CheckpointError(f"{path}: tensor {k!r} is not named "
                                      f"optim.<parameter index>.<state name>")
            state.setdefault(int(pid), {})[name] = v
    names = {pid: sorted(st) for pid, st in state.items()}
    full = max(names.values(), key=len, default=[])  # AdamW keeps step, exp_avg, exp_avg_sq
    for pid, have in names.items():                  # for each parameter: one missing was a
        if have != full:                             # bare KeyError inside the next step
            raise CheckpointError(f"{path}: the optimizer state of parameter {pid} holds "
                                  f"{have}, the others {full}")
    step = meta_field(meta, "step", path, int, int)
    if step < 0:                                     # the first checkpoint is step 0's
        raise CheckpointError(f"{path}: metadata 'step' is {step}, not a step (0 or more)")
    return {"step": step,
            "config": meta_field(meta, "config", path),
            "history": meta_field(meta, "history", path, list),
            "model_config": meta_field(meta, "model_config", path),
            "policy": policy_tensors(tensors),
            "optim": {"state": state,
                      "param_groups": meta_field(meta, "param_groups", path, list)},
            "grouping": {k[len("grouping."):]: v for k, v in tensors.items()
                         if k.startswith("grouping.")},
            "shards": folder}


# ---- sharded checkpoints: the folder torch.distributed.checkpoint writes, named by the file ----

SHARDS_KEY = "grpo_lab.shards"


def folder_manifest(folder: Path) -> dict[str, str]:
    """{file name: sha256} of every file in ``folder`` (DCP's ``.metadata`` and shards)."""
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}


def verify_shards(path: Path, shards: dict) -> Path:
    """The folder a sharded checkpoint ``path`` names, every listed file present with its
    sha256 -> the folder; otherwise a ``CheckpointError`` naming the file."""
    if not (isinstance(shards.get("dir"), str) and isinstance(shards.get("files"), dict)):
        raise CheckpointError(f"{path}: metadata {SHARDS_KEY!r} is not "
                              f"{{\"dir\": folder, \"files\": {{name: sha256}}}}: {shards}")
    folder = path.parent / shards["dir"]
    for name, saved in shards["files"].items():
        f = folder / name
        if not f.is_file():
            raise CheckpointError(f"{f} is missing: {path} names it as one of its "
                                  f"{len(shards['files'])} shard files")
        actual = file_sha256(f)
        if actual != saved:
            raise CheckpointError(f"{f} is corrupt: sha256 {actual[:16]}... does not match the "
                                  f"{saved[:16]}... {path} saved for it")
    return folder


def read_shards_whole(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a torch.distributed.checkpoint folder, whole, on the CPU, read by this
    one process (no process group: DCP's ``no_dist``), whatever number of ranks wrote it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(folder))
    found = reader.read_metadata().state_dict_metadata
    tensors = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in found.items()
               if isinstance(m, TensorStorageMetadata)}
    with warnings.catch_warnings():           # "assuming the intent is to load in a single
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # process"
        dcp.load(tensors, storage_reader=reader, no_dist=True)
    return tensors


def policy_tensors(tensors: dict) -> dict:
    """The policy's weights inside a training checkpoint (keys saved as ``policy.<name>``)."""
    return {k[len("policy."):]: v for k, v in tensors.items() if k.startswith("policy.")}


def state_without_aliases(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` with each tied tensor kept once, under its first name
    (the toy GPT's ``lm_head.weight`` is ``wte.weight``; many HF models tie theirs too):
    safetensors refuses tensors that share memory, ``load_state_strict`` accepts the
    aliases' absence."""
    seen, out = set(), {}
    for k, v in module.state_dict().items():
        key = (v.data_ptr(), tuple(v.shape), v.stride()) if v.numel() else k
        if key not in seen:
            seen.add(key)
            out[k] = v
    return out
