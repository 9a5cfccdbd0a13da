"""`make env` installs torch's CPU build on Linux unless told otherwise (tools/torch_index.py):
a plain install that resolves to a CPU build is kept, one that would pull CUDA is swapped for
the CPU index, ``TORCH_INDEX=`` opts in to the plain (CUDA) build; preflight names a CUDA build
on a machine without a GPU."""
import platform
import subprocess
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
torch_index = load_script("tools/torch_index.py")
CPU = "https://download.pytorch.org/whl/cpu"

# the metadata pip's report gives for torch 2.13.0, cp311, manylinux x86_64 (trimmed)
PYPI_LINUX = {"name": "torch", "version": "2.13.0", "requires_dist": [
    "filelock", "sympy>=1.13.3", 'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"',
    'triton==3.7.1; platform_system == "Linux" and python_version < "3.15"']}
CPU_WHEEL = {"name": "torch", "version": "2.13.0+cpu", "requires_dist": [
    "filelock", "typing-extensions>=4.10.0", 'optree>=0.13.0; extra == "optree"']}


def report(*metadata):
    return {"version": "1", "install": [{"metadata": m} for m in metadata]}


@pytest.mark.parametrize("metadata, cuda", [
    (PYPI_LINUX, True), (CPU_WHEEL, False),
    ({"name": "torch", "version": "2.13.0+cu130", "requires_dist": []}, True),
    ({"name": "torch", "version": "2.13.0", "requires_dist": ["filelock", "sympy"]}, False),  # mac
    ({"name": "torch", "version": "2.13.0", "requires_dist": None}, False)])
def test_a_cuda_build_is_one_that_needs_nvidia_wheels_or_says_cu(metadata, cuda):
    assert torch_index.is_cuda_build(metadata) is cuda


def test_the_cpu_index_only_when_the_plain_install_would_be_cuda():
    assert torch_index.choose("torch==2.13.0", CPU, lambda r: report(CPU_WHEEL)) == (
        [], "torch==2.13.0 resolves to torch 2.13.0+cpu, a CPU build: installing it")
    args, why = torch_index.choose("torch==2.13.0", CPU + "/", lambda r: report(PYPI_LINUX))
    assert args == ["--index-url", CPU]
    assert "torch 2.13.0, a CUDA build" in why and "TORCH_INDEX= installs the CUDA build" in why
    other = {"name": "numpy", "version": "2.0"}
    assert torch_index.choose("torch", CPU, lambda r: report(other))[0] == ["--index-url", CPU]


def test_a_failed_dry_run_picks_the_cpu_index_and_says_why():
    def fails(requirement):
        raise subprocess.CalledProcessError(1, "pip", stderr="ERROR: No matching distribution "
                                                             "found for torch==99.0\n")
    args, why = torch_index.choose("torch==99.0", CPU, fails)
    assert args == ["--index-url", CPU]
    assert why == ("the dry run of 'torch==99.0' failed (ERROR: No matching distribution found "
                   "for torch==99.0): the CPU index")


def test_an_empty_or_other_index_is_used_as_given_without_a_dry_run():
    def never(requirement):
        raise AssertionError("no dry run expected")
    assert torch_index.choose("torch==2.13.0", "", never)[0] == []
    cu = "https://download.pytorch.org/whl/cu130"
    assert torch_index.choose("torch==2.13.0", cu, never)[0] == ["--index-url", cu]


def test_the_script_prints_the_arguments_and_checks_its_usage(capsys):
    assert torch_index.main(["torch==2.13.0", "https://example.invalid/simple"]) == 0
    out = capsys.readouterr()
    assert out.out == "--index-url https://example.invalid/simple\n"
    assert out.err == "torch: TORCH_INDEX=https://example.invalid/simple\n"
    assert torch_index.main([]) == 2 and "usage" in capsys.readouterr().err


def test_a_real_dry_run_gives_the_fields_the_choice_reads():
    """pip's report here (this machine's indexes): torch's metadata carries the version and
    requires_dist that is_cuda_build reads."""
    meta = torch_index.torch_in(torch_index.dry_run("torch==2.13.0"))
    assert meta["name"] == "torch" and meta["version"].startswith("2.13.0")
    assert isinstance(meta["requires_dist"], list) and any(
        r.startswith("filelock") for r in meta["requires_dist"])


def make_env_recipe(*assignments):
    out = subprocess.run(["make", "-n", "-B", "env", "VENV=/nonexistent-venv", *assignments],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if "tools/torch_index.py" in line)


@pytest.mark.skipif(not __import__("shutil").which("make"), reason="make is not installed")
def test_make_env_defaults_to_the_cpu_index_on_linux_only():
    default = make_env_recipe()
    if platform.system() == "Linux":
        assert f'tools/torch_index.py "torch==2.13.0" "{CPU}"' in default
    else:
        assert 'tools/torch_index.py "torch==2.13.0" ""' in default
    assert 'tools/torch_index.py "torch==2.13.0" ""' in make_env_recipe("TORCH_INDEX=")
    assert f"CPU_INDEX := {torch_index.CPU_INDEX}\n" in (ROOT / "Makefile").read_text()


def test_the_size_of_a_cuda_build_is_what_its_packages_installed():
    from types import SimpleNamespace as NS

    from grpo_lab.teaching.workshop import cuda_install_gb

    def dist(name, *sizes):
        return NS(metadata={"Name": name}, files=[NS(size=s) for s in sizes])
    dists = [dist("torch", 2**30, 2**29), dist("nvidia-cudnn-cu13", 2**31, None),
             dist("triton", 2**28), dist("numpy", 2**30), dist("nvidia_nccl_cu13", 2**30),
             NS(metadata={"Name": "nvidia-nvtx"}, files=None)]                # no RECORD: 0
    assert cuda_install_gb(dists) == 1 + 0.5 + 2 + 0.25 + 1               # numpy not counted
    assert cuda_install_gb([]) == 0.0


def test_preflight_names_a_cuda_build_without_a_gpu_and_the_fix(monkeypatch, tmp_path):
    import torch

    from grpo_lab.teaching import workshop
    monkeypatch.setattr(workshop, "_timed_steps", lambda steps: ("GRPO steps", True, "fast"))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch, "__version__", "2.13.0+cu130")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(workshop, "cuda_install_gb", lambda: 4.25)
    checks = dict((name, (ok, detail)) for name, ok, detail in workshop.preflight(tmp_path))
    ok, detail = checks["torch"]
    assert not ok
    assert detail.startswith("2.13.0+cu130 (CUDA 13.0 build) on a machine without a usable GPU: "
                             "4.2 GB of torch, triton and nvidia-* packages installed for nothing")
    assert (f"pip install --force-reinstall torch==2.13.0 --index-url {workshop.CPU_INDEX}"
            in detail)
    assert workshop.CPU_INDEX == torch_index.CPU_INDEX
    verdict = workshop.preflight_report(workshop.preflight(tmp_path))
    assert verdict[0] is False and verdict[1].splitlines()[-1].startswith("NOT READY: torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)      # a GPU: nothing wrong
    ok, detail = dict((n, (o, d)) for n, o, d in workshop.preflight(tmp_path))["torch"]
    assert ok and detail == "2.13.0+cu130 (CUDA 13.0 build)"
    monkeypatch.setattr(torch.version, "cuda", None)                   # a CPU build: fine
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, detail = dict((n, (o, d)) for n, o, d in workshop.preflight(tmp_path))["torch"]
    assert ok and detail == "2.13.0+cpu (CPU build)"
