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

Time: a slow machine alone never fails the run. A notebook fails as hung only when nothing
advances for ``STALL_S`` (900 s, nbval's ``--nbval-cell-timeout`` for the other notebooks): no
cell finishing, no new output and no output text changing (a progress bar counts) and the kernel
not changing state. The whole run-all of the lessons has one generous ceiling, ``CEILING_S``
(45 min, 8 times what it takes on an idle 2-core machine, inside CI's 90), for a run that keeps
advancing forever.

Each lesson the run-all executed is saved, outputs included, to ``runs/executed/`` (read from
the page's notebook model: nothing is saved into the checkout's notebooks), and ``make docs``
renders those copies instead of running the lessons again (docs/build.py).

The browser part runs in a child process (this file run as a script) that prints a heartbeat
line whenever a notebook advances; the parent ends it as hung after ``STALL_S`` without one (and
retries once: a headless run was once seen to hang). Without chromium the test fails when
``CI`` is set (``.ci/run`` installs it) and is skipped otherwise.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import secrets
import selectors
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
EXECUTED = ROOT / "runs" / "executed"       # the lessons as run here, for make docs
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
                         str(shot)], DRIVER_TIMEOUT_S, 3 * DRIVER_TIMEOUT_S)
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
STALL_S = 900             # a notebook is hung when nothing advances this long (see the docstring)
CEILING_S = 45 * 60       # the whole run-all of every lesson, however steadily it advances
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
  progress(p) { const w = this.panel(p); if (!w) return 'no panel';
    const cells = w.content.model.cells; let ran = 0, counts = 0, outs = 0;
    for (let i = 0; i < cells.length; i++) { const c = cells.get(i);
      if (c.type !== 'code') continue;
      if (c.executionCount != null) { ran++; counts += c.executionCount; }
      outs += c.outputs.length; }
    const text = [...w.node.querySelectorAll('.jp-OutputArea')]
      .reduce((n, e) => n + e.textContent.length, 0);
    return JSON.stringify([ran, counts, outs, text, this.kernel(p)]); },
  notebook(p) { return this.panel(p).content.model.toJSON(); },
  exec(p, code) { const k = this.panel(p).sessionContext.session.kernel; let out = '';
    return new Promise(resolve => {
      const f = k.requestExecute({code, silent: false, store_history: false});
      f.onIOPub = m => { const t = m.header.msg_type;
        if (t === 'stream') out += m.content.text;
        if (t === 'error') out += 'ERROR ' + m.content.ename + ': ' + m.content.evalue + '\n'; };
      f.done.then(() => resolve(out), e => resolve(out + 'ERROR ' + String(e) + '\n')); }); },
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


def run_notebooks(base: str, token: str, chromium: str, out: str, executed: str,
                  *paths: str) -> list:
    """The browser part (run in a child process): open each notebook in a fresh workspace,
    Run All, wait until the kernel is idle with no [*] left, read what was rendered, and save
    the executed lessons to ``executed``. A heartbeat line goes to stdout whenever the notebook
    advances; a notebook is hung after STALL_S without advancing; the run stops CEILING_S after
    the first notebook started (the rest reported as not run)."""
    from playwright.sync_api import sync_playwright

    results, start = [], time.time()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        for i, path in enumerate(paths):
            if time.time() - start > CEILING_S:
                results.append({"notebook": path, "status": f"not run: the run-all of the "
                                f"notebooks passed its {CEILING_S // 60} min ceiling"})
                continue
            t0 = time.time()
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.add_init_script(JS_HELPERS)
            res = {"notebook": path, "status": "ok", "page_errors": []}
            page.on("pageerror", lambda e: res["page_errors"].append(str(e)[:300]))

            def wait(cond) -> str | None:
                """None once cond holds on three polls in a row; else why not (hang, ceiling)."""
                stable, last, advanced = 0, None, time.time()
                while True:
                    page.evaluate("__nb.acceptDialogs()")
                    stable = stable + 1 if page.evaluate(cond, path) else 0
                    if stable >= 3:                             # true on three polls in a row
                        return None
                    now, sig = time.time(), page.evaluate("p => __nb.progress(p)", path)
                    if sig != last:
                        last, advanced = sig, now
                        print(f"progress {path} {sig}", flush=True)      # the parent's heartbeat
                    if now - advanced > STALL_S:
                        return f"hung: nothing advanced for {STALL_S} s (progress {last})"
                    if now - start > CEILING_S:
                        return f"not finished within the {CEILING_S // 60} min ceiling"
                    time.sleep(0.5)

            page.goto(f"{base}/lab/workspaces/nb{os.getpid()}-{i}/tree/{path}?token={token}",
                      timeout=120_000)                          # a fresh workspace each
            why = wait("p => __nb.kernel(p) === 'idle'")
            if why:
                res["status"] = f"kernel did not start ({why})"
            else:
                page.evaluate("p => __nb.runAll(p)", path)
                why = wait("p => __nb.done && __nb.kernel(p) === 'idle' && __nb.pending(p) === 0")
                if why:
                    res["status"] = why
                page.wait_for_timeout(1500)                     # late widget / image renders
                res.update(page.evaluate("p => __nb.stats(p)", path))
                page.screenshot(path=str(Path(out) / (Path(path).stem + ".png")), full_page=True)
                nb = page.evaluate("p => __nb.notebook(p)", path)
                said = page.evaluate("([p, c]) => __nb.exec(p, c)",
                                     [path, kernel_probe(explorers_shown(nb))])
                res["explorers_moved"], state = read_probe(said)
                if res["explorers_moved"] is None:
                    res["explorers_moved"] = {"probe": said[-500:]}
                if state:
                    nb.setdefault("metadata", {})["widgets"] = {WIDGET_STATE: state}
                if executed and re.fullmatch(r"notebooks/\d\d_[^/]+\.ipynb", path):
                    save_executed(nb, Path(executed) / Path(path).name)
                page.evaluate("p => __nb.panel(p).sessionContext.shutdown()", path)
            res["seconds"] = round(time.time() - t0, 1)
            page.close()
            results.append(res)
        browser.close()
    return results


