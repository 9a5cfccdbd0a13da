"""``grpo-lab lab --workshop [DIR]``, ``grpo-lab preflight``: what a workshop room runs.

``lab --workshop``: a learner gets the exercise notebooks (notebooks/exercises/*.ipynb, the
stubs, never ``solutions/``) copied into DIR (default ``runs/workshop/`` of the checkout, or of
the current folder for an installed package),
without outputs, in a JupyterLab rooted at DIR (so the file browser cannot reach the
solutions), whose workspace is reset (no tabs or kernels from an earlier session) and which
opens on the first exercise. Running it again starts clean again: a copy still as handed out
is reused, and one a learner changed is moved, not deleted, to ``DIR/previous/<time>/``;
``--reopen`` keeps every copy as the learner left it (the next session of the same room). The reset is a fresh workspace folder
(``DIR/.workspaces``, emptied at each start), not JupyterLab's ``?reset`` query: Jupyter
appends ``?token=...`` to the default URL as it stands, so a default URL that carries a query
prints an address (``...ipynb?reset?token=...``) whose token the server never sees, and
pasting it lands on the login page. The printed address must log in as it is: a learner under
WSL pastes it into the Windows browser.

``lab`` (with or without ``--workshop``) turns quick mode on (``GRPO_LAB_QUICK=1``) unless the
environment already sets ``GRPO_LAB_QUICK`` or ``--full`` is given.

``preflight``: what a learner runs on arrival. Python version, free disk, torch and the
notebook packages import (a CUDA build of torch where no GPU is usable is a problem: gigabytes
installed for nothing, and a sign the set-up skipped the CPU index), and a timed run of GRPO
steps of the toy policy (the compute of the longest quick-mode lesson cell, notebook 00's
training) -> one line per check, then OK or what is wrong. ``preflight --probe [PRESET]``
(opt-in, default smollm_cpu) adds the fast path a run of that transformers preset with
``--speed.fast_path probe`` takes on this machine: the cached probe record (speed_probe.py) if this
machine has one, else a probe now (once; it is then cached, and the run reads it).
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import quote

from grpo_lab.paths import IN_CHECKOUT

FIRST = "advantages.ipynb"
WORKSPACES = ".workspaces"    # under DIR: JupyterLab's saved layout (open tabs), emptied at start
MIN_PYTHON = (3, 10)          # pyproject.toml requires-python (tests/test_workshop.py checks)
MIN_FREE_GB = 1.0             # runs/ and the notebooks' checkpoints need well under this
LESSON_STEPS = 300            # notebook 00's quick-mode training: the session's longest cell
SLOW_LESSON_S = 180           # above this estimate a learner should pair or watch the projector
CPU_INDEX = "https://download.pytorch.org/whl/cpu"   # torch's CPU wheels (Makefile, tools/)
PACKAGES = ("numpy", "sklearn", "matplotlib", "ipywidgets", "jupyterlab", "pandas", "safetensors")
LAB_EXTRA = ("jupyterlab", "pandas")   # pyproject.toml's lab extra: not dependencies of the wheel


def lab_install_hint() -> str:
    """How to add the lab extra (JupyterLab, pandas) to an install or a checkout."""
    return ("they are the lab extra: pip install jupyterlab pandas, or pip install "
            "\"grpo_lab-<version>-py3-none-any.whl[lab]\" with the wheel, or pip install -e "
            "\".[lab]\" in a checkout")


def need_jupyterlab() -> None:
    """Raise an ImportError naming the lab extra when JupyterLab is not importable."""
    import importlib.util
    if importlib.util.find_spec("jupyterlab") is None:
        raise ImportError("JupyterLab is not installed (grpo-lab lab runs it): "
                          + lab_install_hint())


def untouched(copy: Path, stub: Path) -> bool:
    """Whether a learner's ``copy`` of ``stub`` is as it was handed out: the same cells (kind
    and source) and no outputs. Metadata JupyterLab writes on a save does not count; a cell
    run does (its outputs are the learner's work)."""
    import json
    try:
        a, b = (json.loads(Path(p).read_text()) for p in (copy, stub))
        return [(c["cell_type"], "".join(c["source"]), c.get("outputs", [])) for c in a["cells"]] \
            == [(c["cell_type"], "".join(c["source"]), c.get("outputs", [])) for c in b["cells"]]
    except (ValueError, KeyError, TypeError, OSError):
        return False                 # not a notebook any more: the learner's, kept


def prepare(exercises: Path, dest: Path, reopen: bool = False) -> list[Path]:
    """Copy the exercise stubs of ``exercises`` into ``dest`` -> the copies there, in order.
    A copy still as handed out is reused; one a learner changed moves to
    ``dest/previous/<time>/`` and a fresh stub takes its place, unless ``reopen`` (then it
    stays as the learner left it, and only missing stubs are copied)."""
    stubs = sorted(Path(exercises).glob("*.ipynb"))
    if not stubs:
        raise FileNotFoundError(f"no exercise notebooks (*.ipynb) in {exercises}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    names = {p.name for p in stubs}
    changed = [p for p in sorted(dest.glob("*.ipynb"))
               if p.name not in names or not untouched(p, Path(exercises) / p.name)]
    if changed and not reopen:
        keep = dest / "previous" / time.strftime("%Y%m%d-%H%M%S")
        keep.mkdir(parents=True, exist_ok=True)
        for p in changed:
            shutil.move(str(p), keep / p.name)
    for p in stubs:
        if not (dest / p.name).exists():
            shutil.copy2(p, dest / p.name)
    return [dest / p.name for p in stubs]


def lab_env(full: bool = False, environ=None) -> dict:
    """The environment JupyterLab runs in: ``GRPO_LAB_QUICK=1`` unless ``full`` (then 0) or the
    caller's environment already says (``GRPO_LAB_QUICK=0 grpo-lab lab`` is the full mode too)."""
    env = dict(os.environ if environ is None else environ)
    env["GRPO_LAB_QUICK"] = "0" if full else env.get("GRPO_LAB_QUICK", "1")
    return env


def lab_command(notebooks: Path, dest: Path | None = None, reopen: bool = False) -> list[str]:
    """Prepare ``dest`` (default ``<checkout>/runs/workshop``; for an installed package, whose
    lessons sit inside it, ``runs/workshop`` of the current folder) from the stubs of
    ``notebooks/exercises`` (``prepare``; ``reopen`` keeps a learner's work) -> the jupyter lab
    command line that opens it, rooted there, with a reset workspace (``dest/.workspaces``
    emptied) on the first exercise."""
    home = Path(notebooks).resolve().parent if IN_CHECKOUT else Path.cwd()
    dest = Path(dest if dest is not None else home / "runs" / "workshop")
    dest = dest.expanduser().resolve()
    copies = prepare(Path(notebooks) / "exercises", dest, reopen)
    first = FIRST if any(p.name == FIRST for p in copies) else copies[0].name
    shutil.rmtree(dest / WORKSPACES, ignore_errors=True)
    return [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={dest}",
            f"--LabApp.workspaces_dir={dest / WORKSPACES}",
            f"--LabApp.default_url=/lab/tree/{quote(first)}"]


def preflight(where: Path | str = ".", steps: int = 20,
              probe: str | None = None) -> list[tuple[str, bool, str]]:
    """The learner's arrival check -> [(check, ok, detail)]: Python, free disk at ``where``,
    the packages, and ``steps`` timed GRPO steps of the toy policy scaled to notebook 00's
    ``LESSON_STEPS`` (slow above ``SLOW_LESSON_S``); with ``probe`` (a preset name) the fast
    path of that preset here (``probe_check``)."""
    out = [("python", sys.version_info[:2] >= MIN_PYTHON,
            f"{sys.version.split()[0]} (needs >= {'.'.join(map(str, MIN_PYTHON))})")]
    free = shutil.disk_usage(Path(where).resolve()).free / 2**30
    out.append(("disk", free >= MIN_FREE_GB, f"{free:.1f} GB free at {Path(where).resolve()} "
                                             f"(needs >= {MIN_FREE_GB:g} GB)"))
    try:
        import torch
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
        unused = bool(torch.version.cuda) and not torch.cuda.is_available()
        out.append(("torch", not unused, f"{torch.__version__} ({build})" + (
            f" on a machine without a usable GPU: {cuda_install_gb():.1f} GB of torch, triton "
            "and nvidia-* packages installed for nothing; install the CPU build: pip install --force-reinstall torch=="
            f"{torch.__version__.split('+')[0]} --index-url {CPU_INDEX} (or delete .venv "
            "and run make env, which picks it)" if unused else "")))
    except Exception as e:                     # a broken wheel raises more than ImportError
        out.append(("torch", False, f"does not import: {e}"))
        return out
    missing = []
    for name in PACKAGES:
        try:
            __import__(name)
        except Exception as e:
            missing.append(f"{name} ({type(e).__name__})")
    hint = ("; " + lab_install_hint()) if any(m.split()[0] in LAB_EXTRA for m in missing) else ""
    out.append(("packages", not missing, "missing: " + ", ".join(missing) + hint if missing
                else ", ".join(PACKAGES) + " import"))
    out.append(_timed_steps(steps))
    if probe:
        out.append(probe_check(probe))
    return out


def probe_check(preset_name: str, say=print) -> tuple[str, bool, str]:
    """The fast path a run of ``preset_name`` with ``speed.fast_path="probe"`` takes here: its
    cached probe record (the same cache key as the run's: speed_probe.cache_path), else a
    probe now, cached -> a check naming the choice and the record's path. A preset that is not
    a transformers model's, or a model that does not load, is a failed check saying why."""
    from grpo_lab.training import speed_probe
    from grpo_lab.training.config import preset
    try:
        cfg = preset(preset_name, speed={"fast_path": "probe"})
        path = speed_probe.cache_path(cfg)
        probed: list = []                       # cached() says a line only when it probes
        record = speed_probe.cached(cfg, say=lambda line: (probed.append(line), say(line)))
    except Exception as e:              # no such preset, not policy="hf", a model not here
        return ("fast path", False, f"{preset_name}: no probe ({type(e).__name__}: {e})")
    where = "probed now, cached in" if probed else "read from"
    return ("fast path", True, f"{preset_name}: {speed_probe.choice_line(record)}; {where} {path}")


def cuda_install_gb(distributions=None) -> float:
    """What a CUDA build of torch occupies: the installed files of torch, triton and every
    nvidia-* package (their RECORD sizes), in GB (2**30 bytes)."""
    import importlib.metadata
    dists = importlib.metadata.distributions() if distributions is None else distributions
    total = 0
    for d in dists:
        name = (d.metadata["Name"] or "").lower().replace("_", "-")
        if name in ("torch", "triton") or name.startswith("nvidia-"):
            total += sum(f.size or 0 for f in d.files or ())
    return total / 2**30


def _timed_steps(steps: int) -> tuple[str, bool, str]:
    import tempfile

    from grpo_lab.training.config import preset
    from grpo_lab.training.trainer import train
    with tempfile.TemporaryDirectory() as d:
        cfg = preset("tiny_cpu", out_dir=d, steps=steps, time_budget_s=0, eval_every=0,
                     eval_size=20, threads=1)
        t0 = time.perf_counter()
        history = train(cfg, progress=False)
        wall = time.perf_counter() - t0
    step_s = [h["time/step_s"] for h in history if "time/step_s" in h]
    if len(step_s) != steps:
        return ("GRPO steps", False, f"ran {len(step_s)} of {steps} steps")
    per = sum(step_s) / steps
    lesson = per * LESSON_STEPS
    return ("GRPO steps", lesson <= SLOW_LESSON_S,
            f"{steps} steps of the toy policy in {wall:.1f} s ({per * 1000:.0f} ms a step): "
            f"notebook 00's quick training ({LESSON_STEPS} steps) would take about "
            f"{lesson:.0f} s here" + ("" if lesson <= SLOW_LESSON_S else
                                      f", over {SLOW_LESSON_S} s: a slow machine "
                                      "(notebooks/WORKSHOP.md, 'On a slow laptop')"))


def preflight_report(checks) -> tuple[bool, str]:
    """-> (all ok, the text a learner reads: one line per check, then the verdict)."""
    lines = [f"{'ok ' if ok else 'BAD'}  {name:10s} {detail}" for name, ok, detail in checks]
    bad = [name for name, ok, _ in checks if not ok]
    lines.append("OK: ready for the workshop" if not bad else
                 f"NOT READY: {', '.join(bad)} (see above; notebooks/WORKSHOP.md, 'Set-up')")
    return not bad, "\n".join(lines)
