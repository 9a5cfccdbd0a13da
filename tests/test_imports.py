"""The package's import graph, built from the source: no cycle, no import from a lower layer to a
higher one (grpo_lab.LAYERS, docs/reference/architecture.md), and every module imports on its own.

Every ``import``/``from ... import`` of a grpo_lab module counts, wherever it is written (at the
top, inside a function, under ``if TYPE_CHECKING``): a lazy import that hides a cycle is a cycle.
``importlib.import_module("grpo_lab....")`` and ``__import__("grpo_lab....")`` count as imports
too; their name must be a literal (a computed grpo_lab name is an error: the graph cannot see it).

Run as a script to count cycles and upward imports of any checkout (e.g. before a change):
    python tests/test_imports.py /path/to/checkout
"""
from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def modules(root: Path) -> dict[str, Path]:
    """'grpo_lab.x.y' -> its file, for every module of the package under ``root``."""
    out = {}
    for path in sorted((root / "grpo_lab").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _resolve(name: str, known) -> str | None:
    """The deepest known module a dotted name lies in (``grpo_lab.training.step.collect`` -> step)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported_name(node: ast.Call) -> ast.expr | None:
    """The name argument of ``importlib.import_module(...)`` or ``__import__(...)``, else None."""
    called = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
    if called in ("import_module", "__import__") and node.args:
        return node.args[0]
    return None


def imports(name: str, path: Path, known) -> tuple[set, set]:
    """-> (grpo_lab modules ``name`` imports, by a statement or by importlib.import_module /
    __import__; the computed grpo_lab names it imports, which the graph cannot resolve)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found, computed = set(), set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        elif isinstance(node, ast.Call) and (arg := _imported_name(node)) is not None:
            if isinstance(arg, ast.Constant) and str(arg.value).startswith("grpo_lab"):
                targets = [arg.value]
            elif not isinstance(arg, ast.Constant) and "grpo_lab" in ast.unparse(arg):
                computed.add(f"{ast.unparse(arg)} (line {node.lineno})")
        found |= {m for m in (_resolve(t, known) for t in targets) if m and m != name}
    return found, computed


def layer_of(name: str) -> int:
    """Index in grpo_lab.LAYERS (0 = top); an error names a module missing from the table."""
    from grpo_lab import LAYERS
    short = name[len("grpo_lab."):] if name != "grpo_lab" else ""
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            if short == m or (m.endswith(".*") and short.startswith(m[:-1])):
                return i
    raise AssertionError(f"module {name} is in no layer of grpo_lab.LAYERS: add it to the "
                         f"layer it belongs to")


def graph(root: Path = ROOT) -> tuple[dict, dict]:
    """-> ({module: the grpo_lab modules it imports}, {module: its computed grpo_lab imports})."""
    known = modules(root)
    edges, computed = {}, {}
    for name, path in known.items():
        edges[name], computed[name] = imports(name, path, known)
    return edges, computed


def cycles(edges: dict) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), and self-imports."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def upward(edges: dict) -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module sits in a higher layer."""
    return sorted((a, b) for a, bs in edges.items() for b in bs if layer_of(b) < layer_of(a))


def test_every_module_has_a_layer():
    for name in modules(ROOT):
        layer_of(name)


def test_no_import_cycle():
    edges, _ = graph()
    found = cycles(edges)
    assert not found, f"import cycles (imports inside functions count): {found}"


def test_imports_point_down():
    edges, _ = graph()
    bad = upward(edges)
    assert not bad, ("imports from a lower layer to a higher one (grpo_lab.LAYERS): "
                     + ", ".join(f"{a} -> {b}" for a, b in bad))


def test_the_mechanisms_folders_import_down_as_drawn():
    # the Architecture picture draws the mechanisms layer as algorithm/ over policies/ over
    # tasks/: no import runs back up that order (policies/policy.py read critic.py's modules)
    order = ("algorithm", "policies", "tasks")
    edges, _ = graph()
    folder = lambda m: m.split(".")[1] if m.count(".") >= 1 else ""     # noqa: E731
    bad = [(a, b) for a, bs in edges.items() for b in bs if folder(a) in order
           and folder(b) in order and order.index(folder(b)) < order.index(folder(a))]
    assert not bad, "imports back up the drawing's order: " + ", ".join(f"{a} -> {b}"
                                                                        for a, b in bad)


def test_distributed_never_imports_the_trainer_step_or_cli():
    edges, _ = graph()
    for name, deps in edges.items():
        if name.startswith("grpo_lab.distributed"):
            assert not deps & {"grpo_lab.training.trainer", "grpo_lab.training.step", "grpo_lab.cli"}, name
            assert all(d.startswith("grpo_lab.distributed") or layer_of(d) >= layer_of(name)
                       for d in deps), (name, deps)


def test_no_computed_grpo_lab_import():
    _, computed = graph()
    found = {a: bs for a, bs in computed.items() if bs}
    assert not found, f"imports of a computed grpo_lab name (write the module's name): {found}"


