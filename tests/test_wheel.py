"""A wheel built from the tree installs into a fresh venv and runs from an empty folder.

The build (pip wheel, no build isolation: the environment's setuptools, no download) reads a copy
of the files the wheel is made of, in a temporary folder, so no build/ or egg-info is left in
the checkout. The venv is fresh (``python -m venv --without-pip``): its only grpo_lab is the
wheel's, installed by this environment's pip (``pip --python``); the dependencies (torch, numpy,
...) come from this environment's site-packages through one .pth line, so nothing is
downloaded. The checkout is on no path of it: every command runs from an empty folder, without
PYTHONPATH, and the installed package is read-only while it runs (chmod a-w; as root, which
chmod does not stop, a listing of the package before and after proves nothing was written).

With CI set, a missing build tool fails the test instead of skipping it.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import site
import stat
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from grpo_lab.teaching.lessons import LESSONS, copy_lessons, lesson_files

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# what the wheel is built from: pyproject.toml names every other one (readme, licence, folders)
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "grpo_lab", "data", "notebooks")
NOT_SHIPPED_DATA = {"claims.md",          # rendered for people by grpo_lab.teaching.claims
                    "headlines.json"}     # read by tests/test_headlines.py only


def need(ok: bool, why: str) -> None:
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI: {why}")
        pytest.skip(why)


def copy_build_inputs(src: Path) -> Path:
    """The files a build reads, copied to ``src`` (a build writes build/ and egg-info there)."""
    src.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.egg-info", ".ipynb_checkpoints"))
        else:
            shutil.copy2(ROOT / name, src / name)
    return src


def build_wheel(tmp: Path, extra: dict[str, str] | None = None) -> Path:
    """The wheel of the tree; ``extra``: more files (path under the tree -> text) in the copy
    it is built from."""
    try:
        found = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        found = "none"
    major = int(found.split(".")[0]) if found[:1].isdigit() else 0
    need(major >= 77, f"the build needs setuptools >= 77 in this environment (the dev extra), "
                      f"found {found}: pip install 'setuptools>=77'")
    src = copy_build_inputs(tmp / "src")
    for rel, text in (extra or {}).items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-index", "-q", "-w", str(tmp / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = list((tmp / "dist").glob("grpo_lab-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_ships_the_data_and_the_lessons(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = {p.relative_to(ROOT / "data").as_posix() for p in (ROOT / "data").rglob("*")
            if p.is_file() and p.name not in NOT_SHIPPED_DATA}
    assert {n[len("grpo_lab/data/"):] for n in names if n.startswith("grpo_lab/data/")} == data
    lessons = {p.as_posix() for p in lesson_files(ROOT / "notebooks")}
    shipped = {n[len("grpo_lab/_notebooks/"):] for n in names if n.startswith("grpo_lab/_notebooks/")}
    assert shipped == lessons
    assert "grpo_lab/data/base_policy.safetensors" in names and "grpo_lab/data/claims.md" not in names
    assert not any(n.endswith((".pyc", "conftest.py", "make_exercises.py")) for n in names)
    assert wheel.stat().st_size < 4_000_000, wheel.stat().st_size        # 3.4 MB when written


CALCULATOR_RUN = {"command": "python bench/bench_calculator.py", "cpu": "test",
                  "steps": [{"step": 0, "heldout_acc": 0.5, "call_rate": 0.75, "well_formed": 1.0}],
                  "before": [], "after": []}


def test_a_recorded_calculator_run_ships_and_the_installed_lesson_reads_it(tmp_path):
    """data/agents/ (lesson 13's calculator run, written by bench/bench_calculator.py) is
    package data: a tree with data/agents/calculator_run.json builds a wheel holding it, and
    ``agents_lesson.calculator_run()`` of that wheel, installed, reads it from the package."""
    wheel = build_wheel(tmp_path, {"data/agents/calculator_run.json": json.dumps(CALCULATOR_RUN)})
    assert "grpo_lab/data/agents/calculator_run.json" in zipfile.ZipFile(wheel).namelist()
    python, purelib = fresh_venv(tmp_path / "venv")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    work = tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    r = subprocess.run([str(python), "-c", (
        "import json, grpo_lab.paths as p\n"
        "from grpo_lab.teaching.agents_lesson import calculator_run\n"
        "print(json.dumps([p.IN_CHECKOUT, str(p.DATA_DIR), calculator_run()]))")],
        cwd=work, env={**env, "PYTHONNOUSERSITE": "1"}, capture_output=True, text=True,
        timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    checkout, data, run = json.loads(r.stdout.splitlines()[-1])
    assert checkout is False and Path(data) == purelib / "grpo_lab" / "data"
    assert run == CALCULATOR_RUN


def test_the_listed_packages_are_the_folders_of_the_tree():
    """pyproject lists packages by name (a finder cannot map data/ inside grpo_lab): each folder
    of grpo_lab/ with an __init__.py is listed, and nothing else but the mapped data folders."""
    tool = PYPROJECT["tool"]["setuptools"]
    mapped = {"grpo_lab.data", "grpo_lab.data.hf_tiny", "grpo_lab.data.studies", "grpo_lab._notebooks"}
    code = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "grpo_lab").rglob("__init__.py")}
    assert set(tool["packages"]) == code | mapped
    assert tool["package-dir"] == {"grpo_lab.data": "data", "grpo_lab._notebooks": "notebooks"}
    assert sorted(tool["package-data"]["grpo_lab._notebooks"]) == sorted(LESSONS)


def fresh_venv(venv: Path) -> tuple[Path, Path]:
    """A venv with no packages of its own -> (its python, its site-packages); this environment's
    site-packages (torch, numpy, ...) are on its path through a .pth line, so nothing is
    downloaded, and a .pth line is only a path: the .pth files there (this environment's own
    editable grpo_lab) are not run."""
    r = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
    version = tuple(int(x) for x in r.stdout.split()[1].split(".")[:2]) if r.returncode == 0 else ()
    need(version >= (22, 3), f"pip >= 22.3 is needed (pip --python), found {r.stdout or r.stderr}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                   "['purelib'])"], capture_output=True, text=True,
                                  check=True).stdout.strip())
    deps = [p for p in dict.fromkeys(site.getsitepackages()) if Path(p).is_dir()
            and Path(p).resolve() != ROOT]
    (purelib / "_grpo_lab_test_deps.pth").write_text("\n".join(deps) + "\n")
    return python, purelib


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def set_writable(folder: Path, writable: bool) -> None:
    bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    for p in [folder, *folder.rglob("*")]:
        mode = p.stat().st_mode
        p.chmod(mode | stat.S_IWUSR if writable else mode & ~bits)


def test_the_wheel_installs_and_runs_from_an_empty_folder(wheel, tmp_path):
    venv = tmp_path / "venv"
    python, purelib = fresh_venv(venv)
    bindir = python.parent
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    package = purelib / "grpo_lab"

    work = tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PYTHONNOUSERSITE="1", GRPO_LAB_QUICK="1", OMP_NUM_THREADS="1", MPLBACKEND="Agg")

    def run(*args, timeout=240):
        r = subprocess.run([str(a) for a in args], cwd=work, env=env, capture_output=True,
                           text=True, timeout=timeout)
        assert r.returncode == 0, f"{args}: {r.stdout[-2000:]}{r.stderr[-3000:]}"
        return r.stdout

    before = tree(package)
    set_writable(package, False)
    try:
        where = json.loads(run(python, "-c", (
            "import json, sys, grpo_lab, grpo_lab.paths as p\n"
            "from grpo_lab.tasks.task_data import load_eval\n"
            "print(json.dumps({'file': grpo_lab.__file__, 'checkout': p.IN_CHECKOUT,"
            " 'data': str(p.DATA_DIR), 'path': sys.path, 'addition': len(load_eval('addition')),"
            " 'base': str(p.resolve_path('data/base_policy.safetensors'))}))")))
        assert Path(where["file"]).resolve().is_relative_to(venv.resolve()), where["file"]
        assert where["checkout"] is False and Path(where["data"]) == package / "data"
        assert not any(Path(p).resolve() == ROOT for p in where["path"] if p), where["path"]
        assert where["addition"] == 200                                   # data/eval_addition.jsonl
        assert Path(where["base"]) == package / "data" / "base_policy.safetensors"

        run(bindir / "grpo-lab", "train", "--preset", "tiny_cpu", "--steps", 20, "--out_dir", "run")
        rows = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
        assert sorted(r["step"] for r in rows if r["step"] >= 0) == list(range(20))
        assert "grpo-lab model get" in run(bindir / "grpo-lab", "model", "get", "--help")

        run(bindir / "grpo-lab", "notebooks", "lessons")
        copied = {p.relative_to(work / "lessons") for p in (work / "lessons").rglob("*") if p.is_file()}
        assert copied == set(lesson_files(ROOT / "notebooks", solutions=False))
        assert not (work / "lessons" / "exercises" / "solutions").exists()
        for rel in copied:
            assert (work / "lessons" / rel).read_bytes() == (ROOT / "notebooks" / rel).read_bytes()

        # the lab commands on an install: JupyterLab (stubbed: it would serve) on copies only
        cmds, bench = json.loads(run(python, "-c", (
            "import contextlib, io, json, subprocess\n"
            "from grpo_lab.cli import main\n"
            "seen, err = [], io.StringIO()\n"
            "subprocess.call = lambda cmd, *args, **kwargs: seen.append(cmd) or 0\n"
            "assert main(['lab']) == 0 and main(['lab', '--workshop']) == 0\n"
            "with contextlib.redirect_stderr(err):\n"
            "    rc = main(['bench'])\n"
            "print(json.dumps([seen, [rc, err.getvalue()]]))")).splitlines()[-1])
        assert bench[0] == 2 and "(an installed package): 'grpo-lab bench' needs a checkout" in bench[1]
        assert cmds[0][-1] == str((work / "grpo-lab-notebooks").resolve())
        assert (work / "grpo-lab-notebooks" / "00_quickstart.ipynb").is_file()
        assert any(str((work / "runs" / "workshop").resolve()) in arg for arg in cmds[1]), cmds[1]
        assert not any(str(package) in arg for cmd in cmds for arg in cmd), cmds
        assert (work / "runs" / "workshop" / "advantages.ipynb").is_file()
    finally:
        set_writable(package, True)
    assert tree(package) == before                        # nothing was written into the package


def test_an_editable_install_reads_the_checkout(tmp_path):
    """pip install -e (what make env does): the package and data/ are the tree's own folders,
    found from any working folder."""
    src = copy_build_inputs(tmp_path / "checkout")
    python, purelib = fresh_venv(tmp_path / "venv")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                        "--no-deps", "--no-build-isolation", "--no-index", "-e", str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    r = subprocess.run([str(python), "-c", (
        "import json, grpo_lab, grpo_lab.paths as p\n"
        "print(json.dumps([grpo_lab.__file__, p.IN_CHECKOUT, str(p.DATA_DIR),"
        " str(p.resolve_path('data/hf_tiny')), str(p.notebooks_dir())]))")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    file, checkout, data, hf_tiny, notebooks = json.loads(r.stdout)
    assert Path(file) == src / "grpo_lab" / "__init__.py" and checkout is True
    assert (Path(data), Path(hf_tiny), Path(notebooks)) == (src / "data", src / "data" / "hf_tiny",
                                                            src / "notebooks")


def test_resolve_path_in_a_checkout(tmp_path, monkeypatch):
    from grpo_lab import paths
    monkeypatch.chdir(tmp_path)                                      # not the repository root
    assert paths.IN_CHECKOUT and paths.DATA_DIR == ROOT / "data"
    assert paths.resolve_path("data/eval_addition.jsonl") == ROOT / "data" / "eval_addition.jsonl"
    assert paths.resolve_path("bench/bench_codecs.py") == ROOT / "bench" / "bench_codecs.py"
    assert paths.resolve_path("data/no_such.jsonl") == Path("data/no_such.jsonl")   # as asked
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "eval_addition.jsonl").write_text("")
    assert paths.resolve_path("data/eval_addition.jsonl") == Path("data/eval_addition.jsonl")
    with pytest.raises(FileNotFoundError, match=r"no nope/ directory at .*nope: 'grpo-lab nope' "
                                                r"needs a checkout"):
        paths.checkout_dir("nope")


def test_copy_lessons_refuses_to_overwrite_naming_the_file(tmp_path):
    src = tmp_path / "nb"
    (src / "exercises" / "solutions").mkdir(parents=True)
    for rel in ("00_a.ipynb", "WORKSHOP.md", "exercises/e.ipynb", "exercises/solutions/e.ipynb",
                "exercises/make_exercises.py", "notes.txt"):
        (src / rel).write_text(rel)
    assert [p.as_posix() for p in lesson_files(src, solutions=False)] == \
        ["00_a.ipynb", "WORKSHOP.md", "exercises/e.ipynb"]
    dest = tmp_path / "out"
    written = copy_lessons(dest, src=src, solutions=True)
    assert sorted(p.relative_to(dest).as_posix() for p in written) == \
        ["00_a.ipynb", "WORKSHOP.md", "exercises/e.ipynb", "exercises/solutions/e.ipynb"]
    assert len(copy_lessons(tmp_path / "handout", src=src)) == 3           # no solutions
    (dest / "exercises" / "e.ipynb").write_text("my answer")
    with pytest.raises(FileExistsError, match=r"out/00_a\.ipynb already exists \(and 3 more\): "
                                              r"pass --overwrite"):
        copy_lessons(dest, src=src, solutions=True)
    assert copy_lessons(dest, src=src, keep_existing=True) == []      # a learner's edit is kept
    assert (dest / "exercises" / "e.ipynb").read_text() == "my answer"
    assert len(copy_lessons(dest, src=src, overwrite=True, solutions=True)) == 4
    assert (dest / "exercises" / "e.ipynb").read_text() == "exercises/e.ipynb"
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotADirectoryError, match="afile is a file"):
        copy_lessons(tmp_path / "afile", src=src)
    with pytest.raises(FileNotFoundError, match=r"no lessons \(notebooks/\*\.ipynb\) in .*empty"):
        copy_lessons(dest, src=tmp_path / "empty")


def test_notebooks_command_copies_and_refuses_with_a_clear_error(tmp_path, capsys):
    from grpo_lab.cli import main
    assert main(["notebooks", str(tmp_path / "l")]) == 0
    assert (tmp_path / "l" / "WORKSHOP.md").is_file()
    assert (tmp_path / "l" / "exercises" / "loss.ipynb").is_file()
    assert not (tmp_path / "l" / "exercises" / "solutions").exists()        # no answers
    n = len(lesson_files(solutions=False))
    assert n < len(lesson_files())
    assert f"{n} files copied into {tmp_path / 'l'}" in capsys.readouterr().out
    assert main(["notebooks", str(tmp_path / "t"), "--solutions"]) == 0
    assert (tmp_path / "t" / "exercises" / "solutions" / "loss.ipynb").is_file()
    assert "and exercises/solutions/ their solutions" in capsys.readouterr().out
    assert main(["notebooks", str(tmp_path / "l")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'l' / '00_quickstart.ipynb'} already exists (and {n - 1} more)" in err
    assert main(["notebooks", str(tmp_path / "l"), "--overwrite"]) == 0


# ---------------------------------------------------------------- the set-up page's wheel route
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def documented_wheel_route() -> str:
    """docs/setup.md's one line: torch's CPU build, then the wheel."""
    lines = [line for line in (ROOT / "docs" / "setup.md").read_text().splitlines()
             if line.startswith(f"pip install torch --index-url {CPU_INDEX} && pip install ")]
    assert len(lines) == 1, lines
    return lines[0]


def local_cpu_torch() -> Path | None:
    """A CPU wheel of torch for this Python in one of pip's find-links folders (PIP_FIND_LINKS
    or pip's configuration): the stand-in for torch's CPU index, which a test may not reach."""
    r = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                       text=True)
    folders = os.environ.get("PIP_FIND_LINKS", "").split()
    for line in r.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            folders += value.strip("'\"").split()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for folder in folders:
        found = sorted(Path(folder.removeprefix("file://")).glob(f"torch-*+cpu-{tag}-{tag}-*.whl"))
        if found:
            return found[-1]
    return None


def requirements(wheel: Path) -> list[str]:
    """A wheel's unconditional Requires-Dist (no extra, no marker)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [l.split(":", 1)[1].strip() for l in lines
            if l.startswith("Requires-Dist:") and ";" not in l]


