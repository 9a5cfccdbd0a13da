"""Build the course site offline: ``make docs`` runs this file.

1. Each lesson (``notebooks/NN_*.ipynb``) is rendered with its quick-mode outputs. The browser
   test (``tests/test_browser.py``) saves every notebook it ran in JupyterLab to
   ``runs/executed/``; a saved copy is used when its code cells are the lesson's current ones,
   every code cell ran and none holds an error. Otherwise (the site built on its own, or a lesson
   edited since) the lesson is executed here in quick mode with nbclient, and the result is saved
   to ``runs/executed/`` too. Notebooks are never run twice in CI.
2. The staged copies get links: the first time a glossary term appears in a lesson's markdown
   it links to its glossary entry (``docs/glossary.md``; the source notebooks are untouched).
   A widget needs a live kernel to react, so each widget output becomes what it showed last,
   read from the widget state the execution saved (``widgets_as_shown``): an explorer's
   figures and read-outs under one line naming its controls' values, a progress bar its final
   text line; a note where no state was saved.
3. Pages kept elsewhere in the repository (``notebooks/WORKSHOP.md``, ``BENCHMARKS.md``,
   ``data/claims.md``) and MathJax (from ``jupyter_server_mathjax``, so formulas render with no
   network) are copied into ``docs/``; every copy is gitignored.
4. ``mkdocs build --strict`` (a broken link between pages is an error, ``mkdocs.yml``), then
   every ``href`` and ``src`` of the built HTML, notebook pages included, and every relative
   link of README.md must resolve to a file (and an anchor, when it names one), as a browser
   opening ``site/index.html`` from the disk resolves it: a link to a folder is broken there
   (no server turns it into its index.html), and MathJax's web fonts must be in the site.

It first prints what it will do (which lessons it executes and why) and how long the last build
took (``runs/executed/last_build.json``).

    python docs/build.py                 # the whole site into site/
    python docs/build.py --quick         # never execute: every lesson from its saved run, even
                                         # one whose code changed since (minutes -> seconds)
    python docs/build.py --only 00_quickstart 01_relative_rewards    # a few lessons (quick look)
    python docs/build.py --check-links site                          # only the link check
"""
from __future__ import annotations

import argparse
import copy
import html
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SITE = ROOT / "site"
EXECUTED = ROOT / "runs" / "executed"
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
COPIES = {  # source in the repository -> page of the site (both gitignored copies)
    "notebooks/WORKSHOP.md": "teach/workshop.md",
    "BENCHMARKS.md": "reference/benchmarks-full.md",
    "data/claims.md": "reference/claims.md",
    "bench/reward_hacking.png": "reference/bench/reward_hacking.png",   # BENCHMARKS.md's figure
}
CELL_TIMEOUT_S = 900          # one cell of a lesson in quick mode (as make test's nbval)
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_NOTE = ("<p><em>An interactive widget is shown here when the notebook runs in Jupyter "
               "(<code>make lab</code>).</em></p>")
LAST_BUILD = EXECUTED / "last_build.json"   # how long the last build took, and what it ran
MATHJAX_LOCAL = "config/local/grpo_lab.js"   # mkdocs.yml's custom_mathjax_url names it
MATHJAX_FONT = "STIX-Web"                    # the web font jupyter-server-mathjax ships


# ---------------------------------------------------------------- 1. executed lessons
def _source(cell) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def code_sources(nb) -> list[str]:
    return [_source(c) for c in nb["cells"] if c["cell_type"] == "code"]


def usable(executed: dict, lesson: dict) -> str | None:
    """Why an executed copy cannot stand for the lesson (None: it can)."""
    import nbformat
    try:
        nbformat.validate(nbformat.from_dict(copy.deepcopy(executed)))
    except nbformat.ValidationError as e:
        return f"not a valid notebook ({str(e).splitlines()[0][:80]})"
    if code_sources(executed) != code_sources(lesson):
        return "its code differs from the lesson's"
    code = [c for c in executed["cells"] if c["cell_type"] == "code"]
    if any(c.get("execution_count") is None for c in code if _source(c).strip()):
        return "not every code cell ran"
    if any(o.get("output_type") == "error" for c in code for o in c.get("outputs", [])):
        return "it holds an error output"
    return None


