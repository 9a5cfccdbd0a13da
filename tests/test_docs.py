"""The front-door README, the course site's builder (docs/build.py) and the lessons' two top cells.

The site itself is built by ``make docs`` in CI (``.ci/run``); here: what the builder decides
(which executed copy stands for a lesson, where glossary links go, which links are broken), on
small inputs worked out by hand, and one real quick-mode execution of a tiny lesson.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
build = load_script("docs/build.py", "docs_build")

LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# the sections of the 647-line README this one replaced, and the page each moved to
MOVED = {
    "Set-up: two commands": "setup.md",
    "What the demo does": "guide/demo.md",
    "Hugging Face models": "guide/hugging-face.md",
    "Memory levers": "guide/memory.md",
    "Your own grouper, task, reward or estimator": "guide/extending.md",
    "What happens when things go wrong": "guide/when-things-go-wrong.md",
    "The same run on N processes, GPUs and nodes": "guide/scaling.md",
    "Notebooks": "lessons/index.md",
    "Exercises": "lessons/index.md",
    "Architecture": "reference/architecture.md",
    "Metrics": "reference/metrics.md",
    "Licence, reuse and citation": "about.md",
    "Dependencies and why": "reference/dependencies.md",
    "Benchmarks": "reference/benchmarks.md",
    "Honest numbers": "reference/benchmarks.md",
}


# ---------------------------------------------------------------- the README and its pages
def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for line in ("make demo    # creates .venv if missing", "make test    # the whole test suite"):
        assert any(l.startswith(line) for l in text.splitlines()), line   # CI's contract
    assert r"$A_i = \dfrac{r_i - \operatorname{mean}(r)}{\operatorname{std}(r) + 10^{-4}}$" in text
    assert r"\operatorname{clip}(\rho_{i,t},\ 1-\varepsilon_{\text{low}}" in text    # math, not bold text
    assert "notebook 00" in text
    for path in ("learn", "prototype", "teach"):
        assert re.search(rf"^\| \*\*{path}\*\*.*\| `[^`]+`[^|]*\| \[", text, re.M), path
    assert build.check_markdown_links(ROOT / "README.md") == []


def test_every_section_of_the_old_readme_has_a_page():
    for heading, page in MOVED.items():
        text = (ROOT / "docs" / page).read_text()
        assert re.search(rf"^#+ {re.escape(heading)}$", text, re.M) or \
            text.startswith(f"# {heading}\n"), (heading, page)
        assert f"(docs/{page})" in (ROOT / "README.md").read_text(), f"README does not link {page}"


def test_architecture_page_names_every_module():
    page = (ROOT / "docs/reference/architecture.md").read_text()
    missing = []
    for path in sorted((ROOT / "grpo_lab").rglob("*.py")):
        rel = path.relative_to(ROOT / "grpo_lab")
        if path.name == "__init__.py":
            continue
        if not (str(rel.as_posix()) in page or f"`{path.name}`" in page
                or f"`{path.stem}`" in page or f"{path.stem}.py" in page):
            missing.append(rel.as_posix())
    assert not missing, f"docs/reference/architecture.md does not name: {missing}"


def test_dependencies_page_says_why_each_library_is_used():
    import tomllib
    text = (ROOT / "docs" / "reference" / "dependencies.md").read_text()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for spec in deps:
        name = re.match(r"[A-Za-z0-9_.-]+", spec).group(0)
        assert name in text, f"{name} is a dependency the page does not explain"
    assert "(docs/reference/dependencies.md)" in (ROOT / "README.md").read_text()
    for name in ("mkdocs-jupyter", "mkdocstrings", "jupyter-server-mathjax"):     # the docs extra
        assert name in text, name
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("fast", "lab"):                   # left out of the wheel's base install: why
        assert f"optional `{extra}`" in text, extra
        for spec in extras[extra]:
            assert re.match(r"[A-Za-z0-9_.-]+", spec).group(0) in text, spec


def test_readme_figures_kept_on_their_pages():
    """Figures the old README stated, word for word on the page the section moved to (the
    demo's time is the recorded fresh-clone run's, bench/RESULTS_demo_fresh_clone.md); the
    suite's size, which no results file records, is not quoted: Set-up says how to count it."""
    for page, figure in [("guide/demo.md", "after 127 s of training"),
                         ("guide/hugging-face.md", "12%\n-> 63% (+51.3 points"),
                         ("setup.md", "`pytest --collect-only -q tests notebooks` counts them"),
                         ("reference/benchmarks.md", "5.73 bits each")]:
        assert figure in (ROOT / "docs" / page).read_text(), (page, figure)


