"""``grpo-lab lab --workshop``: JupyterLab on fresh copies of the exercises.

A learner gets the exercise notebooks (notebooks/exercises/*.ipynb, the stubs) copied
into ``runs/workshop/`` of the checkout, without outputs, in a JupyterLab whose workspace is
reset (no tabs or kernels from an earlier session) and which opens on the first exercise.
Running it again starts clean again; what a learner wrote before is moved, not deleted, to
``runs/workshop/previous/<time>/``.
"""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

FIRST = "advantages.ipynb"


def prepare(exercises: Path, dest: Path) -> list[Path]:
    """Copy the exercise stubs of ``exercises`` into ``dest``; earlier copies move to
    ``dest/previous/<time>/``. -> the fresh copies."""
    stubs = sorted(Path(exercises).glob("*.ipynb"))
    if not stubs:
        raise FileNotFoundError(f"no exercise notebooks (*.ipynb) in {exercises}")
    dest = Path(dest)
    old = sorted(dest.glob("*.ipynb"))
    if old:
        keep = dest / "previous" / time.strftime("%Y%m%d-%H%M%S")
        keep.mkdir(parents=True, exist_ok=True)
        for p in old:
            shutil.move(str(p), keep / p.name)
    dest.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(p, dest / p.name)) for p in stubs]


def lab_command(notebooks: Path) -> list[str]:
    """Prepare ``<checkout>/runs/workshop`` from ``notebooks/exercises`` -> the jupyter lab
    command line that opens it with a reset workspace on the first exercise."""
    dest = Path(notebooks).resolve().parent / "runs" / "workshop"
    copies = prepare(Path(notebooks) / "exercises", dest)
    first = FIRST if any(p.name == FIRST for p in copies) else copies[0].name
    return [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={dest}",
            f"--LabApp.default_url=/lab/tree/{first}?reset"]