def lacks_widget_state(nb: dict) -> bool:
    """Whether ``nb`` shows widgets but saved none of their state (a run in JupyterLab, which
    keeps the state in the browser): the site could then show a note only."""
    shown = any(WIDGET_MIME in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))
    return shown and not nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state")


def execute(lesson: Path, dest: Path) -> None:
    """Run a lesson in quick mode from the repository root, as the test suite does."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(lesson, as_version=4)
    env = {"GRPO_LAB_QUICK": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)                          # the kernel inherits this process's environment
    try:
        NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)


def plan(lesson: Path, quick: bool = False) -> str | None:
    """Why ``lesson`` must be executed for the site (None: its saved run stands for it). A saved
    run of a lesson that shows widgets must hold their state (``lacks_widget_state``). With
    ``quick`` any saved run stands, even one whose code has changed since."""
    saved = EXECUTED / lesson.name
    if not saved.exists():
        return "none saved"
    if quick:
        return None
    nb = json.loads(saved.read_text())
    why = usable(nb, json.loads(lesson.read_text()))
    if why is None and lacks_widget_state(nb):
        why = "its widgets' state was not saved (a JupyterLab run)"
    return why


def executed_lesson(lesson: Path, log=print, quick: bool = False) -> dict | None:
    """The lesson with its quick-mode outputs: the saved run when it stands for the lesson, else a
    new one. ``quick``: never execute (None when no run is saved: shown without outputs)."""
    saved = EXECUTED / lesson.name
    why = plan(lesson, quick)
    if why is None:
        log(f"{lesson.name}: the saved run ({saved})")
    elif quick:
        log(f"{lesson.name}: no saved run: shown without outputs (--quick executes nothing)")
        return None
    else:
        t0 = time.time()
        log(f"{lesson.name}: executing in quick mode ({why}) ...")
        execute(lesson, saved)
        log(f"{lesson.name}: executed in {time.time() - t0:.0f} s")
    return json.loads(saved.read_text())


# ---------------------------------------------------------------- 2. glossary links
def glossary_terms(text: str | None = None) -> dict[str, list[str]]:
    """{anchor: [the term and its aliases]} from docs/glossary.md: each entry is a heading
    ``### Term { #anchor }`` followed by an optional ``<!-- aka: A | B -->`` line."""
    text = (DOCS / "glossary.md").read_text() if text is None else text
    terms = {}
    for m in re.finditer(r"^### (.+?) \{ #([a-z0-9-]+) \}\n(?:<!-- aka: (.+?) -->)?", text, re.M):
        terms[m.group(2)] = [m.group(1), *(a.strip() for a in (m.group(3) or "").split("|")
                                            if a.strip())]
    return terms


def _term_pattern(term: str) -> re.Pattern:
    """A whole-word match; a lower-case term matches any case ('Advantage'), others exactly."""
    flags = re.IGNORECASE if term == term.lower() else 0
    return re.compile(r"(?<![\w`/\[#.-])" + re.escape(term) + r"(?![\w`\]-])", flags)


_PROTECTED = re.compile(r"```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]*\$|\[[^\]\n]*\]\([^)\n]*\)"
                        r"|<[^>\n]*>|^#+ [^\n]*$", re.S | re.M)


def link_terms(markdown: str, terms: dict[str, list[str]], seen: set, href: str) -> str:
    """Link the first occurrence (not yet in ``seen``) of each term in ``markdown`` outside code,
    math, links, HTML tags and headings, to ``href#anchor``; update ``seen``."""
    spans, plain, pos = [(m.start(), m.end()) for m in _PROTECTED.finditer(markdown)], [], 0
    for a, b in spans + [(len(markdown), len(markdown))]:       # the text between protected spans
        plain.append((pos, a))
        pos = b
    edits = []
    for anchor, names in sorted(terms.items(), key=lambda kv: -max(map(len, kv[1]))):
        if anchor in seen:   # longer names first: 'Dr. GRPO' before 'GRPO'
            continue
        hits = [m for name in names for a, b in plain
                for m in _term_pattern(name).finditer(markdown, a, b)]
        free = [m for m in hits if not any(s < m.end() and m.start() < e for s, e, _ in edits)]
        if free:
            first = min(free, key=lambda m: m.start())
            edits.append((first.start(), first.end(), anchor))
            seen.add(anchor)
    result, last = [], 0
    for s, e, anchor in sorted(edits):
        result += [markdown[last:s], f"[{markdown[s:e]}]({href}#{anchor})"]
        last = e
    return "".join(result) + markdown[last:]