# ---------------------------------------------------------------- the lessons' two top cells
def _top_cells(path):
    nb = nbformat.read(path, as_version=4)
    return nb.cells[1], nb.cells[2]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_each_lesson_opens_with_a_parameters_cell_and_an_install_cell(path):
    params, setup = _top_cells(path)
    assert "parameters" in params.metadata.get("tags", []) and "QUICK = None" in params.source
    assert "import grpo_lab" in setup.source and "%pip install" in setup.source
    assert len(params.source.splitlines()) <= 4 and len(setup.source.splitlines()) <= 22


def _run_setup(source: str, quick, importable: bool, monkeypatch) -> list:
    """Run the install cell as IPython would (its %pip line transformed) -> the magics called."""
    from IPython.core.inputtransformer2 import TransformerManager

    calls = []

    class Shell:
        def run_line_magic(self, name, line):
            calls.append((name, line))

    if not importable:
        monkeypatch.setitem(sys.modules, "grpo_lab", None)     # import grpo_lab raises
    code = TransformerManager().transform_cell(source)
    try:
        exec(code, {"get_ipython": lambda: Shell(), "QUICK": quick})
    except ImportError:
        pass                            # the second import, after a pip that only was recorded
    return calls


def test_install_cell_does_nothing_when_installed_and_installs_when_missing(monkeypatch):
    _, setup = _top_cells(LESSONS[0])
    monkeypatch.setenv("GRPO_LAB_QUICK", "1")
    assert _run_setup(setup.source, None, True, monkeypatch) == []
    import os
    assert os.environ["GRPO_LAB_QUICK"] == "1"                  # QUICK = None: left alone
    assert _run_setup(setup.source, 0, True, monkeypatch) == []
    assert os.environ["GRPO_LAB_QUICK"] == "0"                  # papermill's -p QUICK 0
    # missing: tests/test_install_routes.py (the wheel, the repository, or one clear error)


# ---------------------------------------------------------------- glossary
def test_glossary_entries_parse_with_their_aliases():
    terms = build.glossary_terms()
    assert terms["grpo"] == ["GRPO", "Group Relative Policy Optimization"]
    assert "ZeRO-2" in terms["zero"] and "e4m3" in terms["fp8"] and "k3" in terms["kl-estimators"]
    for anchor in ("ppo", "advantage", "group", "dapo", "dr-grpo", "kl-estimators", "zero",
                   "ef21-p", "gspo", "tis", "rloo", "gae", "top-k", "error-feedback", "fp8"):
        assert anchor in terms, anchor


# acronyms that are units, file names or placeholders rather than terms of the subject
NOT_JARGON = {"GB", "KB", "MB", "TB", "JSON", "HOST", "NaN", "BENCHMARKS", "CI", "CLI", "PyPI",
              "API", "MIT", "PNG", "DataFrame"}


def test_glossary_defines_every_acronym_the_lessons_use():
    """Every acronym or CamelCase term of the lessons' text, the README and the site's front
    pages has an entry (or an alias of one) in the glossary."""
    names = {n for ns in build.glossary_terms().values() for n in ns}
    missing = set()
    texts = [(p, c.source) for p in LESSONS for c in nbformat.read(p, as_version=4).cells
             if c.cell_type == "markdown"]
    texts += [(p, re.sub(r"```.*?```", "", p.read_text(), flags=re.S))
              for p in (ROOT / "README.md", ROOT / "docs/index.md", ROOT / "docs/lessons/index.md")]
    for path, source in texts:
        text = re.sub(r"`[^`]*`|\$[^$]*\$", "", source)
        for word in re.findall(r"(?<![\w/.-])([A-Z][A-Za-z0-9]*[A-Z][A-Za-z0-9-]*)(?!\w)", text):
            if not {word, word.rstrip("s")} & (names | NOT_JARGON):
                missing.add(f"{word} ({path.name})")
    assert not missing, sorted(missing)


