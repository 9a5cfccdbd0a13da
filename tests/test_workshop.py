"""`grpo-lab lab --workshop`: fresh exercise copies, earlier work kept, a reset workspace;
the teacher's guide carries a measured timing table that fits a 3-hour session."""
import re
from pathlib import Path

import pytest

from grpo_lab import workshop
from grpo_lab.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_prepare_copies_stubs_and_keeps_earlier_work(tmp_path):
    dest = tmp_path / "ws"
    copies = workshop.prepare(ROOT / "notebooks" / "exercises", dest)
    assert {p.name for p in copies} >= {"advantages.ipynb", "loss.ipynb", "grouping.ipynb",
                                        "compression.ipynb"}
    (dest / "loss.ipynb").write_text("my work")
    workshop.prepare(ROOT / "notebooks" / "exercises", dest)
    assert "YOUR CODE HERE" in (dest / "loss.ipynb").read_text()            # clean again
    kept = list((dest / "previous").glob("*/loss.ipynb"))
    assert len(kept) == 1 and kept[0].read_text() == "my work"            # nothing lost


def test_prepare_names_a_folder_without_exercises(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        workshop.prepare(tmp_path, tmp_path / "ws")


def test_lab_workshop_opens_the_first_exercise_in_a_reset_workspace(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("subprocess.call", lambda cmd, **kw: calls.append(cmd) or 0)
    monkeypatch.setattr(workshop, "prepare", lambda src, dest: [tmp_path / "advantages.ipynb"])
    assert main(["lab", "--workshop"]) == 0
    cmd = calls[0]
    assert cmd[1:3] == ["-m", "jupyterlab"]
    assert any(a.startswith("--ServerApp.root_dir=") and a.endswith("runs/workshop") for a in cmd)
    assert "--LabApp.default_url=/lab/tree/advantages.ipynb?reset" in cmd


def test_workshop_guide_has_a_measured_timing_table_that_fits_three_hours():
    text = (ROOT / "notebooks" / "WORKSHOP.md").read_text()
    block = text.split("<!-- timings:begin")[1].split("<!-- timings:end -->")[0]
    notebooks = sorted(p.relative_to(ROOT / "notebooks").as_posix()
                       for p in [*(ROOT / "notebooks").glob("*.ipynb"),
                                 *(ROOT / "notebooks/exercises/solutions").glob("*.ipynb")])
    for nb in notebooks:
        row = next((line for line in block.splitlines() if f"`{nb}`" in line), None)
        assert row is not None, f"{nb} has no row in the timing table"
        assert "not measured" not in row.split("|")[2], f"{nb}: quick mode not measured"
    total = re.search(r"\*\*total\*\* \| \*\*([\d.]+) (s|min)\*\*", block)
    assert total, block[-500:]
    minutes = float(total.group(1)) / (60 if total.group(2) == "s" else 1)
    assert minutes < 60, f"quick mode of every notebook takes {minutes:.0f} min of a 3-hour class"
    plan = re.findall(r"^\| (\d+):(\d\d)", text, flags=re.M)              # the plan's start times
    assert plan and all(int(h) * 60 + int(m) < 180 for h, m in plan), plan


def _bench():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_notebooks",
                                                  ROOT / "bench" / "bench_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_notebooks_names_an_unknown_notebook():
    with pytest.raises(SystemExit, match="'99_nothing'"):
        _bench().main(["--only", "99_nothing", "--render"])


def test_bench_notebooks_needs_the_guide_markers(monkeypatch, tmp_path):
    bench = _bench()
    monkeypatch.setattr(bench, "GUIDE", tmp_path / "WORKSHOP.md")
    bench.GUIDE.write_text("# no table block\n")
    with pytest.raises(ValueError, match="timings:begin"):
        bench.write_guide("| table |")


def test_every_notebook_fits_its_quick_budget():
    """The guide's promise: each notebook's quick mode within 2 minutes (measured on a shared
    machine; an idle laptop is faster)."""
    runs = __import__("json").loads((ROOT / "bench" / "RESULTS_notebooks.json").read_text())["runs"]
    quick = {k: r for k, r in runs.items() if k.endswith("|quick")}
    assert quick and all(r["status"] == "ok" for r in quick.values()), quick
    slow = {k: r["seconds"] for k, r in quick.items() if r["seconds"] > 120}
    assert not slow, slow