def toc_anchors(markdown: str) -> str:
    """mkdocs-jupyter's table of contents drops a heading's code spans from its anchor
    (``#the-policies-against-torchs``) while the heading's id keeps them: give each such heading
    the TOC's anchor too, so the contents links land."""
    from markdown.extensions.toc import slugify

    def anchor(m):
        text = m.group(2)
        if "`" not in text:
            return m.group(0)
        slug = slugify(re.sub(r"`[^`]*`", "", text), "-")
        return f'<a id="{slug}"></a>\n\n{m.group(0)}'
    return re.sub(r"^(#{1,6}) (.+)$", anchor, markdown, flags=re.M)


def _text(value: str) -> str:
    """An HTML widget's value as plain text (tags dropped, entities and tqdm's spaces read)."""
    return html.unescape(re.sub(r"<[^>]+>", "", value)).replace("\u2007", " ")


def _tree(state: dict, model_id: str):
    """(model_name, state) of a widget and of every widget inside it, in display order."""
    m = state.get(model_id)
    if m is None:
        return
    yield m["model_name"], m["state"]
    for ref in m["state"].get("children", []):
        yield from _tree(state, str(ref).removeprefix("IPY_MODEL_"))


def _output_html(o: dict) -> str:
    """One output of an Output widget as HTML: a figure, an HTML read-out, or text."""
    data = o.get("data", {})
    if "image/png" in data:
        return f'<img alt="figure" src="data:image/png;base64,{data["image/png"].strip()}">'
    if "text/html" in data:
        h = data["text/html"]
        return h if isinstance(h, str) else "".join(h)
    text = o.get("text") or data.get("text/plain") or ""
    text = text if isinstance(text, str) else "".join(text)
    return f"<pre>{html.escape(text)}</pre>" if text.strip() else ""


def widget_as_shown(view: dict, state: dict) -> dict | None:
    """What a widget output showed when the run ended, as a static output's ``data`` (None: no
    state saved for it). A progress bar (tqdm: text, bar, text) becomes its final text line; any
    other widget its read-outs and figures, in display order, under one line naming its
    controls' values."""
    parts = list(_tree(state, view.get("model_id", "")))
    if not parts:
        return None
    bars = [st for name, st in parts if name in ("FloatProgressModel", "IntProgressModel")]
    if bars and len(parts) <= 6:
        texts = [_text(st.get("value", "")) for name, st in parts if name == "HTMLModel"]
        top = float(bars[0].get("max", 100.0) or 1)      # 100: the widget default
        done = float(bars[0].get("value") or 0) / top
        bar = "\u2588" * round(10 * min(max(done, 0.0), 1.0))
        line = f"{texts[0] if texts else ''}|{bar:10s}|{texts[-1] if len(texts) > 1 else ''}"
        return {"text/plain": line.strip()}
    controls, shown = [], []
    for name, st in parts:
        if name in ("HTMLModel", "HTMLMathModel") and st.get("value"):
            shown.append(f"<div>{st['value']}</div>")
        elif name == "LabelModel" and st.get("value"):
            shown.append(f"<p>{html.escape(st['value'])}</p>")
        elif name == "OutputModel":
            shown += [h for h in map(_output_html, st.get("outputs", [])) if h]
        elif "value" in st and st.get("description") and name not in ("ButtonModel",):
            value = st["value"]
            if "options" in st and isinstance(value, int) and name.endswith("DropdownModel"):
                labels = st.get("_options_labels") or []
                value = labels[value] if 0 <= value < len(labels) else value
            controls.append(f"{_text(st['description']).rstrip(':')} = {value}")
    caption = ("<p><em>As the run left it" + (f" ({html.escape(', '.join(controls))})"
               if controls else "") + ". The controls react in Jupyter (<code>make lab</code>), "
               "where each move recomputes this view.</em></p>")
    return {"text/html": caption + "\n".join(shown)}