def test_link_terms_links_each_term_once_outside_code_math_and_headings():
    terms = {"grpo": ["GRPO"], "dr-grpo": ["Dr. GRPO"], "kl-estimators": ["k3"],
             "advantage": ["advantage", "advantages"]}
    seen = set()
    md = "## GRPO\nUse `GRPO` and $k3$; Dr. GRPO beats GRPO. Advantages!\nGRPO again."
    out = build.link_terms(md, terms, seen, "G/")
    assert out == ("## GRPO\nUse `GRPO` and $k3$; [Dr. GRPO](G/#dr-grpo) beats [GRPO](G/#grpo). "
                   "[Advantages](G/#advantage)!\nGRPO again.")
    assert seen == {"grpo", "dr-grpo", "advantage"}
    assert build.link_terms("GRPO and k3", terms, seen, "G/") == "GRPO and [k3](G/#kl-estimators)"


def test_toc_anchor_added_for_a_heading_with_code():
    out = build.toc_anchors("## The policies against torch's `ZeroRedundancyOptimizer`\ntext")
    assert out.startswith('<a id="the-policies-against-torchs"></a>\n\n## The policies')
    assert build.toc_anchors("## Plain heading\n") == "## Plain heading\n"


# ---------------------------------------------------------------- executed lessons
def _nb(*cells):
    nb = nbformat.v4.new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return json.loads(nbformat.writes(nb))


def test_an_executed_copy_stands_for_a_lesson_only_when_current_complete_and_clean():
    lesson = _nb(nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("x = 1"))
    ran = json.loads(json.dumps(lesson))
    ran["cells"][1]["execution_count"] = 1
    assert build.usable(ran, lesson) is None
    edited = json.loads(json.dumps(lesson))
    edited["cells"][1]["source"] = "x = 2"
    assert build.usable(ran, edited) == "its code differs from the lesson's"
    assert build.usable(lesson, lesson) == "not every code cell ran"
    ran["cells"][1]["outputs"] = [{"output_type": "error", "ename": "E", "evalue": "",
                                   "traceback": []}]
    assert build.usable(ran, lesson) == "it holds an error output"


def test_a_lesson_without_a_current_run_is_executed_in_quick_mode(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "EXECUTED", tmp_path / "executed")
    lesson = tmp_path / "99_tiny.ipynb"
    nbformat.write(nbformat.from_dict(_nb(
        nbformat.v4.new_code_cell("import grpo_lab, matplotlib.pyplot as plt\n"
                                  "print('quick', grpo_lab.quick_mode())"),
        nbformat.v4.new_code_cell("plt.plot([0, 1]); plt.show()"))), lesson)
    logs = []
    nb = build.executed_lesson(lesson, log=logs.append)
    assert "executing in quick mode (none saved)" in logs[0]
    outs = [o for c in nb["cells"] for o in c["outputs"]]
    assert any("quick True" in "".join(o.get("text", "")) for o in outs), outs
    assert any("image/png" in o.get("data", {}) for o in outs), outs           # the plot
    nb2 = build.executed_lesson(lesson, log=logs.append)                       # saved: reused
    assert "the saved run" in logs[-1] and nb2 == nb
    staged = build.stage_lesson(nb, {})
    assert staged["cells"][1]["outputs"] == nb["cells"][1]["outputs"]


def test_a_widget_without_saved_state_becomes_a_note_on_the_site():
    nb = _nb(nbformat.v4.new_code_cell("w"))
    nb["cells"][0]["outputs"] = [{"output_type": "display_data", "metadata": {},
                                  "data": {build.WIDGET_MIME: {"model_id": "x"},
                                           "text/plain": "VBox(children=...)"}}]
    nb["metadata"]["widgets"] = {"state": {}}
    staged = build.stage_lesson(nb, {})
    assert staged["cells"][0]["outputs"][0]["data"] == {"text/html": build.WIDGET_NOTE}
    assert "widgets" not in staged["metadata"]
    assert build.lacks_widget_state(nb) and not build.lacks_widget_state(_nb())


