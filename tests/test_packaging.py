"""environment.yml and pyproject.toml list the same dependencies; notebooks are stored clean."""
import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONDA_TO_PIP = {"pytorch": "torch"}


def conda_build(spec: str) -> str | None:
    """The build-string part of a conda spec "name version build" (None: not given)."""
    parts = spec.split("#")[0].split()
    return parts[2] if len(parts) == 3 else None


def normalise(spec: str) -> tuple[str, str]:
    spec = spec.split("#")[0]
    if conda_build(spec):                     # "pytorch >=2.2 cpu_*": the version only
        spec = spec[:spec.rindex(conda_build(spec))]
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", spec)
    name, rest = m.group(1).lower().replace("_", "-"), m.group(2).replace(" ", "")
    return CONDA_TO_PIP.get(name, name), rest


def pyproject_deps() -> set:
    p = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = p["dependencies"] + [d for extra in p["optional-dependencies"].values() for d in extra]
    return {normalise(s) for s in specs}


def conda_deps() -> set:
    out, in_deps, in_pip = set(), False, False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if line.startswith("dependencies:"):
            in_deps = True
            continue
        if not in_deps or not line.strip() or line.strip().startswith("#"):
            continue
        item = line.strip()[2:] if line.strip().startswith("- ") else None
        if item is None:
            continue
        indent = len(line) - len(line.lstrip())
        if item == "pip:":
            in_pip = True
            continue
        if in_pip and indent <= 2:
            in_pip = False
        if item.startswith("-e ") or item.split("=")[0] in ("python", "pip"):
            continue
        out.add(normalise(item))
    return out


def test_environment_yml_agrees_with_pyproject():
    py, conda = pyproject_deps(), conda_deps()
    assert py == conda, f"only in pyproject: {sorted(py - conda)}; only in environment.yml: " \
                        f"{sorted(conda - py)}"


def test_environment_yml_pins_the_cpu_build_of_pytorch():
    """Binder builds environment.yml on machines with no GPU: conda-forge's CPU build of PyTorch
    (build strings cpu_mkl_... / cpu_generic_...), never the CUDA one, at pyproject's version."""
    lines = [l.strip()[2:] for l in (ROOT / "environment.yml").read_text().splitlines()
             if l.strip().startswith("- pytorch")]
    assert len(lines) == 1, lines
    assert conda_build(lines[0]) == "cpu_*", lines[0]
    assert normalise(lines[0]) == ("torch", ">=2.2") and ("torch", ">=2.2") in pyproject_deps()
    assert conda_build("pytorch >=2.2") is None and normalise("numpy>=1.24 # why") == ("numpy",
                                                                                       ">=1.24")


def test_notebooks_are_stored_stripped():
    nbs = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb")
                 if ".ipynb_checkpoints" not in p.parts)                  # exercises included
    assert nbs, "no notebooks found"
    for nb_path in nbs:
        nb = json.loads(nb_path.read_text())
        assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", nb_path.name
        assert "widgets" not in nb["metadata"], f"{nb_path.name} stores widget state"
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "code":
                assert cell.get("outputs") == [], f"{nb_path.name} cell {i} has outputs"
                assert cell.get("execution_count") is None, f"{nb_path.name} cell {i} counted"


def test_licence_is_named_and_shipped():
    """One licence, named the same in pyproject.toml, LICENSE and CITATION.cff."""
    p = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert p["license"] == "MIT" and p["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    cff = (ROOT / "CITATION.cff").read_text()
    assert "cff-version: 1.2.0" in cff and "\nlicense: MIT\n" in cff