def stage_lesson(nb: dict, terms: dict[str, list[str]]) -> dict:
    """The site's copy of an executed lesson: glossary links, each widget output as the run left
    it (``widget_as_shown``; the note where no state was saved)."""
    nb = copy.deepcopy(nb)
    state = nb["metadata"].pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    seen: set = set()
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = toc_anchors(link_terms(_source(cell), terms, seen, "../glossary.html"))
        for out in cell.get("outputs", []):
            if WIDGET_MIME in out.get("data", {}):
                out["data"] = widget_as_shown(out["data"][WIDGET_MIME], state) or \
                    {"text/html": WIDGET_NOTE}
    return nb


# ---------------------------------------------------------------- 3. copies
def copy_pages() -> None:
    for src, dest in COPIES.items():
        target = DOCS / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / src, target)
    import jupyter_server_mathjax
    mathjax = Path(jupyter_server_mathjax.__file__).parent / "static"
    if not (DOCS / "assets" / "mathjax" / "MathJax.js").exists():
        shutil.copytree(mathjax, DOCS / "assets" / "mathjax", dirs_exist_ok=True)
    # MathJax 2 prefers TeX's web fonts, which jupyter-server-mathjax does not ship (a 404 per
    # font on every page): use the STIX web fonts it does ship, and no image fonts
    (DOCS / "assets" / "mathjax" / MATHJAX_LOCAL).parent.mkdir(parents=True, exist_ok=True)
    (DOCS / "assets" / "mathjax" / MATHJAX_LOCAL).write_text(
        'MathJax.Hub.Config({"HTML-CSS": {availableFonts: [], preferredFont: null, '
        f'webFont: "{MATHJAX_FONT}", imageFont: null}}}});\n'
        f'MathJax.Ajax.loadComplete("[MathJax]/{MATHJAX_LOCAL}");\n')


# ---------------------------------------------------------------- 4. links
class _Refs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])
        for key in ("href", "src"):
            if a.get(key) and not (tag == "link" and key == "href" and "preconnect" in
                                   (a.get("rel") or "")):
                self.refs.append(a[key])


def _is_internal(ref: str) -> bool:
    s = urlsplit(ref)
    return not (s.scheme or s.netloc or ref.startswith(("#!", "javascript:", "data:")))


def check_links(site: Path) -> list[str]:
    """Every internal href/src of every page in ``site`` that names a missing file or anchor,
    resolved as a browser resolves it from the disk (``file://``): a link to a folder is broken
    (a server would answer its index.html; a file browser shows a listing). A page that loads
    MathJax needs the configuration and the web fonts it asks for."""
    pages = {}
    for page in site.rglob("*.html"):
        p = _Refs()
        p.feed(page.read_text(errors="replace"))
        pages[page.resolve()] = p
    broken = []
    for page, p in sorted(pages.items()):
        for ref in p.refs:
            if not _is_internal(ref):
                continue
            s = urlsplit(ref)
            base = site.resolve() if s.path.startswith("/") else page.parent   # 404.html: /x
            target = page if not s.path else (base / unquote(s.path).lstrip("/")).resolve()
            where = f"{page.relative_to(site.resolve())}: {ref}"
            if s.path.endswith("/") or target.is_dir():
                broken.append(f"{where} (a folder: over file:// it opens a listing, not a page)")
                continue
            if "MathJax.js" in s.path and target.exists():
                for need in ([t.strip() for t in s.query.partition("config=")[2].split(",")
                              if t.strip()]):
                    if not (target.parent / "config" / f"{need}.js").exists():
                        broken.append(f"{where} (no MathJax config {need})")
                if not (target.parent / "fonts" / "HTML-CSS" / MATHJAX_FONT / "woff").is_dir():
                    broken.append(f"{where} (no {MATHJAX_FONT} web fonts beside MathJax)")
            if not target.exists():
                broken.append(f"{where} (no file {target.relative_to(site.resolve().parent)})"
                              if target.is_relative_to(site.resolve().parent) else where)
            elif s.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if unquote(s.fragment) not in ids:
                    broken.append(f"{where} (no anchor #{s.fragment})")
    return sorted(set(broken))