def _state(**models):
    return {mid: {"model_name": name, "state": st} for mid, (name, st) in models.items()}


def test_an_explorer_shows_its_last_figure_and_a_progress_bar_its_last_line():
    state = _state(
        box=("VBoxModel", {"children": ["IPY_MODEL_s", "IPY_MODEL_d", "IPY_MODEL_h", "IPY_MODEL_o"]}),
        s=("FloatSliderModel", {"description": "r1", "value": 1.0}),
        d=("DropdownModel", {"description": "estimator", "index": 2, "value": 2,
                             "_options_labels": ["grpo", "dr_grpo", "rloo"], "options": []}),
        h=("HTMLModel", {"value": "<b>A = 0.87</b>"}),
        o=("OutputModel", {"outputs": [{"output_type": "display_data",
                                        "data": {"image/png": "iVBOR\n", "text/plain": "<Fig>"}},
                                       {"output_type": "stream", "name": "stdout",
                                        "text": "loss 0 <ok>\n"}]}),
        left=("HTMLModel", {"value": "grpo:\u2007100%"}),
        bar=("FloatProgressModel", {"value": 300.0, "max": 300.0}),
        right=("HTMLModel", {"value": "\u2007300/300\u2007[00:10&lt;00:00,\u200729.0it/s]"}),
        tq=("HBoxModel", {"children": ["IPY_MODEL_left", "IPY_MODEL_bar", "IPY_MODEL_right"]}))
    shown = build.widget_as_shown({"model_id": "box"}, state)["text/html"]
    assert shown.startswith("<p><em>As the run left it (r1 = 1.0, estimator = rloo). The controls "
                            "react in Jupyter")
    assert shown.endswith("<div><b>A = 0.87</b></div>\n"
                          '<img alt="figure" src="data:image/png;base64,iVBOR">\n'
                          "<pre>loss 0 &lt;ok&gt;\n</pre>")
    assert build.widget_as_shown({"model_id": "tq"}, state) == {
        "text/plain": "grpo: 100%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588| "
                      "300/300 [00:10<00:00, 29.0it/s]"}
    state["bar"]["state"]["value"] = 150.0                          # stopped half-way
    assert "|\u2588\u2588\u2588\u2588\u2588     |" in build.widget_as_shown(
        {"model_id": "tq"}, state)["text/plain"]
    assert build.widget_as_shown({"model_id": "gone"}, state) is None
    nb = _nb(nbformat.v4.new_code_cell("w"))
    nb["cells"][0]["outputs"] = [{"output_type": "display_data", "metadata": {},
                                  "data": {build.WIDGET_MIME: {"model_id": "tq"}}}]
    nb["metadata"]["widgets"] = {build.WIDGET_STATE: {"state": state}}
    assert build.stage_lesson(nb, {})["cells"][0]["outputs"][0]["data"] == {
        "text/plain": "grpo: 100%|\u2588\u2588\u2588\u2588\u2588     | 300/300 [00:10<00:00, "
                      "29.0it/s]"}                # tqdm's own text, the bar drawn from its value
    assert not build.lacks_widget_state(nb)