EXPLORER_CALL = re.compile(r"^(\w+), \w+ = (\w+_explorer\(.*\))$", re.M)
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def explorers_shown(nb: dict) -> list[tuple[int, str, str]]:
    """The explorers a notebook displays: (cell, the displayed box's model id, the call that
    built it) for each cell ``box, parts = NAME_explorer(ARGS)`` ... ``display(box)``."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        m = EXPLORER_CALL.search(src) if cell["cell_type"] == "code" else None
        views = [o["data"][WIDGET_MIME]["model_id"] for o in cell.get("outputs", [])
                 if WIDGET_MIME in o.get("data", {})]
        if m and f"display({m.group(1)})" in src and views:
            found.append((i, views[0], m.group(2)))
    return found


def kernel_probe(explorers) -> str:
    """Python run in the notebook's kernel after Run All. It prints ``EXPLORERS {cell: [[left,
    fresh], ...]}``: each displayed explorer's controls and read-outs (every value widget in it,
    in display order) that differ from a fresh instance built by the same call, i.e. what the
    notebook's own cells moved behind the learner's back; and ``WIDGET_STATE {...}``: every
    widget's state as JupyterLab would save it in the notebook (the site shows the explorers'
    figures and the progress bars' last lines from it)."""
    rows = ", ".join(f"({cell}, {mid!r}, lambda: {call})" for cell, mid, call in explorers)
    return f"""import json as _json
import ipywidgets as _w
from ipywidgets.widgets.widget import _instances as _live
def _values(w):
    out = [[type(w).__name__, getattr(w, "description", ""), w.value]] if isinstance(w, _w.ValueWidget) else []
    for c in getattr(w, "children", ()):
        out += _values(c)
    return out
def _widgets(w):
    return [w] + [x for c in getattr(w, "children", ()) for x in _widgets(c)]
def _snap(left, fresh):
    # the page's slider writes back its value on its own grid (a FloatLogSlider at 0.05 with
    # step 0.1 shows 10**-1.3 = 0.0501): give the fresh copy the same snapped value
    import math as _m
    for a, b in zip(_widgets(left), _widgets(fresh)):
        if isinstance(a, _w.FloatLogSlider) and isinstance(b, _w.FloatLogSlider) and a.value != b.value:
            if abs(_m.log(a.value, a.base) - _m.log(b.value, b.base)) <= a.step:
                b.value = a.value
        elif isinstance(a, _w.FloatSlider) and isinstance(b, _w.FloatSlider) and a.value != b.value:
            if abs(a.value - b.value) <= a.step:
                b.value = a.value
    return fresh
_moved = {{}}
for _cell, _id, _make in [{rows}]:
    try:
        _left, _fresh = _values(_live[_id]), _values(_snap(_live[_id], _make()[0]))
        if _left != _fresh:
            _moved[_cell] = [[a, b] for a, b in zip(_left, _fresh) if a != b] or ["controls differ"]
    except Exception as _e:
        _moved[_cell] = [f"{{type(_e).__name__}}: {{_e}}"]
print("EXPLORERS " + _json.dumps(_moved, default=str))
print("WIDGET_STATE " + _json.dumps(_w.Widget.get_manager_state(drop_defaults=False), default=str))
"""