EXTRAS = {"fast": {"numba"}, "lab": {"jupyterlab", "pandas"}}
"""What the wheel leaves to extras (pyproject.toml): no module of grpo_lab needs them to import."""


def extras(wheel: Path) -> dict[str, set[str]]:
    """A wheel's Requires-Dist under ``extra == "NAME"`` -> {extra: {package names}}."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out: dict[str, set[str]] = {}
    for line in lines:
        if line.startswith("Requires-Dist:") and "; extra == " in line:
            spec, extra = line.split(":", 1)[1].split("; extra == ")
            name = spec.strip().split(">")[0].split("=")[0].split("<")[0].split("[")[0]
            out.setdefault(extra.strip().strip('"'), set()).add(name.lower())
    return out


def test_the_base_install_leaves_numba_jupyterlab_and_pandas_to_extras(wheel):
    """The wheel route installs the unconditional list: numba (fast), JupyterLab and pandas (lab)
    are extras of it, named in its metadata (their sizes: bench/RESULTS_wheel_install.md)."""
    base = {r.split(">")[0].split("=")[0].lower() for r in requirements(wheel)}
    assert {"torch", "numpy", "scikit-learn", "ipywidgets"} <= base
    assert not base & set().union(*EXTRAS.values()), base
    found = extras(wheel)
    for extra, names in EXTRAS.items():
        assert found[extra] == names, found


def test_the_documented_wheel_route_installs_torchs_cpu_build(wheel, tmp_path):
    """The set-up page's line, run as written in a fresh venv, the CPU index replaced by a local
    folder that holds what it serves (torch's CPU wheel and torch's requirements); the wheel's
    other dependencies come from wherever pip is set up to look. torch stays the CPU build."""
    import shlex
    import time

    line = documented_wheel_route()
    torch_wheel = local_cpu_torch()
    need(torch_wheel is not None, "no CPU wheel of torch in pip's find-links folders")
    index = tmp_path / "cpu-index"
    index.mkdir()
    shutil.copyfile(torch_wheel, index / torch_wheel.name)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:",
                        "--dest", str(index), *requirements(torch_wheel)],
                       capture_output=True, text=True, timeout=600)
    need(r.returncode == 0, f"torch's requirements could not be fetched: {r.stderr[-500:]}")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    line = line.replace(f"--index-url {CPU_INDEX}", f"--no-index --find-links {index}")
    line = line.replace(wheel.name, str(wheel))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    t0 = time.perf_counter()
    for command in line.split(" && "):
        args = shlex.split(command)
        assert args[0] == "pip", command
        r = subprocess.run([str(bindir / "pip"), *args[1:], "-q"], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=900)
        if "--no-index" not in args and r.returncode and "rror" in r.stderr and (
                "connection" in r.stderr.lower() or "No matching distribution" in r.stderr):
            need(False, f"the wheel's dependencies are not reachable here: {r.stderr[-300:]}")
        assert r.returncode == 0, f"{command}: {r.stdout[-1000:]}{r.stderr[-2000:]}"
    seconds = time.perf_counter() - t0
    r = subprocess.run([str(bindir / "python"), "-c", (
        "import json, importlib.metadata as m, torch, grpo_lab\n"
        "print(json.dumps([torch.__version__, torch.version.cuda, sorted(d.metadata['Name'].lower()"
        " for d in m.distributions())]))")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    version, cuda, installed = json.loads(r.stdout)
    gpu_packages = [n for n in installed if n.startswith(("nvidia", "triton"))]
    assert cuda is None and version.endswith("+cpu") and gpu_packages == [], r.stdout
    assert not set(installed) & {"numba", "llvmlite", "jupyterlab", "pandas"}, installed
    size = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"wheel route: {seconds:.0f} s, {size / 2**30:.2f} GB in the venv, torch {version}")
    # 1.35 GB (1.26 GiB) when written, 1.79 GB before numba, JupyterLab and pandas became
    # extras; torch's CPU build alone 757 MB (bench/RESULTS_wheel_install.md)
    assert size < 1.5 * 2**30, size