def test_quick_mode_executes_nothing_and_the_plan_is_said_first(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "EXECUTED", tmp_path / "executed")
    monkeypatch.setattr(build, "LAST_BUILD", tmp_path / "executed" / "last_build.json")
    lesson = tmp_path / "99_tiny.ipynb"
    nbformat.write(nbformat.from_dict(_nb(nbformat.v4.new_code_cell("x = 1"))), lesson)
    monkeypatch.setattr(build, "LESSONS", [lesson])
    logs = []
    assert build.executed_lesson(lesson, log=logs.append, quick=True) is None
    assert logs == ["99_tiny.ipynb: no saved run: shown without outputs (--quick executes nothing)"]
    build.announce(None, False, logs.append)
    assert logs[1:] == ["no earlier build recorded", "executing 1 of 1 lessons in quick mode, "
                        "about 1-2 min each on 2 cores (--quick uses the saved runs instead): "
                        "99_tiny.ipynb (none saved)"]
    saved = _nb(nbformat.v4.new_code_cell("x = 2"))                 # an old run, code changed
    saved["cells"][0]["execution_count"] = 1
    (tmp_path / "executed").mkdir()
    (tmp_path / "executed" / "99_tiny.ipynb").write_text(json.dumps(saved))
    (tmp_path / "executed" / "last_build.json").write_text(json.dumps(
        {"seconds": 312.4, "when": "2026-12-05 16:00", "executed": ["a", "b"]}))
    assert build.plan(lesson) == "its code differs from the lesson's"
    assert build.plan(lesson, quick=True) is None
    assert build.executed_lesson(lesson, log=logs.append, quick=True) == saved
    logs.clear()
    build.announce(None, True, logs.append)
    assert logs == ["the last build took 312 s (2026-12-05 16:00, 2 lessons executed)",
                    "every lesson from its saved run in runs/executed/ (--quick)"]


# ---------------------------------------------------------------- links
def test_check_links_finds_missing_pages_anchors_and_folder_links(tmp_path):
    """Links resolved as a browser opening the site from the disk resolves them: a folder link
    (fine on a server, a listing over file://) is broken too."""
    site = tmp_path / "site"
    (site / "a").mkdir(parents=True)
    (site / "index.html").write_text('<a href="a/index.html">a</a> <a href="a/index.html#there">'
                                     'ok</a> <img src="img.png"> <a href="https://x.org/y">ext</a>'
                                     '<a href="#top">self</a><h1 id="top">t</h1><a href="a/">f</a>')
    (site / "img.png").write_bytes(b"png")
    (site / "a" / "index.html").write_text('<h2 id="there">x</h2><a href="../b.html">b</a>'
                                           '<a href="../index.html#nowhere">n</a>'
                                           '<link href="/index.html" rel="stylesheet">')
    broken = build.check_links(site)
    assert broken == ["a/index.html: ../b.html (no file site/b.html)",
                      "a/index.html: ../index.html#nowhere (no anchor #nowhere)",
                      "index.html: a/ (a folder: over file:// it opens a listing, not a page)"]


def test_check_links_wants_mathjaxs_config_and_web_fonts(tmp_path):
    site = tmp_path / "site"
    mj = site / "assets" / "mathjax"
    (mj / "config" / "local").mkdir(parents=True)
    (mj / "MathJax.js").write_text("")
    (mj / "config" / "TeX-AMS-MML_HTMLorMML-full.js").write_text("")
    (site / "index.html").write_text('<script src="assets/mathjax/MathJax.js?config='
                                     'TeX-AMS-MML_HTMLorMML-full,local/grpo_lab"></script>')
    ref = "index.html: assets/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,local/grpo_lab"
    assert build.check_links(site) == [f"{ref} (no MathJax config local/grpo_lab)",
                                       f"{ref} (no STIX-Web web fonts beside MathJax)"]
    (mj / build.MATHJAX_LOCAL).write_text("")
    (mj / "fonts" / "HTML-CSS" / "STIX-Web" / "woff").mkdir(parents=True)
    assert build.check_links(site) == []


def test_check_markdown_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "p.md").write_text("x")
    md = tmp_path / "README.md"
    md.write_text("[p](docs/p.md) [q](docs/q.md) [w](https://x.org) [a](#anchor)\n"
                  "```\n[not a link](nowhere.md)\n```\n")
    assert build.check_markdown_links(md) == ["README.md: docs/q.md"]


def test_mkdocs_nav_names_every_lesson_and_page():
    text = (ROOT / "mkdocs.yml").read_text()
    for path in LESSONS:
        assert f"lessons/{path.name}" in text, path.name
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    staged = {dest for dest in build.COPIES.values() if dest.endswith(".md")}
    for page in pages - staged:
        assert page in text, f"docs/{page} is not in mkdocs.yml's nav"
    assert "strict: true" in text and "not_found: warn" in text


def test_build_script_help_runs():
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "build.py"), "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "--only" in r.stdout