def check_markdown_links(path: Path) -> list[str]:
    """Relative links of a markdown file (README.md) that name a file that does not exist."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    broken = []
    for ref in re.findall(r"\]\(([^)\s]+)\)", text):
        if _is_internal(ref) and urlsplit(ref).path:
            if not (path.parent / unquote(urlsplit(ref).path)).exists():
                broken.append(f"{path.name}: {ref}")
    return broken


# ---------------------------------------------------------------- the build
def announce(only: list[str] | None, quick: bool, log=print) -> None:
    """Say what the build will do before doing it: the lessons it executes and why, and how
    long the last build took."""
    todo = [(l.name, plan(l, quick)) for l in LESSONS if not only or l.stem in only]
    run = [(name, why) for name, why in todo if why is not None and not quick]
    bare = [name for name, why in todo if why is not None and quick]
    if LAST_BUILD.exists():
        last = json.loads(LAST_BUILD.read_text())
        log(f"the last build took {last['seconds']:.0f} s ({last['when']}, "
            f"{len(last['executed'])} lessons executed)")
    else:
        log("no earlier build recorded")
    if run:
        log(f"executing {len(run)} of {len(LESSONS)} lessons in quick mode, about 1-2 min each on "
            f"2 cores (--quick uses the saved runs instead): "
            + "; ".join(f"{name} ({why})" for name, why in run))
    else:
        log("every lesson from its saved run in runs/executed/" + (" (--quick)" if quick else "")
            + (f"; none saved, shown without outputs: {', '.join(bare)}" if bare else ""))


def build(only: list[str] | None = None, site: Path = SITE, quick: bool = False) -> None:
    t0 = time.time()
    announce(only, quick)
    terms = glossary_terms()
    (DOCS / "lessons").mkdir(exist_ok=True)
    executed = []
    for lesson in LESSONS:
        staged = DOCS / "lessons" / lesson.name
        nb = json.loads(lesson.read_text())
        if only and lesson.stem not in only:        # a saved run if current, else no outputs
            saved = EXECUTED / lesson.name
            if saved.exists() and usable(json.loads(saved.read_text()), nb) is None:
                nb = json.loads(saved.read_text())
        else:
            if plan(lesson, quick) is not None and not quick:
                executed.append(lesson.name)
            nb = executed_lesson(lesson, quick=quick) or nb
        staged.write_text(json.dumps(stage_lesson(nb, terms), indent=1))
    copy_pages()
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
                        "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)], cwd=ROOT)
    if r.returncode:
        sys.exit(f"mkdocs build --strict failed (exit {r.returncode})")
    broken = check_links(site) + check_markdown_links(ROOT / "README.md")
    if broken:
        sys.exit("broken internal links:\n  " + "\n  ".join(broken))
    seconds = time.time() - t0
    EXECUTED.mkdir(parents=True, exist_ok=True)
    LAST_BUILD.write_text(json.dumps({"seconds": round(seconds, 1), "executed": executed,
                                      "when": time.strftime("%Y-%m-%d %H:%M"), "quick": quick}))
    print(f"site built in {seconds:.0f} s: {site}/index.html "
          f"({len(list(site.rglob('*.html')))} pages, every internal link resolves, "
          f"from the disk as well)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="lesson stems to execute/render (others: as stored)")
    ap.add_argument("--check-links", metavar="SITE", help="only check the links of a built site")
    ap.add_argument("--site", default=str(SITE), help="output folder (default site/)")
    ap.add_argument("--quick", action="store_true",
                    help="execute nothing: every lesson from its saved run in runs/executed/")
    a = ap.parse_args(argv)
    if a.check_links:
        broken = check_links(Path(a.check_links))
        print("\n".join(broken) or "every internal link resolves")
        sys.exit(1 if broken else 0)
    build(a.only, Path(a.site), a.quick)


if __name__ == "__main__":
    main()
