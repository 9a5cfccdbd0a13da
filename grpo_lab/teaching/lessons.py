"""``grpo-lab notebooks DIR``: the lessons copied out of the package, to open and edit anywhere.

The lessons live in the repository's notebooks/; an installed wheel carries the same files as
``grpo_lab/_notebooks/`` (pyproject.toml), and ``paths.notebooks_dir()`` finds whichever is
there. ``LESSONS`` names what is copied, laid out as in the repository: the numbered lessons,
WORKSHOP.md, the exercise stubs in ``exercises/`` and their solutions in
``exercises/solutions/`` (copied only when asked for: ``--solutions``). An installed package is never edited or run in place (notebooks write
runs beside themselves): ``grpo-lab lab`` on an install opens such a copy (``lab_notebooks``).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from grpo_lab.paths import IN_CHECKOUT, notebooks_dir

# what a copy holds, relative to notebooks/ (pyproject.toml's package-data for _notebooks agrees)
LESSONS = ("*.ipynb", "WORKSHOP.md", "exercises/*.ipynb", "exercises/solutions/*.ipynb")
SOLUTIONS = Path("exercises/solutions")   # left out of a copy unless asked for
LAB_COPY = "grpo-lab-notebooks"     # where `grpo-lab lab` on an install copies the lessons


def lesson_files(src: Path | None = None, solutions: bool = True) -> list[Path]:
    """The lessons' files under ``src`` (default ``paths.notebooks_dir()``), relative to it;
    without ``exercises/solutions/`` unless ``solutions``."""
    src = Path(src) if src is not None else notebooks_dir()
    files = sorted({p.relative_to(src) for pattern in LESSONS for p in src.glob(pattern)
                    if p.is_file() and (solutions or SOLUTIONS not in p.relative_to(src).parents)})
    if not files:
        raise FileNotFoundError(f"no lessons (notebooks/*.ipynb) in {src}")
    return files


def copy_lessons(dest: str | Path, overwrite: bool = False, src: Path | None = None,
                 keep_existing: bool = False, solutions: bool = False) -> list[Path]:
    """Copy the lessons into ``dest`` (created if missing) -> the files written; the exercises'
    solutions only if ``solutions`` (a teacher handing out a copy hands out no answers). A file
    already at ``dest`` is an error naming it unless ``overwrite`` (replace it) or
    ``keep_existing`` (leave it as it is: what a learner changed stays)."""
    dest = Path(dest).expanduser()
    if dest.exists() and not dest.is_dir():
        raise NotADirectoryError(f"{dest} is a file, not a folder to copy the lessons into")
    src = Path(src) if src is not None else notebooks_dir()
    files = lesson_files(src, solutions)
    there = [rel for rel in files if (dest / rel).exists()]
    if there and not (overwrite or keep_existing):
        more = f" (and {len(there) - 1} more)" if len(there) > 1 else ""
        raise FileExistsError(f"{dest / there[0]} already exists{more}: pass --overwrite to "
                              f"replace the lessons in {dest}, or choose an empty folder")
    written = []
    for rel in files:
        if keep_existing and not overwrite and rel in there:
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        written.append(Path(shutil.copyfile(src / rel, dest / rel)))   # no mode: a read-only
    return written                                                      # install copies writable


def lab_notebooks(where: str | Path = ".") -> Path:
    """The folder ``grpo-lab lab`` opens: a checkout's notebooks/; for an install, a copy in
    ``where/grpo-lab-notebooks`` (the missing lessons copied in, a learner's edits kept)."""
    if IN_CHECKOUT:
        return notebooks_dir()
    dest = Path(where) / LAB_COPY
    copied = copy_lessons(dest, keep_existing=True, solutions=True)
    kept = len(lesson_files()) - len(copied)
    print(f"grpo-lab lab: the lessons are in {dest.resolve()} ({len(copied)} files copied now, "
          f"{kept} kept as they were)")
    return dest.resolve()
