"""`grpo-lab lab --workshop`: fresh exercise copies, earlier work kept, a reset workspace;
the teacher's guide carries a measured timing table that fits a 3-hour session."""
import contextlib
import os
import re
import sys
from pathlib import Path

import pytest

from grpo_lab.teaching import workshop
from grpo_lab.cli import main
from scripts import load_script

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
    assert [p.name for p in (dest / "previous").glob("*/*")] == ["loss.ipynb"]   # only it moved


def test_an_untouched_copy_is_reused_and_reopen_keeps_the_learners_work(tmp_path):
    import json
    src = ROOT / "notebooks" / "exercises"
    dest = tmp_path / "ws"
    copies = workshop.prepare(src, dest)
    stamp = {p.name: p.stat().st_mtime_ns for p in copies}
    adv = json.loads((dest / "advantages.ipynb").read_text())
    adv["metadata"]["widgets"] = {"saved by": "JupyterLab"}                # a save, no edit
    (dest / "advantages.ipynb").write_text(json.dumps(adv))
    assert workshop.untouched(dest / "advantages.ipynb", src / "advantages.ipynb")
    workshop.prepare(src, dest)
    assert not (dest / "previous").exists()                                # nothing to move
    assert {p.name: p.stat().st_mtime_ns for p in copies if p.name != "advantages.ipynb"} == \
        {k: v for k, v in stamp.items() if k != "advantages.ipynb"}        # reused, not recopied
    assert "saved by" in (dest / "advantages.ipynb").read_text()
    loss = json.loads((dest / "loss.ipynb").read_text())
    code = next(c for c in loss["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["ran\n"]}]
    (dest / "loss.ipynb").write_text(json.dumps(loss))                   # a cell run: touched
    assert not workshop.untouched(dest / "loss.ipynb", src / "loss.ipynb")
    (dest / "grouping.ipynb").unlink()                                    # a lost copy
    workshop.prepare(src, dest, reopen=True)
    assert not (dest / "previous").exists() and '"ran' in (dest / "loss.ipynb").read_text()
    assert (dest / "grouping.ipynb").read_bytes() == (src / "grouping.ipynb").read_bytes()
    (dest / "mine.ipynb").write_text("not a stub")
    workshop.prepare(src, dest)
    moved = sorted(p.name for p in (dest / "previous").glob("*/*"))
    assert moved == ["loss.ipynb", "mine.ipynb"] and not (dest / "mine.ipynb").exists()
    assert (dest / "loss.ipynb").read_bytes() == (src / "loss.ipynb").read_bytes()


def test_reopen_needs_workshop(capsys):
    assert main(["lab", "--reopen"]) == 2
    assert "--reopen only applies with --workshop" in capsys.readouterr().err


def test_prepare_names_a_folder_without_exercises(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        workshop.prepare(tmp_path, tmp_path / "ws")


def test_lab_workshop_opens_the_first_exercise_in_a_reset_workspace(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("subprocess.call", lambda cmd, **kw: calls.append(cmd) or 0)
    monkeypatch.setattr(workshop, "prepare",
                        lambda src, dest, reopen: [tmp_path / "advantages.ipynb"])
    assert main(["lab", "--workshop"]) == 0
    cmd = calls[0]
    assert cmd[1:3] == ["-m", "jupyterlab"]
    root = next(a.split("=", 1)[1] for a in cmd if a.startswith("--ServerApp.root_dir="))
    assert root.endswith("runs/workshop")
    assert "--LabApp.default_url=/lab/tree/advantages.ipynb" in cmd   # no query: see below
    assert f"--LabApp.workspaces_dir={Path(root) / '.workspaces'}" in cmd
    assert "--allow-root" not in cmd


def test_lab_workshop_empties_the_workspace_folder_of_the_last_session(tmp_path):
    """The reset: JupyterLab keeps the open tabs of a session in its workspaces folder; the
    workshop's is DIR/.workspaces, and a new start empties it (the stubs stay the only files)."""
    dest = tmp_path / "room"
    (dest / ".workspaces").mkdir(parents=True)
    (dest / ".workspaces" / "default-37a8.jupyterlab-workspace").write_text("{}")
    cmd = workshop.lab_command(ROOT / "notebooks", dest)
    assert not (dest / ".workspaces").exists()
    assert f"--LabApp.workspaces_dir={dest.resolve() / '.workspaces'}" in cmd
    assert not [a for a in cmd if a.startswith("--LabApp.default_url=") and "?" in a]


@pytest.mark.parametrize("argv", [["lab", "--allow-root"],
                                  ["lab", "--workshop", "{tmp}", "--allow-root"]])
def test_lab_allow_root_is_passed_to_jupyter(monkeypatch, tmp_path, argv):
    calls = []
    monkeypatch.setattr("subprocess.call", lambda cmd, **kw: calls.append(cmd) or 0)
    assert main([a.format(tmp=tmp_path / "room") for a in argv]) == 0
    assert calls[0][1:3] == ["-m", "jupyterlab"] and calls[0].count("--allow-root") == 1


def test_workshop_copy_has_the_stubs_only_no_solution_code(tmp_path):
    """The learners' folder holds the stubs and nothing else: no solutions/ folder, no file
    whose code carries a solution block (the lines between BEGIN/END SOLUTION)."""
    import nbformat
    dest = tmp_path / "learner"
    workshop.lab_command(ROOT / "notebooks", dest)
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    stubs = sorted(p.name for p in (ROOT / "notebooks/exercises").glob("*.ipynb"))
    assert files == stubs
    for sol in (ROOT / "notebooks/exercises/solutions").glob("*.ipynb"):
        code = [c.source for c in nbformat.read(sol, as_version=4).cells if c.cell_type == "code"]
        hidden = [line.strip() for src in code for block in src.split("### BEGIN SOLUTION")[1:]
                  for line in block.split("### END SOLUTION")[0].splitlines() if line.strip()]
        assert hidden, sol.name
        copy = (dest / sol.name).read_text()
        leaked = [line for line in hidden if len(line) > 12 and line in copy]
        assert not leaked, (sol.name, leaked)


def test_lab_workshop_dir_roots_jupyterlab_there_in_quick_mode(monkeypatch, tmp_path):
    calls = []
    monkeypatch.delenv("GRPO_LAB_QUICK", raising=False)
    monkeypatch.setattr("subprocess.call", lambda cmd, **kw: calls.append((cmd, kw)) or 0)
    assert main(["lab", "--workshop", str(tmp_path / "room")]) == 0
    cmd, kw = calls[0]
    assert f"--ServerApp.root_dir={(tmp_path / 'room').resolve()}" in cmd
    assert (tmp_path / "room" / "loss.ipynb").exists()
    assert kw["env"]["GRPO_LAB_QUICK"] == "1"


@pytest.mark.parametrize("argv, environ, quick", [
    (["lab"], {}, "1"), (["lab", "--full"], {}, "0"), (["lab"], {"GRPO_LAB_QUICK": "0"}, "0"),
    (["lab", "--full"], {"GRPO_LAB_QUICK": "1"}, "0")])
def test_lab_turns_quick_mode_on_unless_told_otherwise(monkeypatch, argv, environ, quick):
    calls = []
    monkeypatch.delenv("GRPO_LAB_QUICK", raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("subprocess.call", lambda cmd, **kw: calls.append((cmd, kw)) or 0)
    assert main(argv) == 0
    cmd, kw = calls[0]
    assert cmd[1:3] == ["-m", "jupyterlab"] and kw["env"]["GRPO_LAB_QUICK"] == quick


def test_make_lab_goes_through_grpo_lab_lab():
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("\nlab:")[1].split("\n\n")[0]
    assert "grpo-lab lab" in recipe and "jupyter lab" not in recipe


def test_preflight_passes_here_and_times_the_lesson_steps(tmp_path):
    checks = workshop.preflight(tmp_path, steps=3)
    names = [name for name, _, _ in checks]
    assert names == ["python", "disk", "torch", "packages", "GRPO steps"]
    ok, text = workshop.preflight_report(checks)
    steps = checks[-1][2]
    assert steps.startswith("3 steps of the toy policy") and f"({workshop.LESSON_STEPS} steps)" in steps
    assert ok == all(o for _, o, _ in checks) and text.splitlines()[-1] == (
        "OK: ready for the workshop" if ok else text.splitlines()[-1])
    assert checks[0][1] and checks[2][1] and checks[3][1], text     # this venv has everything


def test_preflight_says_what_is_wrong(monkeypatch, tmp_path):
    import shutil
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 * 2**30, 10 * 2**30 - 2**28, 2**28))
    monkeypatch.setattr(workshop, "MIN_PYTHON", (99, 0))
    monkeypatch.setattr(workshop, "PACKAGES", ("numpy", "no_such_package_xyz"))
    monkeypatch.setattr(workshop, "_timed_steps", lambda steps: ("GRPO steps", True, "fast"))
    checks = workshop.preflight(tmp_path)
    ok, text = workshop.preflight_report(checks)
    assert not ok
    assert "0.2 GB free" in text and "needs >= 99.0" in text
    assert "missing: no_such_package_xyz (ModuleNotFoundError)" in text
    assert text.splitlines()[-1] == "NOT READY: python, disk, packages (see above; " \
        "notebooks/WORKSHOP.md, 'Set-up')"


def test_without_the_lab_extra_lab_and_preflight_name_it(monkeypatch, capsys, tmp_path):
    """The wheel's base install has no JupyterLab and no pandas (the lab extra, pyproject.toml):
    grpo-lab lab stops before starting anything, preflight names the extra."""
    import subprocess
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    monkeypatch.setitem(sys.modules, "jupyterlab", None)         # import fails, as not installed
    monkeypatch.setitem(sys.modules, "pandas", None)
    assert main(["lab"]) == 2 and main(["lab", "--workshop", str(tmp_path / "w")]) == 2
    assert calls == [] and not (tmp_path / "w").exists()
    err = capsys.readouterr().err
    assert err.count("JupyterLab is not installed (grpo-lab lab runs it): they are the lab extra: "
                     "pip install jupyterlab pandas, or pip install "
                     '"grpo_lab-<version>-py3-none-any.whl[lab]" with the wheel, or pip install '
                     '-e ".[lab]" in a checkout') == 2, err
    monkeypatch.setattr(workshop, "PACKAGES", ("numpy", "pandas"))
    monkeypatch.setattr(workshop, "_timed_steps", lambda steps: ("GRPO steps", True, "fast"))
    ok, text = workshop.preflight_report(workshop.preflight(tmp_path))
    assert not ok and "missing: pandas (ModuleNotFoundError); they are the lab extra: " in text
    monkeypatch.setattr(workshop, "PACKAGES", ("numpy", "no_such_package_xyz"))
    ok, text = workshop.preflight_report(workshop.preflight(tmp_path))
    assert "missing: no_such_package_xyz (ModuleNotFoundError)\n" in text + "\n"   # no hint


def test_preflight_cli_exit_code_follows_the_verdict(monkeypatch, capsys):
    monkeypatch.setattr(workshop, "preflight", lambda where, steps, probe: [
        ("python", True, "3.11"), ("disk", False, "0.1 GB")])
    assert main(["preflight"]) == 1
    assert "NOT READY: disk" in capsys.readouterr().out
    monkeypatch.setattr(workshop, "preflight",
                        lambda where, steps, probe: [("python", True, "3.11")])
    assert main(["preflight"]) == 0
    assert main(["preflight", "--steps", "0"]) == 2


def test_preflight_refuses_an_unknown_probe_preset_before_any_check(monkeypatch, capsys):
    """`preflight --probe nope` ran every check (20 timed steps) before naming the preset."""
    def ran(*args, **kwargs):
        raise AssertionError("the checks ran")
    monkeypatch.setattr(workshop, "preflight", ran)
    with pytest.raises(SystemExit) as stop:
        main(["preflight", "--probe", "nope"])
    assert stop.value.code == 2
    assert "argument --probe: invalid choice: 'nope'" in capsys.readouterr().err


def test_preflight_constants_follow_the_project():
    import nbformat
    spec = re.search(r'requires-python = ">=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert tuple(map(int, spec.groups())) == workshop.MIN_PYTHON
    code = "\n".join(c.source for c in nbformat.read(ROOT / "notebooks/00_quickstart.ipynb",
                                                     as_version=4).cells)
    assert f"steps={workshop.LESSON_STEPS}," in code     # the lesson the timing stands for


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
    mod = load_script("bench/bench_notebooks.py")
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


def test_the_printed_workshop_address_logs_in(tmp_path):
    """`grpo-lab lab --workshop DIR --allow-root` for real: the server (127.0.0.1, a free port,
    no browser: set through a Jupyter config folder, so the command line is the learner's own)
    prints an address; fetched as it is, without following redirects, it returns the lab page
    on the first exercise (200), not a redirect to /login. The address the old command printed
    (`?reset?token=...`, a second "?") is checked to be refused, so the check can fail."""
    import json
    import signal
    import socket
    import subprocess
    import threading
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "jupyter-config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(json.dumps({"ServerApp": {
        "ip": "127.0.0.1", "port": port, "port_retries": 0, "open_browser": False}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JUPYTER_CONFIG_DIR": str(config),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    room = tmp_path / "room"
    proc = subprocess.Popen([sys.executable, "-m", "grpo_lab.cli", "lab", "--workshop", str(room),
                             "--allow-root"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None                                  # a 3xx becomes an HTTPError

    fetch = urllib.request.build_opener(NoRedirect).open
    pattern = re.compile(rf"http://127\.0\.0\.1:{port}/\S+")
    try:
        deadline, url = time.monotonic() + 180, None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            found = [m.group(0) for line in list(lines) for m in [pattern.search(line)] if m]
            url = found[0] if found else None
            time.sleep(0.5)
        assert url, "no address printed:\n" + "".join(lines)[-3000:]
        assert url.startswith(f"http://127.0.0.1:{port}/lab/tree/advantages.ipynb?token=")
        with fetch(url, timeout=60) as page:
            assert page.status == 200 and page.url == url
            assert '"treePath": "advantages.ipynb"' in page.read().decode()
        with pytest.raises(urllib.error.HTTPError) as old:
            fetch(url.replace("?token=", "?reset?token="), timeout=60)
        assert old.value.code == 302 and "/login" in old.value.headers["Location"]
        assert "GRPO_LAB_QUICK=1" in "".join(lines)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)              # the CLI and the server it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
