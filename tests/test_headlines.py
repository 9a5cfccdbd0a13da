"""Every headline figure (data/headlines.json: the README's, the docs', the lessons' opening cells'
and BENCHMARKS.md's opening lines) is in the results file it cites: each quote exactly, each number
of the text as shown in the quotes or recomputed from their numbers by the formula the entry gives,
and the text itself in each page that shows it (whitespace and line breaks aside). A figure shown
on one of those pages names the CPU it was measured on and the load, and the CPU is in the file
the entry says records it; and no such page shows a time, speed-up or percentage that is neither
listed nor set aside in not_figures (with why). Nothing here reads outside the repository."""
import ast
import json
import operator
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADLINES = json.loads((ROOT / "data" / "headlines.json").read_text())
ENTRIES, NOT_FIGURES = HEADLINES["figures"], HEADLINES["not_figures"]
NUMBER = re.compile(r"(?<![A-Za-z_\d.])\d+(?:,\d{3})*(?:\.\d+)?")    # not the 8 of int8, the 16 of fp16
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def numbers(text: str) -> set:
    """The numbers written in ``text``, as written; single digits left out (counts: "3 seeds")."""
    return {n for n in NUMBER.findall(text) if len(n) > 1}


def arithmetic(expr: str) -> float:
    """``expr`` of numbers, + - * / and brackets only, evaluated."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"only numbers and + - * / in a derived figure, got {ast.dump(node)}")
    return ev(ast.parse(expr, mode="eval"))


# what a figure looks like on a page: a time, a speed-up, a percentage (an accuracy, a saving)
FIGURES = (re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:\s*-\s*\d[\d,]*(?:\.\d+)?)?\s?(?:ms|us|µs|s|min|minutes?|"
                      r"seconds?|hours?|h)\b"),
           re.compile(r"\b(?:(?:one|two|three|four|five|six|ten|twenty|a few)(?: to (?:one|two|three|four|five|ten|"
                      r"a few))? (?:minutes?|seconds?|hours?)|(?:half )?an hour|(?:half )?a minute)\b", re.I),
           re.compile(r"(?<![\w.])\d+(?:\.\d+)?x\b"),
           re.compile(r"(?<![\w.])\d+(?:\.\d+)?%"))
# files the course site generates into docs/ (git-ignored), not pages of the repository
GENERATED = ("docs/reference/benchmarks-full.md", "docs/reference/claims.md", "docs/teach/", "docs/reference/bench/")
CPU_MODEL = re.compile(r"EPYC|Xeon")                 # as lscpu writes them: "AMD EPYC", "Intel(R) Xeon(R)"


def page_text(path: str) -> str:
    """A page as a reader sees it, whitespace folded: a markdown file whole, a notebook's opening
    (its first markdown cell, the lesson's intro)."""
    if path.endswith(".ipynb"):
        cells = json.loads((ROOT / path).read_text())["cells"]
        text = "".join(next(c for c in cells if c["cell_type"] == "markdown")["source"])
    else:
        text = (ROOT / path).read_text()
    return " ".join(text.split())


def pages() -> list:
    """The README, every docs/ page and every lesson."""
    docs = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md"))]
    return (["README.md"] + [p for p in docs if not p.startswith(GENERATED)]
            + [str(p.relative_to(ROOT)) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))])


def unlisted(path: str, text: str) -> list:
    """The figures of a page's ``text`` left once every listed figure shown there and every
    not_figures text of that page are taken out."""
    for t in [e["text"] for e in ENTRIES if path in e["shown_in"]] + [n["text"] for n in NOT_FIGURES if n["page"] == path]:
        text = text.replace(" ".join(t.split()), " ")
    return [m.group(0) for rx in FIGURES for m in rx.finditer(text)]


def test_the_list_is_well_formed():
    assert len(ENTRIES) >= 5
    for e in ENTRIES:
        assert set(e) <= {"text", "quotes", "derived", "results", "command", "machine", "shown_in", "cpu",
                          "cpu_recorded_in", "load"}, e
        assert e["text"].strip() and e["quotes"] and e["command"].strip() and e["machine"].strip(), e
        assert e["results"].startswith("bench/RESULTS_"), e["results"]
        assert e["cpu"].strip() and e["load"].strip() and (ROOT / e["cpu_recorded_in"]).is_file(), e
    for n in NOT_FIGURES:
        assert set(n) == {"page", "text", "why"} and n["why"].strip(), n
        assert " ".join(n["text"].split()) in page_text(n["page"]), f"not on {n['page']}: {n['text']}"