def test_mkdocs_strict_with_our_validation_fails_on_a_broken_page_link(tmp_path):
    """The validation block of mkdocs.yml, on a two-page site: a link to a missing page or
    anchor fails the strict build; the same site with the links fixed builds."""
    validation = re.search(r"^validation:\n(?:  .*\n)+", (ROOT / "mkdocs.yml").read_text(),
                           re.M).group(0)
    (tmp_path / "docs").mkdir()
    (tmp_path / "mkdocs.yml").write_text(f"site_name: t\n{validation}")
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Here\n")
    env = {**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"}

    def strict(index: str) -> int:
        (tmp_path / "docs" / "index.md").write_text(index)
        return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"],
                              cwd=tmp_path, capture_output=True, env=env).returncode

    assert strict("[b](b.md) [here](b.md#here)\n") == 0
    assert strict("[gone](missing.md)\n") != 0
    assert strict("[b](b.md#nowhere)\n") != 0


@pytest.mark.parametrize("n", ["12", "13"])
def test_lessons_are_what_their_generators_write(n):
    """Lessons 12 and 13 keep their cells in tools/make_nbNN.py: an edit to the .ipynb alone (or
    to the generator, not rerun) would be lost or unshipped; the committed file is the
    generator's."""
    gen = load_script(f"tools/make_nb{n}.py", f"make_nb{n}")
    assert gen.OUT.read_text() == gen.notebook(), f"run: python tools/make_nb{n}.py"
    assert "\x08" not in gen.notebook()        # a "\b" outside a raw string: a lost backslash


def test_a_markdown_page_with_a_formula_gets_mathjax_relative_to_itself():
    """The home page's formulas are typeset, not bold text: a page whose HTML holds an
    arithmatex span gets the vendored MathJax once, linked from its own folder; a page without
    a formula, or one that loads MathJax itself (a lesson), is left as it is."""
    hooks = load_script("docs/hooks.py", "docs_hooks")

    class Page:
        def __init__(self, url):
            self.url = url
    html = '<p><span class="arithmatex">\\(A_i\\)</span></p></body>'
    top = hooks.on_post_page(html, Page("index.html"), {})
    deep = hooks.on_post_page(html, Page("guide/agents.html"), {})
    assert top.count("<script") == 1 and f'<script src="{hooks.MATHJAX}">' in top
    assert f'<script src="../{hooks.MATHJAX}">' in deep
    assert hooks.on_post_page("<p>no formula</p></body>", Page("a.html"), {}) == \
        "<p>no formula</p></body>"
    lesson = html.replace("</body>", '<script src="../assets/mathjax/MathJax.js"></script></body>')
    assert hooks.on_post_page(lesson, Page("lessons/01.html"), {}) == lesson
    mk = (ROOT / "mkdocs.yml").read_text()
    assert hooks.MATHJAX.split("?")[1] in mk and "pymdownx.arithmatex" in mk


def test_architecture_page_quotes_the_step_as_it_is():
    """The step windows' table ends with this tree's figures (tools/step_trace.py's trace of
    one real step, in a process of its own: the trace must not meet another test's state; a
    user-code stop taken back with PyThreadState_SetAsyncExc(id, NULL) once made it loop, see
    test_user_errors.test_after_a_stop_a_traced_call_still_returns), so the page cannot go on
    quoting a step that has since grown or shrunk."""
    done = subprocess.run([sys.executable, "tools/step_trace.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.findall(r"^functions \d+  lines (\d+)  files (\d+) .*if tests on the path (\d+)",
                       done.stdout, re.M)
    assert len(found) == 2, done.stdout                    # the step alone, on_step to on_step
    cells = [f"{int(n):,} lines in {f} files, {i} `if` tests" for n, f, i in found]
    rows = [line for line in (ROOT / "docs/reference/architecture.md").read_text().splitlines()
            if line.startswith("| after ")]
    assert rows and rows[-1].endswith(f"| {cells[0]} | {cells[1]} |"), (
        f"the last row of the step windows' table is not this tree's step ({cells[0]}; "
        f"{cells[1]}): add a row (python tools/step_trace.py) and redraw the picture "
        f"(python tools/draw_architecture.py)\n{rows[-1] if rows else 'no row'}")
