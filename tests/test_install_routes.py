"""Where a learner without a checkout gets grpo_lab: a wheel they bring or the repository, the
address kept once (pyproject.toml [project.urls]) and written by tools/sync_source.py into each
lesson's install cell and badges and docs/setup.md. Nothing says ``pip install grpo-lab`` (no
release on PyPI), and no route pulls CUDA torch onto a machine without a GPU.

The install cell is run as IPython runs it (its %pip lines transformed, the magics recorded, not
run); the documented wheel-route command itself runs in tests/test_wheel.py.
"""
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
sync_source = load_script("tools/sync_source.py")
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
VERSION = sync_source.project()[0]
WHEEL = f"grpo_lab-{VERSION}-py3-none-any.whl"
FIND_SPEC = importlib.util.find_spec


def test_every_use_of_the_address_is_written_from_pyproject():
    assert sync_source.sync(check=True) == [], "run: python tools/sync_source.py"


def test_nothing_says_pip_install_grpo_lab():
    """Until a release exists, `pip install grpo-lab` (or grpo_lab, or an extra of it) is pip's
    404; `pip install -e .` and a named wheel file are fine."""
    bad = re.compile(r"pip install[ \t]+(?:-[-\w]+(?:[ =][^\s]+)?[ \t]+)*[\"']?grpo[-_]lab(?:\[[^\]]*\])?"
                     r"[\"']?(?=[\s`'\"]|$)", re.I | re.M)
    found = []
    for pattern in ("*.md", "docs/**/*.md", "notebooks/**/*.md", "notebooks/**/*.ipynb",
                    "grpo_lab/**/*.py", "tools/*.py", "Makefile"):
        for path in ROOT.glob(pattern):
            if path.relative_to(ROOT).parts[:1] == ("site",) or path.name == "release.md":
                continue                    # the built site; what publishing will change
            for m in bad.finditer(path.read_text(errors="replace")):
                found.append(f"{path.relative_to(ROOT)}: {m.group(0)!r}")
    assert found == []
    assert bad.search("pip install grpo-lab") and bad.search('pip install "grpo_lab[wandb]"')
    assert bad.search("%pip install --quiet grpo-lab\n") and bad.search("pip install -U grpo_lab")
    assert not bad.search(f"pip install {WHEEL}") and not bad.search("pip install -e .")


def run_cell(source: str, monkeypatch, tmp_path, *, torch: bool = True, gpu: bool = False,
             wheels=()) -> list:
    """Run the install cell with grpo_lab missing, from ``tmp_path`` holding ``wheels`` ->
    the %pip lines it ran (each expanded as IPython expands {name} in a magic)."""
    from IPython.core.inputtransformer2 import TransformerManager

    calls = []

    class Shell:
        def run_line_magic(self, name, line):
            calls.append(f"%{name} " + line.format(**sys._getframe(1).f_locals))

    for w in wheels:
        (tmp_path / w).write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "grpo_lab", None)               # import grpo_lab raises
    real = FIND_SPEC
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (real(name, *a) if torch else None) if name == "torch"
                        else real(name, *a))
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi"
                        if gpu and name == "nvidia-smi" else None)
    code = TransformerManager().transform_cell(source)
    try:
        exec(code, {"get_ipython": lambda: Shell(), "QUICK": None})
    except ImportError:
        pass                            # the second import, after a pip that only was recorded
    return calls


CPU_TORCH = "%pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu"


def test_no_source_stops_with_one_message_naming_both_routes(monkeypatch, tmp_path):
    cell = sync_source.install_cell(VERSION, None)
    with pytest.raises(RuntimeError) as e:
        run_cell(cell, monkeypatch, tmp_path)
    msg = str(e.value)
    assert msg == ("grpo_lab is not installed. Upload its wheel into this notebook's folder (make "
                   f"wheel writes dist/{WHEEL}) and run this cell again, or install it from its "
                   "repository: %pip install git+<the repository's URL>")