def test_the_graph_sees_imports_inside_functions(tmp_path):
    """The parser itself: a lazy import, a relative import and an importlib or __import__ call
    are edges, a cycle is found, a computed name is reported."""
    pkg = tmp_path / "grpo_lab"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from grpo_lab.b import g\n")
    (pkg / "b.py").write_text("from .sub import c\n")
    (pkg / "sub" / "c.py").write_text("import grpo_lab.a\n")
    (pkg / "d.py").write_text("import importlib\n\ndef f():\n"
                              "    return importlib.import_module('grpo_lab.e').x\n")
    (pkg / "e.py").write_text("def f(n):\n    __import__('grpo_lab.d')\n"
                              "    return __import__(f'grpo_lab.{n}')\n")
    edges, computed = graph(tmp_path)
    assert edges["grpo_lab.a"] == {"grpo_lab.b"}
    assert edges["grpo_lab.b"] == {"grpo_lab.sub.c"}
    assert edges["grpo_lab.d"] == {"grpo_lab.e"} and edges["grpo_lab.e"] == {"grpo_lab.d"}
    assert computed["grpo_lab.e"] == {"f'grpo_lab.{n}' (line 3)"}
    assert cycles(edges) == [["grpo_lab.a", "grpo_lab.b", "grpo_lab.sub.c"],
                             ["grpo_lab.d", "grpo_lab.e"]]


def test_the_flat_module_names_of_the_first_layout_do_not_exist():
    """The modules live in their folders only (grpo_lab.training.step, not grpo_lab.step)."""
    for old in ("grpo_lab.step", "grpo_lab.trainer", "grpo_lab.widgets", "grpo_lab.claims",
                "grpo_lab.rewards", "grpo_lab.model"):
        assert old not in modules(ROOT)
        with pytest.raises(ModuleNotFoundError, match=f"No module named '{old}'"):
            importlib.import_module(old)
    with pytest.raises(ImportError, match="cannot import name 'trainer' from 'grpo_lab'"):
        from grpo_lab import trainer  # noqa: F401


_LOADED = r"""
import json, sys
import grpo_lab.training.config as C
{build}
print(json.dumps(sorted(m for m in sys.modules if m == "grpo_lab" or m.startswith("grpo_lab."))))
print("numba" in sys.modules, "torch" in sys.modules)
"""


@pytest.mark.parametrize("build, torch_too", [("", False), ("C.TrainConfig()", True)])
def test_the_config_loads_at_most_a_quarter_of_the_package(build, torch_too, capsys):
    """``import grpo_lab.training.config`` loads the registry helpers and the task list (no
    torch); ``TrainConfig()`` checks its own fields and builds its sub-configs and settings
    blocks, while the records it names (objective, exchange, policy, grouper, ...) check it in
    ``check_records``: no step, no exchanges, never numba."""
    r = subprocess.run([sys.executable, "-c", _LOADED.format(build=build)], capture_output=True,
                       text=True, cwd=ROOT, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    loaded, third_party = r.stdout.splitlines()
    loaded = json.loads(loaded)
    with capsys.disabled():
        print(f"\n{build or 'import grpo_lab.training.config'}: {len(loaded)} of "
              f"{len(modules(ROOT))} grpo_lab modules: {loaded}")
    assert 4 * len(loaded) <= len(modules(ROOT)), loaded
    assert "grpo_lab.training.step" not in loaded and "grpo_lab.distributed.exchanges" not in loaded
    assert third_party == f"False {torch_too}", "numba or torch imported: " + third_party


# every module imported on its own, in a fresh interpreter (forked from one that has imported
# torch and numpy, never grpo_lab, so the check stays fast), with the packages of the fast and
# lab extras blocked: the wheel's base install has none of them (pyproject.toml); the numba
# branches of kernels.py and small_gemm.py are imported by tests/test_fastpath.py, test_decoder.py
EXTRAS_BLOCKED = ("numba", "llvmlite", "pandas", "jupyterlab")
_ALONE = r"""
import os, sys, importlib, traceback
import numpy, torch  # noqa: F401  (third-party only: grpo_lab stays unimported here)
for blocked in sys.argv[1].split(","):
    sys.modules[blocked] = None             # import raises ImportError, as where not installed
failed = []
for name in sys.argv[2:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if status:
        failed.append(name)
print("FAILED", failed)
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_every_module_imports_on_its_own():
    names = sorted(modules(ROOT))
    r = subprocess.run([sys.executable, "-c", _ALONE, ",".join(EXTRAS_BLOCKED), *names],
                       capture_output=True, text=True,
                       cwd=ROOT, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "FAILED []" in r.stdout


if __name__ == "__main__":
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    edges, computed = graph(root)
    found, bad = cycles(edges), upward(edges)
    print(f"{root}: {len(edges)} modules, {sum(map(len, edges.values()))} imports "
          f"(importlib.import_module and __import__ included)")
    print(f"cycles: {len(found)} {[f'{len(c)} modules: {c}' for c in found]}")
    print(f"upward imports: {len(bad)}")
    for a, b in bad:
        print(f"  {a} -> {b}")
    print(f"computed grpo_lab imports: {sorted((a, b) for a, bs in computed.items() for b in bs)}")
