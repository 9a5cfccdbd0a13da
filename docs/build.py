"""Build the course site offline: ``make docs`` runs this file.

1. Each lesson (``notebooks/NN_*.ipynb``) is rendered with its quick-mode outputs. The browser
   test (``tests/test_browser.py``) saves every notebook it ran in JupyterLab to
   ``runs/executed/``; a saved copy is used when its code cells are the lesson's current ones,
   every code cell ran and none holds an error. Otherwise (the site built on its own, or a lesson
   edited since) the lesson is executed here in quick mode with nbclient, and the result is saved
   to ``runs/executed/`` too. Notebooks are never run twice in CI.
2. The staged copies get links: the first time a glossary term appears in a lesson's markdown
   it links to its glossary entry (``docs/glossary.md``; the source notebooks are untouched).
   Widget outputs, which need a live kernel, become a one-line note.
3. Pages kept elsewhere in the repository (``notebooks/WORKSHOP.md``, ``BENCHMARKS.md``,
   ``data/claims.md``) and MathJax (from ``jupyter_server_mathjax``, so formulas render with no
   network) are copied into ``docs/``; every copy is gitignored.
4. ``mkdocs build --strict`` (a broken link between pages is an error, ``mkdocs.yml``), then
   every ``href`` and ``src`` of the built HTML, notebook pages included, and every relative
   link of README.md must resolve to a file (and an anchor, when it names one).

    python docs/build.py                 # the whole site into site/
    python docs/build.py --only 00_quickstart 01_relative_rewards    # a few lessons (quick look)
    python docs/build.py --check-links site                          # only the link check
"""
from __future__ import annotations

import argparse
import copy
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
WIDGET_NOTE = ("<p><em>An interactive widget is shown here when the notebook runs in Jupyter "
               "(<code>make lab</code>).</em></p>")


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


def executed_lesson(lesson: Path, log=print) -> dict:
    """The lesson with its quick-mode outputs: the saved run when it is current, else a new one."""
    source = json.loads(lesson.read_text())
    saved = EXECUTED / lesson.name
    why = "none saved" if not saved.exists() else usable(json.loads(saved.read_text()), source)
    if why is None:
        log(f"{lesson.name}: the saved run ({saved})")
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


def stage_lesson(nb: dict, terms: dict[str, list[str]]) -> dict:
    """The site's copy of an executed lesson: glossary links, widget outputs as a note."""
    nb = copy.deepcopy(nb)
    nb["metadata"].pop("widgets", None)
    seen: set = set()
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = toc_anchors(link_terms(_source(cell), terms, seen, "../../glossary/"))
        for out in cell.get("outputs", []):
            if WIDGET_MIME in out.get("data", {}):
                out["data"] = {"text/html": WIDGET_NOTE}
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
    """Every internal href/src of every page in ``site`` that names a missing file or anchor."""
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
            if s.path.endswith("/") or target.is_dir():
                target = target / "index.html"
            where = f"{page.relative_to(site.resolve())}: {ref}"
            if not target.exists():
                broken.append(f"{where} (no file {target.relative_to(site.resolve().parent)})"
                              if target.is_relative_to(site.resolve().parent) else where)
            elif s.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if unquote(s.fragment) not in ids:
                    broken.append(f"{where} (no anchor #{s.fragment})")
    return broken


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
def build(only: list[str] | None = None, site: Path = SITE) -> None:
    t0 = time.time()
    terms = glossary_terms()
    (DOCS / "lessons").mkdir(exist_ok=True)
    for lesson in LESSONS:
        staged = DOCS / "lessons" / lesson.name
        if only and lesson.stem not in only:        # a saved run if current, else no outputs
            nb, saved = json.loads(lesson.read_text()), EXECUTED / lesson.name
            if saved.exists() and usable(json.loads(saved.read_text()), nb) is None:
                nb = json.loads(saved.read_text())
        else:
            nb = executed_lesson(lesson)
        staged.write_text(json.dumps(stage_lesson(nb, terms), indent=1))
    copy_pages()
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
                        "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)], cwd=ROOT)
    if r.returncode:
        sys.exit(f"mkdocs build --strict failed (exit {r.returncode})")
    broken = check_links(site) + check_markdown_links(ROOT / "README.md")
    if broken:
        sys.exit("broken internal links:\n  " + "\n  ".join(broken))
    print(f"site built in {time.time() - t0:.0f} s: {site}/index.html "
          f"({len(list(site.rglob('*.html')))} pages, every internal link resolves)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="lesson stems to execute/render (others: as stored)")
    ap.add_argument("--check-links", metavar="SITE", help="only check the links of a built site")
    ap.add_argument("--site", default=str(SITE), help="output folder (default site/)")
    a = ap.parse_args(argv)
    if a.check_links:
        broken = check_links(Path(a.check_links))
        print("\n".join(broken) or "every internal link resolves")
        sys.exit(1 if broken else 0)
    build(a.only, Path(a.site))


if __name__ == "__main__":
    main()
