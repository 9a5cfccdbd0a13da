"""Every headline figure (data/headlines.json: the README's, the docs' and BENCHMARKS.md's opening
lines) is in the results file it cites: each quote exactly, each number of the text as shown in
the quotes or recomputed from their numbers by the formula the entry gives, and the text itself
in each page that shows it (whitespace and line breaks aside). Nothing here reads outside the repository."""
import ast
import json
import operator
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = json.loads((ROOT / "data" / "headlines.json").read_text())["figures"]
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


def test_the_list_is_well_formed():
    assert len(ENTRIES) >= 5
    for e in ENTRIES:
        assert set(e) <= {"text", "quotes", "derived", "results", "command", "machine", "shown_in"}, e
        assert e["text"].strip() and e["quotes"] and e["command"].strip() and e["machine"].strip(), e
        assert e["results"].startswith("bench/RESULTS_"), e["results"]


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
        if " ".join(e["text"].split()) not in " ".join((ROOT / page).read_text().split()):
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
