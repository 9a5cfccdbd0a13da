"""Where ``make env`` installs torch from: the CPU build on Linux, never CUDA by surprise.

On Linux, PyPI's torch is the CUDA build: a plain ``pip install torch==2.13.0`` on a cp311
x86_64 machine resolves to ``torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl``, whose
metadata requires nvidia-cudnn-cu13, nvidia-nccl-cu13, nvidia-cusparselt-cu13, ... and triton
(several GB a laptop never uses; measured with ``pip install --dry-run --report``). The CPU
build (``2.13.0+cpu``) lives on torch's own index, CPU_INDEX. A machine whose pip already
resolves a CPU build (a local wheel folder or a mirror that holds ``+cpu`` wheels) keeps it and
never asks the CPU index, which such a machine may not reach.

    python tools/torch_index.py REQUIREMENT [INDEX]

prints the pip arguments that choose torch's source (nothing, or ``--index-url URL``) and says
on stderr why. INDEX (the Makefile's ``TORCH_INDEX``):
  * CPU_INDEX (the default on Linux): a dry run of the plain install (metadata only, no
    download of the wheel) decides: a CPU build is installed from where pip found it; a CUDA
    build (one that requires ``nvidia-*`` wheels, or a ``+cu...`` version) is swapped for the
    CPU index. A dry run that fails also picks the CPU index (the safe side).
  * empty: the plain install, whatever it resolves to (on Linux, PyPI's CUDA build: the opt-in).
  * any other URL: that index (e.g. https://download.pytorch.org/whl/cu130 for one CUDA version).

Standard library only: it runs in the fresh venv before anything else is installed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def is_cuda_build(metadata: dict) -> bool:
    """A torch wheel's metadata (pip's report) -> whether it is a CUDA build."""
    local = metadata.get("version", "").partition("+")[2]
    needs = [r.split(";")[0].strip().lower() for r in metadata.get("requires_dist") or []]
    return local.startswith("cu") or any(n.startswith("nvidia-") for n in needs)


def torch_in(report: dict) -> dict | None:
    """The metadata of the torch that a pip report would install (None: none in it)."""
    for item in report.get("install", []):
        if item.get("metadata", {}).get("name", "").lower() == "torch":
            return item["metadata"]
    return None


def dry_run(requirement: str) -> dict:
    """What ``pip install REQUIREMENT`` would install here, from the indexes pip is set up with
    -> pip's installation report (metadata only: no wheel is downloaded where the index serves
    the metadata apart, as PyPI does)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "report.json")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run",
                        "--no-deps", "--ignore-installed", "--report", path, requirement],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        with open(path) as f:
            return json.load(f)


def choose(requirement: str, index: str, plan=dry_run) -> tuple[list[str], str]:
    """-> (pip arguments for torch's source, the reason in one line)."""
    if not index:
        return [], "TORCH_INDEX is empty: the plain install (on Linux, PyPI's CUDA build)"
    if index.rstrip("/") != CPU_INDEX:
        return ["--index-url", index], f"TORCH_INDEX={index}"
    try:
        torch = torch_in(plan(requirement))
    except (subprocess.CalledProcessError, OSError, ValueError) as e:
        said = (getattr(e, "stderr", None) or str(e)).strip().splitlines()
        return ["--index-url", CPU_INDEX], (f"the dry run of {requirement!r} failed "
                                            f"({said[-1] if said else type(e).__name__}): "
                                            f"the CPU index")
    if torch is None:
        return ["--index-url", CPU_INDEX], f"{requirement!r} resolved to no torch: the CPU index"
    if is_cuda_build(torch):
        return ["--index-url", CPU_INDEX], (
            f"{requirement} resolves to torch {torch['version']}, a CUDA build: the CPU build "
            f"from {CPU_INDEX} instead (TORCH_INDEX= installs the CUDA build)")
    return [], f"{requirement} resolves to torch {torch['version']}, a CPU build: installing it"


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: torch_index.py REQUIREMENT [INDEX]", file=sys.stderr)
        return 2
    args, why = choose(argv[0], argv[1] if len(argv) == 2 else "")
    print(f"torch: {why}", file=sys.stderr)
    print(" ".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
