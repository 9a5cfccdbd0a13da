"""Where a learner without a checkout gets grpo_lab from, written from one place.

grpo_lab has no release on PyPI yet (docs/release.md says what publishing takes), so nothing may
tell a learner to install it by name. Two routes work today:

* a wheel the user brings: ``make wheel`` writes ``dist/grpo_lab-VERSION-py3-none-any.whl``;
  in Colab it is uploaded into the notebook's folder (/content);
* the repository: ``pip install git+URL``, URL being pyproject.toml's ``[project.urls]``
  ``Repository``, the one place the address is kept.

This script writes that address, and the version, where they are used:

* every lesson's install cell (its third cell): the uploaded wheel if one is there, else
  ``git+URL``, else one clear error naming both routes (never pip's 404). Where torch is
  missing and no GPU is seen (no ``nvidia-smi``), torch's CPU build is installed first: PyPI's
  Linux torch is the CUDA build, about 3 GB of ``nvidia-*`` wheels. A torch already there
  (Colab's) is kept;
* every lesson's first cell: "Open in Colab" and "Binder" badges for a github.com URL (none
  while no URL is set); the site renders the same cell on each lesson page;
* docs/setup.md, between ``<!-- source -->`` and ``<!-- /source -->``: the git route.

    python tools/sync_source.py            # write them
    python tools/sync_source.py --check    # exit 1, naming the files, when one disagrees

tests/test_install_routes.py runs ``--check``; tools/make_nb12.py calls ``sync_notebook``.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"     # Makefile, tools/torch_index.py, workshop.py
BADGES = "[![Open In Colab]"     # how the badge line starts (found and replaced by it)
SETUP_BLOCK = re.compile(r"<!-- source -->\n.*?<!-- /source -->", re.S)


def project(pyproject: Path = ROOT / "pyproject.toml") -> tuple[str, str | None]:
    """-> (version, the repository URL or None) from pyproject.toml."""
    p = tomllib.loads(Path(pyproject).read_text())["project"]
    url = (p.get("urls") or {}).get("Repository") or None
    if url is not None and not re.fullmatch(r"https://[^\s\"'{}]+", url):
        raise ValueError(f"pyproject.toml [project.urls] Repository must be an https:// URL "
                         f"with no quotes, spaces or braces, got {url!r}")
    return p["version"], url.rstrip("/") if url else None


def wheel_name(version: str) -> str:
    return f"grpo_lab-{version}-py3-none-any.whl"


def install_cell(version: str, url: str | None) -> str:
    """The install cell of every lesson (QUICK comes from the parameters cell above it)."""
    git = f"%pip install git+{url}" if url else "%pip install git+<the repository's URL>"
    return f'''# The same file runs in Colab: install grpo_lab only when it is missing (installed: does nothing).
# Not on PyPI yet: a wheel you bring (make wheel; in Colab, upload it), else the repository.
import os
try:
    import grpo_lab
except ImportError:
    import glob, importlib.util, shutil
    REPOSITORY = {url!r}    # pyproject.toml [project.urls] (tools/sync_source.py)
    wheels = sorted(glob.glob("grpo_lab-*.whl"))
    source = wheels[-1] if wheels else REPOSITORY and f"git+{{REPOSITORY}}"
    if not source:
        raise RuntimeError("grpo_lab is not installed. Upload its wheel into this notebook's folder "
                           "(make wheel writes dist/{wheel_name(version)}) and run this cell "
                           "again, or install it from its repository: {git}")
    if importlib.util.find_spec("torch") is None and not shutil.which("nvidia-smi"):
        %pip install --quiet torch --index-url {CPU_INDEX}
    %pip install --quiet "{{source}}"
    import grpo_lab
if QUICK is not None:
    os.environ["GRPO_LAB_QUICK"] = "1" if int(QUICK) else "0"'''


def badge_line(url: str | None, lesson: str) -> str | None:
    """The Colab and Binder badges of ``lesson`` (e.g. 01_relative_rewards.ipynb); None where
    the URL is not a github.com repository (both services open GitHub repositories)."""
    m = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?", url or "")
    if not m:
        return None
    repo = f"{m.group(1)}/{m.group(2)}"
    colab = f"https://colab.research.google.com/github/{repo}/blob/main/notebooks/{lesson}"
    binder = f"https://mybinder.org/v2/gh/{repo}/main?labpath={quote('notebooks/' + lesson, safe='')}"
    return (f"{BADGES}(https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({colab}) [![Binder](https://mybinder.org/badge_logo.svg)]({binder})")


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def sync_notebook(path: Path, version: str, url: str | None) -> bool:
    """Write the badges and the install cell into one lesson -> whether it changed."""
    text = path.read_text()
    nb = json.loads(text)
    first = [l for l in "".join(nb["cells"][0]["source"]).split("\n") if not l.startswith(BADGES)]
    badges = badge_line(url, path.name)
    if badges:
        first.insert(1, badges)
    nb["cells"][0]["source"] = _lines("\n".join(first))
    nb["cells"][2]["source"] = _lines(install_cell(version, url))
    new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new != text:
        path.write_text(new)
    return new != text


PARAMETERS_CELL = ("code", """# Parameters (papermill: -p QUICK 1). QUICK = 1: short runs, 0: full-size runs, None: the
# GRPO_LAB_QUICK environment variable decides (make lab and the tests set it to 1).
QUICK = None""", {"tags": ["parameters"]})
"""A generated lesson's parameters cell, as every lesson has it (tests/test_docs.py)."""