def read_probe(out: str) -> tuple[dict | None, dict | None]:
    """The kernel probe's printout -> (explorers moved, widget state); None where it is absent."""
    found = {k: None for k in ("EXPLORERS", "WIDGET_STATE")}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        if key in found:
            found[key] = json.loads(rest)
    return found["EXPLORERS"], found["WIDGET_STATE"]


def save_executed(nb: dict, dest: Path) -> None:
    """Write a notebook as JupyterLab's model holds it (outputs included), atomically, in valid
    nbformat: the model gives markdown cells ``attachments: null`` and a 4.4 notebook's cells ids,
    which the schema refuses."""
    import nbformat
    for cell in nb["cells"]:
        if cell.get("attachments", {}) is None:
            del cell["attachments"]
        if nb.get("nbformat_minor", 5) < 5:
            cell.pop("id", None)
    nbformat.validate(nbformat.from_dict(nb))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, dest)


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
    out += [f"explorer of cell {cell} left as the learner did not choose: {str(moved)[:300]}"
            for cell, moved in (res.get("explorers_moved") or {}).items()]
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
    moved = {**clean, "explorers_moved": {"13": [[["FloatSlider", "r1", 1.0],
                                                  ["FloatSlider", "r1", 0.0]]]}}
    assert problems(moved) == ["explorer of cell 13 left as the learner did not choose: "
                               "[[['FloatSlider', 'r1', 1.0], ['FloatSlider', 'r1', 0.0]]]"]


def test_the_kernel_probe_finds_an_explorer_moved_by_a_later_cell():
    """What the probe runs after Run All, here in this process: the notebook 01 pattern (the
    displayed explorer driven by a later cell) is found; a second copy driven instead is not."""
    from grpo_lab.teaching.widgets.advantage import advantage_explorer
    box, parts = advantage_explorer()
    cell = {"cell_type": "code", "source": "box, parts = advantage_explorer()\ndisplay(box)",
            "outputs": [{"output_type": "display_data",
                         "data": {WIDGET_MIME: {"model_id": box.model_id}}}]}
    nb = {"cells": [{"cell_type": "markdown", "source": "# t"}, cell]}
    shown = explorers_shown(nb)
    assert shown == [(1, box.model_id, "advantage_explorer()")]
    code = kernel_probe(shown)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {"advantage_explorer": advantage_explorer})
    moved, state = read_probe(out.getvalue())
    assert moved == {} and box.model_id in state["state"]
    _, probe = advantage_explorer()
    probe["reward_1"].value = 1.0                                   # a second copy: fine
    parts["estimator"].value = "rloo"                               # the learner's: not
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {"advantage_explorer": advantage_explorer})
    moved, _ = read_probe(out.getvalue())
    assert list(moved) == ["1"] and ["Dropdown", "estimator", "rloo"] in moved["1"][0], moved


_CHILD = """import sys, time
for i in range({beats}):
    print("progress", i, flush=True)
    time.sleep({every})
time.sleep({silent})
print('{{"done": true}}', flush=True)
"""


def _child(beats: int, every: float, silent: float = 0.0) -> subprocess.Popen:
    code = _CHILD.format(beats=beats, every=every, silent=silent)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_a_slow_run_that_keeps_advancing_passes_and_a_silent_one_is_hung():
    """The watchdog counts time without a heartbeat, not time in all: 3 s of steady beats pass
    a 1.5 s stall limit; 3 s of silence fail it, long before the ceiling."""
    t0 = time.monotonic()
    assert _follow(_child(beats=10, every=0.3), 1.5, t0 + 60) == ({"done": True}, None)
    assert time.monotonic() - t0 > 2.5                         # longer than the stall limit
    t0 = time.monotonic()                 # the calibration: a child's start-up, timed now
    subprocess.run([sys.executable, "-c", "import json, time"], check=True)
    start_up = time.monotonic() - t0
    t0 = time.monotonic()
    result, why = _follow(_child(beats=1, every=0.1, silent=30), 1.5, t0 + 60)
    assert result is None and why == "no heartbeat for 2 s"
    # the stall limit, _follow's 1 s poll and the beat, plus twice the start-up: not the 30 s
    assert time.monotonic() - t0 < 1.5 + 1.0 + 0.1 + 2 * start_up + 2.0
    result, why = _follow(_child(beats=100, every=0.2), 10, time.monotonic() + 1.5)
    assert result is None and why == "past the ceiling"


def test_save_executed_writes_the_model_as_a_notebook(tmp_path):
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    nb.cells[0].execution_count = 1
    nb.cells[0].outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"},
                                                  execution_count=1)]
    model = json.loads(nbformat.writes(nb))           # as JupyterLab's model.toJSON() gives it:
    model["cells"].insert(0, {"cell_type": "markdown", "id": "m", "metadata": {},
                              "source": "# a", "attachments": None})
    model["nbformat_minor"] = 4                      # a 4.4 notebook, whose cells have ids
    save_executed(model, tmp_path / "x" / "00_a.ipynb")
    back = nbformat.read(tmp_path / "x" / "00_a.ipynb", as_version=4)
    nbformat.validate(back)
    assert back.cells[1].outputs[0]["data"]["text/plain"] == "2"
    assert "attachments" not in back.cells[0] and "id" not in back.cells[0]
    assert not list((tmp_path / "x").glob("*.tmp"))


