"""One real-browser check: JupyterLab renders the grouping explorer and it reacts to a control.

JupyterLab starts on 127.0.0.1 with a random free port and token; Debian's ``chromium`` runs
headless under Python Playwright (never ``playwright install``: that downloads a browser).

Choice: the browser opens a tiny notebook written to a temporary folder (import grpo_lab,
display ``grouping_explorer``), not notebooks/02: the widget is what only a browser can check,
the notebook's own cells already run under nbval, and two cells keep this test to a
fraction of a minute and independent of the long training cells.

The browser part runs in a child process (this file run as a script) with an outer timeout
and one retry: a headless run was once seen to hang. Without chromium the test fails when
``CI`` is set (``.ci/run`` installs it) and is skipped otherwise.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
CELLS = [
    "import os\nos.environ['GRPO_LAB_QUICK'] = '1'\n"
    "from grpo_lab.widgets.grouping import grouping_explorer",
    "box, parts = grouping_explorer(n=70)\ndisplay(box)",
]
DRIVER_TIMEOUT_S = 200


def _require_browser() -> str:
    chromium = shutil.which("chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        chromium = None
    if chromium is None:
        msg = ("chromium (Debian package) and the playwright Python package are needed for the "
               "browser test: apt-get install -y chromium; pip install playwright")
        if os.environ.get("CI"):
            pytest.fail(msg + " (CI is set: this check may not be skipped)")
        pytest.skip(msg)
    return chromium


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_notebook(folder: Path) -> str:
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, folder / "explorer.ipynb")
    return "explorer.ipynb"


def _start_lab(folder: Path, port: int, token: str) -> subprocess.Popen:
    settings = folder.parent / "lab-settings"
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" /             # no "Jupyter news?" prompt
     "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    env = {**os.environ, "GRPO_LAB_QUICK": "1", "OMP_NUM_THREADS": "1",
           "JUPYTERLAB_SETTINGS_DIR": str(settings)}
    env.pop("MPLBACKEND", None)          # Agg (set by `make test`) would draw no image
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={folder}",
           "--LabApp.expose_app_in_browser=True",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = open(folder / "jupyter.log", "w")
    lab = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if lab.poll() is not None:
            raise RuntimeError(f"jupyter lab exited: {(folder / 'jupyter.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}",
                                        timeout=2) as r:
                if r.status == 200:
                    return lab
        except OSError:
            time.sleep(0.5)
    _stop(lab)
    raise RuntimeError(f"jupyter lab did not answer on port {port} within 90 s")


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process we started, with its session's children (kernels, browser)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def drive(url: str, chromium: str, shot: str) -> dict:
    """The browser part (run in a child process): run all cells, wait for the widget, change
    the strategy dropdown, report whether the rendered image and summary changed."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.set_default_timeout(90_000)
        page.goto(url)
        page.wait_for_function("() => { const w = window.jupyterapp && "
                               "window.jupyterapp.shell.currentWidget; const k = w && "
                               "w.sessionContext && w.sessionContext.session && "
                               "w.sessionContext.session.kernel; return k && k.status === 'idle'; }")
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_selector(".widget-dropdown select")
        page.wait_for_selector(".widget-slider")
        img = page.locator(".widget-output img").first
        img.wait_for()
        src0 = img.get_attribute("src")
        summary = page.locator(".widget-html-content").first
        text0 = summary.inner_text()
        strategy = page.locator(".widget-dropdown", has_text="strategy").locator("select")
        strategy.select_option("by_prompt")
        page.wait_for_function("(s) => { const i = document.querySelector('.widget-output img');"
                               " return i !== null && i.src !== s; }", arg=src0)
        page.wait_for_timeout(500)
        text1 = summary.inner_text()
        page.screenshot(path=shot, full_page=True)
        src1 = page.locator(".widget-output img").first.get_attribute("src")
        browser.close()
    return {"src_changed": src0 != src1, "text0": text0, "text1": text1,
            "img_bytes": len(src1 or "")}


def test_grouping_explorer_renders_and_reacts_in_a_real_browser(tmp_path):
    chromium = _require_browser()
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "grouping_explorer.png"
    shot.unlink(missing_ok=True)
    folder = tmp_path / "notebooks"
    folder.mkdir()
    name = _write_notebook(folder)
    token, port = secrets.token_hex(16), _free_port()
    lab = _start_lab(folder, port, token)
    errors = []
    try:
        for attempt in (1, 2):                                             # one retry
            driver = subprocess.Popen(
                [sys.executable, __file__, f"http://127.0.0.1:{port}/lab/tree/{name}?token={token}",
                 chromium, str(shot)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True)
            try:
                out, err = driver.communicate(timeout=DRIVER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _stop(driver)
                errors.append(f"attempt {attempt}: no result within {DRIVER_TIMEOUT_S} s")
                continue
            if driver.returncode == 0:
                break
            errors.append(f"attempt {attempt}: exit {driver.returncode}: {err[-3000:]}")
        else:
            pytest.fail("the browser check failed twice:\n" + "\n".join(errors))
    finally:
        _stop(lab)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["src_changed"], result                       # the plot was redrawn
    assert result["text0"] != result["text1"], result          # and the summary changed
    assert "groups" in result["text1"] and result["img_bytes"] > 5_000
    assert shot.stat().st_size > 20_000


if __name__ == "__main__":                                                 # the child process
    print(json.dumps(drive(*sys.argv[1:4])))