def test_an_uploaded_wheel_is_installed_after_torchs_cpu_build(monkeypatch, tmp_path):
    cell = sync_source.install_cell(VERSION, "https://github.com/someone/grpo_lab")
    older = "grpo_lab-0.0.9-py3-none-any.whl"
    assert run_cell(cell, monkeypatch, tmp_path, torch=False, wheels=[WHEEL, older]) == [
        CPU_TORCH, f'%pip install --quiet "{WHEEL}"']            # the newest wheel, not git


def test_the_repository_without_a_wheel_and_a_gpu_or_torch_keeps_torch(monkeypatch, tmp_path):
    url = "https://github.com/someone/grpo_lab"
    cell = sync_source.install_cell(VERSION, url)
    git = f'%pip install --quiet "git+{url}"'
    assert run_cell(cell, monkeypatch, tmp_path, torch=False, gpu=True) == [git]  # its own torch
    assert run_cell(cell, monkeypatch, tmp_path, torch=True) == [git]     # Colab's torch kept
    assert run_cell(cell, monkeypatch, tmp_path, torch=False) == [CPU_TORCH, git]
    assert f"%pip install git+{url}" in cell                     # the message's git route


def test_the_address_lands_in_every_lesson_the_badges_and_the_set_up_page(tmp_path):
    """A copy of the tree with Repository set: the tool writes it everywhere, and again is a
    no-op; unset again, every badge goes."""
    for rel in ("pyproject.toml", "docs/setup.md", *(p.relative_to(ROOT) for p in LESSONS)):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, tmp_path / rel)
    py = tmp_path / "pyproject.toml"
    url = "https://github.com/someone/grpo_lab"
    py.write_text(py.read_text().replace("# Repository = ", "Repository = ", 1)
                  .replace('"https://github.com/OWNER/grpo_lab"', f'"{url}"', 1))
    assert sync_source.project(py) == (VERSION, url)
    assert len(sync_source.sync(tmp_path)) == len(LESSONS) + 1
    assert sync_source.sync(tmp_path, check=True) == []
    nb = json.loads((tmp_path / "notebooks" / "01_relative_rewards.ipynb").read_text())
    first = "".join(nb["cells"][0]["source"]).splitlines()
    assert first[1] == (
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"(https://colab.research.google.com/github/someone/grpo_lab/blob/main/notebooks/"
        "01_relative_rewards.ipynb) [![Binder](https://mybinder.org/badge_logo.svg)]"
        "(https://mybinder.org/v2/gh/someone/grpo_lab/main?labpath=notebooks%2F"
        "01_relative_rewards.ipynb)")
    assert first[0].startswith("# 01 ") and first[2] == ""
    assert f"REPOSITORY = {url!r}" in "".join(nb["cells"][2]["source"])
    assert f'```bash\npip install "git+{url}"\n```' in (tmp_path / "docs" / "setup.md").read_text()
    py.write_text(py.read_text().replace(f'Repository = "{url}"', "# Repository = x", 1))
    sync_source.sync(tmp_path)
    for path in (tmp_path / "notebooks").glob("*.ipynb"):
        assert "Open In Colab" not in path.read_text(), path.name
        assert json.loads(path.read_text()) == json.loads((ROOT / path.relative_to(tmp_path))
                                                          .read_text())


def test_a_bad_address_is_refused_naming_it(tmp_path):
    py = tmp_path / "pyproject.toml"
    py.write_text('[project]\nversion = "1"\n[project.urls]\nRepository = "git@github.com:a/b"\n')
    with pytest.raises(ValueError, match=r"Repository must be an https:// URL .*'git@github"):
        sync_source.project(py)
    assert sync_source.badge_line("https://gitlab.com/a/b", "x.ipynb") is None


def test_setup_page_gives_the_one_line_cpu_install_of_the_wheel():
    text = (ROOT / "docs" / "setup.md").read_text()
    assert (f"pip install torch --index-url {sync_source.CPU_INDEX} && pip install {WHEEL}"
            in text.splitlines())
    from grpo_lab.teaching.workshop import CPU_INDEX
    assert CPU_INDEX == sync_source.CPU_INDEX
