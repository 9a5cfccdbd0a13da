"""One real-browser check: JupyterLab renders the grouping explorer and it reacts to a control.

JupyterLab starts on 127.0.0.1 with a random free port and token; Debian's ``chromium`` runs
headless under Python Playwright (never ``playwright install``: that downloads a browser).

Choice: the browser opens a tiny notebook written to a temporary folder (import grpo_lab,
display ``grouping_explorer``), not notebooks/02: the widget is what only a browser can check,
the notebook's own cells already run under nbval, and two cells keep this test to a
fraction of a minute and independent of the long training cells.

Two more checks run on the checkout itself (one JupyterLab for both, root = the repository):
one exercise notebook is opened and run, and the check's verdict must be rendered (the stub's
failed verdict with its hint); then every notebooks/*.ipynb runs in quick mode from the UI
("Run All"), and the test fails on an error output, a traceback in a widget's output, a figure
shown as text (``<Figure size``), a widget shown as text or not rendered, or a broken image.
The run-all logic follows ../shared/tools/lab_screens.py (our tool): windowing off so every cell
is in the DOM, autosave off and checkpoints in a temporary folder so the checkout is untouched.

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
    "from grpo_lab.teaching.widgets.grouping import grouping_explorer",
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
    return _start_and_wait(cmd, env, folder, port, token)


def _start_and_wait(cmd, env, folder: Path, port: int, token: str, cwd=None) -> subprocess.Popen:
    """Start JupyterLab (log in folder/jupyter.log) and wait up to 90 s for its API to answer."""
    log = open(folder / "jupyter.log", "w")
    lab = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
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
    try:
        result = _drive([f"http://127.0.0.1:{port}/lab/tree/{name}?token={token}", chromium,
                         str(shot)], DRIVER_TIMEOUT_S)
    finally:
        _stop(lab)
    assert result["src_changed"], result                       # the plot was redrawn
    assert result["text0"] != result["text1"], result          # and the summary changed
    assert "groups" in result["text1"] and result["img_bytes"] > 5_000
    assert shot.stat().st_size > 20_000




# ---------------------------------------------------------------- the checkout's notebooks
LAB_SETTINGS = {  # user settings for the checkout's JupyterLab (as lab_screens.py sets them)
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none",
                                               "autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},  # never save outputs
}
NOTEBOOK_TIMEOUT_S = 300          # open + run one notebook
WIDGET_TEXT = ("VBox(", "HBox(", "IntSlider(", "FloatSlider(", "Dropdown(", "Output(",
               "FloatProgress(", "Error displaying widget")
JS_HELPERS = r"""
window.__nb = {
  panel(p) { const app = window.jupyterapp; if (!app || !app.shell) return null;
    for (const w of app.shell.widgets('main')) if (w.context && w.context.path === p) return w;
    return null; },
  kernel(p) { const w = this.panel(p); const s = w && w.sessionContext.session;
    return s && s.kernel ? s.kernel.status : 'starting'; },
  pending(p) { const w = this.panel(p); if (!w) return -1;
    return [...w.node.querySelectorAll('.jp-InputPrompt')]
      .filter(e => e.textContent.includes('*')).length; },
  acceptDialogs() { const b = document.querySelector('.jp-Dialog .jp-mod-accept');
    if (b) { b.click(); return true; } return false; },
  runAll(p) { const w = this.panel(p); this.done = false; this.runErr = null;
    window.jupyterapp.shell.activateById(w.id);
    window.jupyterapp.commands.execute('notebook:run-all-cells')
      .then(() => { this.done = true; }, e => { this.runErr = String(e); this.done = true; }); },
  stats(p) {
    const w = this.panel(p), n = w.node, cells = w.content.model.cells, errors = [];
    let code = 0, executed = 0, widgetViews = 0;
    for (let i = 0; i < cells.length; i++) { const c = cells.get(i); if (c.type !== 'code') continue;
      code++; if (c.executionCount != null) executed++;
      for (let j = 0; j < c.outputs.length; j++) { const o = c.outputs.get(j).toJSON();
        if (o.output_type === 'error') errors.push({cell: i, ename: o.ename,
                                                    evalue: String(o.evalue).slice(0, 300)});
        if (o.data && o.data['application/vnd.jupyter.widget-view+json']) widgetViews++; } }
    const outs = [...n.querySelectorAll('.jp-OutputArea-output')];
    const imgs = [...n.querySelectorAll('.jp-OutputArea-output img')];
    const stderr = [...n.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')];
    return { code_cells: code, executed, errors, widget_views: widgetViews,
      widgets_rendered: n.querySelectorAll('.jp-OutputArea-output > .jupyter-widgets').length,
      images: imgs.length, images_broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length,
      tracebacks: stderr.map(e => e.innerText).filter(t => t.includes('Traceback'))
                        .map(t => t.slice(0, 500)),
      texts: outs.map(o => o.innerText.slice(0, 2000)) };
  },
};
"""


def _start_checkout_lab(tmp: Path, port: int, token: str) -> subprocess.Popen:
    """JupyterLab with root = the repository (notebooks find data/ as under nbval)."""
    for name, values in LAB_SETTINGS.items():
        f = tmp / "settings" / f"{name}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    env = {**os.environ, "GRPO_LAB_QUICK": "1", "JUPYTER_DATA_DIR": str(tmp / "data"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    env.pop("MPLBACKEND", None)                         # Agg (set by `make test`) draws no image
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
           f"--LabApp.user_settings_dir={tmp / 'settings'}",
           f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
           f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    return _start_and_wait(cmd, env, tmp, port, token, cwd=ROOT)


def run_notebooks(base: str, token: str, chromium: str, out: str, *paths: str) -> list:
    """The browser part (run in a child process): open each notebook in a fresh workspace,
    Run All, wait until the kernel is idle with no [*] left, and read what was rendered."""
    from playwright.sync_api import sync_playwright

    results = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        for i, path in enumerate(paths):
            t0, deadline = time.time(), time.time() + NOTEBOOK_TIMEOUT_S
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.add_init_script(JS_HELPERS)
            res = {"notebook": path, "status": "ok", "page_errors": []}
            page.on("pageerror", lambda e: res["page_errors"].append(str(e)[:300]))

            def wait(cond):
                stable = 0
                while time.time() < deadline:
                    page.evaluate("__nb.acceptDialogs()")
                    stable = stable + 1 if page.evaluate(cond, path) else 0
                    if stable >= 3:                             # true on three polls in a row
                        return True
                    time.sleep(0.5)
                return False

            page.goto(f"{base}/lab/workspaces/nb{os.getpid()}-{i}/tree/{path}?token={token}",
                      timeout=60_000)                           # a fresh workspace each
            if not wait("p => __nb.kernel(p) === 'idle'"):
                res["status"] = "kernel did not start"
            else:
                page.evaluate("p => __nb.runAll(p)", path)
                if not wait("p => __nb.done && __nb.kernel(p) === 'idle' && __nb.pending(p) === 0"):
                    res["status"] = f"not finished within {NOTEBOOK_TIMEOUT_S} s"
                page.wait_for_timeout(1500)                     # late widget / image renders
                res.update(page.evaluate("p => __nb.stats(p)", path))
                page.screenshot(path=str(Path(out) / (Path(path).stem + ".png")), full_page=True)
                page.evaluate("p => __nb.panel(p).sessionContext.shutdown()", path)
            res["seconds"] = round(time.time() - t0, 1)
            page.close()
            results.append(res)
        browser.close()
    return results


def problems(res: dict) -> list[str]:
    """What a room must never see in a notebook run in JupyterLab."""
    out = [] if res["status"] == "ok" else [res["status"]]
    texts = res.get("texts", [])
    out += [f"error in cell {e['cell']}: {e['ename']}: {e['evalue']}" for e in res.get("errors", [])]
    out += [f"traceback in an output: {t[:300]}" for t in res.get("tracebacks", [])]
    out += [f"figure shown as text: {t[:120]!r}" for t in texts if "<Figure size" in t]
    out += [f"widget shown as text: {t[:120]!r}" for t in texts
            if any(t.lstrip().startswith(w) for w in WIDGET_TEXT)]
    if res.get("widgets_rendered", 0) < res.get("widget_views", 0):
        out.append(f"{res['widget_views']} widget outputs but {res['widgets_rendered']} rendered")
    if res.get("images_broken"):
        out.append(f"{res['images_broken']} broken images")
    if res.get("executed", 0) < res.get("code_cells", 0):
        out.append(f"only {res['executed']} of {res['code_cells']} code cells ran")
    return out


def test_problems_catch_what_a_room_must_not_see():
    """The verdict of the run-all test, without a browser: each defect is named."""
    clean = {"status": "ok", "errors": [], "tracebacks": [], "widget_views": 2,
             "widgets_rendered": 2, "images_broken": 0, "executed": 5, "code_cells": 5,
             "texts": ["a table", "PASS check_advantages: ..."]}
    assert problems(clean) == []
    bad = {**clean, "texts": ["<Figure size 1200x600 with 6 Axes>", "VBox(children=(...))"],
           "widgets_rendered": 1, "errors": [{"cell": 3, "ename": "ValueError", "evalue": "x"}]}
    found = " | ".join(problems(bad))
    for what in ("figure shown as text", "widget shown as text", "2 widget outputs but 1 rendered",
                 "error in cell 3: ValueError"):
        assert what in found, found


@pytest.fixture(scope="module")
def checkout_lab(tmp_path_factory):
    chromium = _require_browser()
    tmp = tmp_path_factory.mktemp("checkout-lab")
    token, port = secrets.token_hex(16), _free_port()
    lab = _start_checkout_lab(tmp, port, token)
    ARTIFACTS.mkdir(exist_ok=True)
    yield f"http://127.0.0.1:{port}", token, chromium
    _stop(lab)


def _drive(args: list[str], timeout: float):
    """Run this file as the browser driver with ``args`` (one retry: a run was once seen to
    hang) -> the JSON of its last output line."""
    errors = []
    for attempt in (1, 2):
        driver = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = driver.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(driver)
            errors.append(f"attempt {attempt}: no result within {timeout:.0f} s")
            continue
        if driver.returncode == 0:
            return json.loads(out.strip().splitlines()[-1])
        errors.append(f"attempt {attempt}: exit {driver.returncode}: {err[-3000:]}")
    pytest.fail("the browser run failed twice:\n" + "\n".join(errors))


def _drive_notebooks(lab, paths: list[str], timeout: float) -> list[dict]:
    base, token, chromium = lab
    return _drive(["notebooks", base, token, chromium, str(ARTIFACTS), *paths], timeout)


def test_an_exercise_shows_its_verdict_in_jupyterlab(checkout_lab):
    (res,) = _drive_notebooks(checkout_lab, ["notebooks/exercises/advantages.ipynb"], 200)
    assert not problems(res), problems(res)
    verdict = [t for t in res["texts"] if "check_advantages" in t]
    assert verdict, res["texts"]                                    # the verdict is rendered
    assert "FAIL" in verdict[0] and "hint: not written yet" in verdict[0], verdict  # the stub fails


NOTEBOOKS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_every_notebook_runs_clean_in_jupyterlab(checkout_lab):
    results = _drive_notebooks(checkout_lab, NOTEBOOKS, NOTEBOOK_TIMEOUT_S * len(NOTEBOOKS))
    (ARTIFACTS / "notebooks_in_lab.json").write_text(json.dumps(results, indent=1))
    found = {r["notebook"]: problems(r) for r in results}
    assert [r["notebook"] for r in results] == NOTEBOOKS
    assert not any(found.values()), {k: v for k, v in found.items() if v}
    for r in results:                                 # every notebook draws something visible
        assert r["images"] > 0, r["notebook"]


if __name__ == "__main__":                                                 # the child process
    if sys.argv[1] == "notebooks":
        print(json.dumps(run_notebooks(*sys.argv[2:6], *sys.argv[6:])))
    else:
        print(json.dumps(drive(*sys.argv[1:4])))