def lesson_notebook(cells: list[tuple], name: str, url: str | None) -> str:
    """A generated lesson's .ipynb text (tools/make_nb12.py, make_nb13.py), outputs stripped:
    ``cells`` as (kind, source[, metadata]); the badges after the title where ``url`` is set,
    as in every lesson (tests/test_docs.py checks the committed file is this text)."""
    out = []
    for i, (kind, text, *meta) in enumerate(cells):
        c = {"cell_type": kind, "id": f"cell-{i:02d}", "metadata": (meta[0] if meta else None) or {},
             "source": text.splitlines(keepends=True)}
        if kind == "code":
            c.update(execution_count=None, outputs=[])
        out.append(c)
    badges = badge_line(url, name)
    if badges:
        title, _, rest = "".join(out[0]["source"]).partition("\n")
        out[0]["source"] = (title + "\n" + badges + "\n" + rest).splitlines(keepends=True)
    nb = {"cells": out,
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                      "name": "python3"}, "language_info": {"name": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def setup_block(version: str, url: str | None) -> str:
    route = (f'pip install "git+{url}"' if url else
             "# the repository's URL is not set yet (pyproject.toml [project.urls] Repository)")
    return (f"<!-- source -->\n```bash\n{route}\n```\n<!-- /source -->")


def sync(root: Path = ROOT, check: bool = False) -> list[str]:
    """Write (or with ``check`` only compare) every use of the URL -> the files that differ."""
    version, url = project(root / "pyproject.toml")
    differ = []
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        if check:
            nb = json.loads(path.read_text())
            want = [l for l in "".join(nb["cells"][0]["source"]).split("\n")
                    if not l.startswith(BADGES)]
            if badge_line(url, path.name):
                want.insert(1, badge_line(url, path.name))
            if ("".join(nb["cells"][2]["source"]) != install_cell(version, url)
                    or "".join(nb["cells"][0]["source"]) != "\n".join(want)):
                differ.append(str(path.relative_to(root)))
        elif sync_notebook(path, version, url):
            differ.append(str(path.relative_to(root)))
    setup = root / "docs" / "setup.md"
    text = setup.read_text()
    if not SETUP_BLOCK.search(text):
        raise ValueError(f"{setup}: no <!-- source --> ... <!-- /source --> block to write into")
    new = SETUP_BLOCK.sub(lambda m: setup_block(version, url), text)
    if new != text:
        differ.append(str(setup.relative_to(root)))
        if not check:
            setup.write_text(new)
    return differ


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 if one differs")
    a = ap.parse_args(argv)
    differ = sync(check=a.check)
    if a.check and differ:
        print("not written from pyproject.toml's [project.urls] (run python tools/sync_source.py): "
              + ", ".join(differ), file=sys.stderr)
        return 1
    print(("differ: " if a.check else "written: ") + (", ".join(differ) or "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