@pytest.fixture(scope="module")
def checkout_lab(tmp_path_factory):
    chromium = _require_browser()
    tmp = tmp_path_factory.mktemp("checkout-lab")
    token, port = secrets.token_hex(16), _free_port()
    lab = _start_checkout_lab(tmp, port, token)
    ARTIFACTS.mkdir(exist_ok=True)
    yield f"http://127.0.0.1:{port}", token, chromium
    _stop(lab)


def _drive(args: list[str], stall_s: float, ceiling_s: float | None = None):
    """Run this file as the browser driver with ``args`` -> the JSON of its last output line.
    The child is hung when it prints nothing (no heartbeat) for ``stall_s``; ``ceiling_s``
    bounds the whole call. One retry, within what is left of the ceiling: a run was once seen to
    hang."""
    errors, start = [], time.monotonic()
    ceiling = ceiling_s if ceiling_s is not None else 2 * stall_s
    for attempt in (1, 2):
        if attempt == 2 and time.monotonic() - start > ceiling / 2:
            errors.append("no retry: less than half the ceiling is left")
            break
        err_log = ARTIFACTS / f"driver_{os.getpid()}_{attempt}.stderr"
        ARTIFACTS.mkdir(exist_ok=True)
        with open(err_log, "w") as err_file:
            driver = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE,
                                      stderr=err_file, text=True, start_new_session=True)
            result, why = _follow(driver, stall_s, start + ceiling)
        err = err_log.read_text()[-3000:]
        err_log.unlink(missing_ok=True)
        if result is not None:
            return result
        errors.append(f"attempt {attempt}: {why}: {err}")
    pytest.fail("the browser run failed:\n" + "\n".join(errors))


def _follow(driver: subprocess.Popen, stall_s: float, deadline: float):
    """Read the child's lines until it exits -> (JSON of its last line, None) or (None, why)."""
    sel = selectors.DefaultSelector()
    sel.register(driver.stdout, selectors.EVENT_READ)
    last_line, heard = "", time.monotonic()
    try:
        while True:
            now = time.monotonic()
            if now - heard > stall_s:
                return None, f"no heartbeat for {stall_s:.0f} s"
            if now > deadline:
                return None, "past the ceiling"
            if sel.select(timeout=1.0):
                line = driver.stdout.readline()
                if not line:                                       # EOF: the child ended
                    driver.wait(timeout=60)
                    if driver.returncode == 0 and last_line:
                        return json.loads(last_line), None
                    return None, f"exit {driver.returncode}"
                if line.strip():
                    last_line, heard = line.strip(), time.monotonic()
    finally:
        sel.close()
        _stop(driver)


def _drive_notebooks(lab, paths: list[str], stall_s: float, ceiling_s: float) -> list[dict]:
    base, token, chromium = lab
    return _drive(["notebooks", base, token, chromium, str(ARTIFACTS), str(EXECUTED), *paths],
                  stall_s + 120, ceiling_s)


def test_an_exercise_shows_its_verdict_in_jupyterlab(checkout_lab):
    (res,) = _drive_notebooks(checkout_lab, ["notebooks/exercises/advantages.ipynb"], STALL_S,
                              3 * STALL_S)
    assert not problems(res), problems(res)
    verdict = [t for t in res["texts"] if "check_advantages" in t]
    assert verdict, res["texts"]                                    # the verdict is rendered
    assert "FAIL" in verdict[0] and "hint: not written yet" in verdict[0], verdict  # the stub fails


NOTEBOOKS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_every_notebook_runs_clean_in_jupyterlab(checkout_lab):
    results = _drive_notebooks(checkout_lab, NOTEBOOKS, STALL_S, CEILING_S + 300)
    (ARTIFACTS / "notebooks_in_lab.json").write_text(json.dumps(results, indent=1))
    found = {r["notebook"]: problems(r) for r in results}
    assert [r["notebook"] for r in results] == NOTEBOOKS
    assert not any(found.values()), {k: v for k, v in found.items() if v}
    for r in results:                                 # every notebook draws something visible
        assert r["images"] > 0, r["notebook"]


if __name__ == "__main__":                                                 # the child process
    if sys.argv[1] == "notebooks":
        print(json.dumps(run_notebooks(*sys.argv[2:7], *sys.argv[7:])))
    else:
        print(json.dumps(drive(*sys.argv[1:4])))