def test_every_figure_on_a_page_names_its_cpu_and_load():
    """A figure shown on the README, a docs page or a lesson names the CPU model it was measured
    on, as written in the results file or BENCHMARKS.md, and the load; "not recorded" is allowed
    only for BENCHMARKS.md's own list."""
    for e in ENTRIES:
        on_pages = [p for p in e["shown_in"] if p != "BENCHMARKS.md"]
        model = CPU_MODEL.search(e["cpu"])
        if on_pages:
            assert model and "not recorded" not in e["cpu"], (e["text"], e["cpu"])
        if model:
            assert model.group(0) in (ROOT / e["cpu_recorded_in"]).read_text(), (e["text"], e["cpu_recorded_in"])
        assert numbers(e["load"]) <= numbers((ROOT / e["results"]).read_text() + " ".join(e["quotes"])
                                             + (ROOT / e["cpu_recorded_in"]).read_text()), e["load"]


def test_no_page_shows_an_unlisted_figure():
    """Every time, speed-up and percentage on the README, the docs and the lessons' openings is a
    listed figure (with its results file and CPU) or a not_figures text (a setting, a limit, a
    target, a term, a quoted claim)."""
    left = {p: unlisted(p, page_text(p)) for p in pages()}
    assert not {p: f for p, f in left.items() if f}, {p: f for p, f in left.items() if f}


def test_an_unlisted_figure_is_caught():
    assert unlisted("README.md", "a toy learns in one to two minutes of training") == ["one to two minutes"]
    assert unlisted("docs/site.md", "the run-all took 707 s (05: 124 s), 2.3x faster, 57.0% held out") == \
        ["707 s", "124 s", "2.3x", "57.0%"]
    assert unlisted("docs/guide/scaling.md", "(default 120 s)") == []          # a not_figures text
    assert unlisted("docs/guide/demo.md", "57.0% -> 60.9% held out, best 62.1%, 300 steps in 53 s of training") == []


def problems(e: dict) -> list:
    """What is wrong with one entry: a quote not in its results file, a derived figure that is not
    its formula's value or uses numbers the quotes do not hold, a number of the text in neither,
    a page of shown_in without the text. Empty when the entry is backed."""
    out = []
    results = (ROOT / e["results"]).read_text()
    out += [f"not in {e['results']}: {q}" for q in e["quotes"] if q not in results]
    quoted = set().union(*(numbers(q) for q in e["quotes"]))
    derived = e.get("derived", {})
    for shown, expr in derived.items():
        extra = numbers(expr) - quoted - {"100"}                          # 100: a percentage's scale
        places = len(shown.split(".")[1]) if "." in shown else 0
        if extra:
            out.append(f"{expr} uses {sorted(extra)}, not in the quotes")
        if round(arithmetic(expr), places) != float(shown):
            out.append(f"{shown} is not {expr} = {arithmetic(expr)}")
    missing = numbers(e["text"]) - quoted - set(derived)
    if missing:
        out.append(f"numbers {sorted(missing)} of the text are not in the quotes")
    for page in e["shown_in"]:                                             # line breaks aside
        if " ".join(e["text"].split()) not in page_text(page):
            out.append(f"not shown in {page}")
    return out


@pytest.mark.parametrize("e", ENTRIES, ids=[e["text"][:40] for e in ENTRIES])
def test_each_headline_number_is_in_the_file_it_cites(e):
    assert not problems(e), problems(e)


def test_benchmarks_headline_lines_are_all_listed():
    """Each bullet under BENCHMARKS.md's "Headline figures" holds at least one listed text, so
    a headline added there without an entry here fails."""
    md = (ROOT / "BENCHMARKS.md").read_text()
    block = md.split("**Headline figures**", 1)[1].split("\n\n", 1)[0]
    bullets = [" ".join(b.split()) for b in re.split(r"\n- ", block)[1:]]
    listed = [e["text"] for e in ENTRIES if "BENCHMARKS.md" in e["shown_in"]]
    assert len(bullets) >= 5
    for b in bullets:
        assert any(t in b for t in listed), b


def test_the_checks_can_fail():
    """The README's old decoder figures, a mis-rounded derived figure and a page that does not show
    the text are each caught."""
    decode = next(e for e in ENTRIES if e["results"] == "bench/RESULTS_hf_speed_decode.md")
    old = {**decode, "text": "22-26% less time per decode step than transformers' forward", "derived": {},
           "shown_in": []}
    assert problems(old) == ["numbers ['22', '26'] of the text are not in the quotes"]
    wrong = {**decode, "derived": {"18": "100 * (1 - 94.8 / 116.3)", "10": "100 * (1 - 182.3 / 116.3)"}}
    assert any(p.startswith("10 is not") for p in problems(wrong))
    assert problems({**decode, "shown_in": ["LICENSE"]}) == ["not shown in LICENSE"]
    assert numbers("0.83x [0.45, 1.56], 3 seeds, int8") == {"0.83", "0.45", "1.56"}
    with pytest.raises(ValueError, match="only numbers"):
        arithmetic("__import__('os')")
