"""How often the answer readers read the answer a person reads: grpo_lab's reader
(``answers.extract`` then ``answers.as_number``) and math-verify's (``parse`` then ``verify``
against the label, its default extraction), on the hand-labelled corpus data/answer_labels.jsonl.

Each corpus row is a completion and the value a careful person reads as its final answer (None:
the text gives no answer, for example a statement cut off at "33 +"). A reader agrees on a row
when it reads that value, or reads nothing where the label is None. Rows come from three
sources, counted apart: the stated-expression probes of issue 49, the grader forms the test
suite reads, and SmolLM2-135M-Instruct's own completions that state an answer ("the answer
is ...", sampled at temperature 1 on the addition and word-problem prompts in all three answer
formats; one ambiguous completion was left out).

    PYTHONPATH=. .venv/bin/python bench/bench_answer_reader.py [--out bench/RESULTS_answer_reader.md]

math-verify is optional (pip install -e ".[math]"): without it its column says so.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from bench_op_overhead import cpu_line          # the CPU line every results file names

from grpo_lab.tasks.answers import as_number, extract

CORPUS = Path(__file__).resolve().parents[1] / "data" / "answer_labels.jsonl"


def read_corpus(path: Path = CORPUS) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def grpo_lab_agrees(row: dict) -> bool:
    want = as_number(row["label"]) if row["label"] is not None else None
    return as_number(extract(row["text"])) == want


def math_verify_agrees(row: dict) -> bool:
    from math_verify import parse, verify
    pred = parse(row["text"], parsing_timeout=None)
    if row["label"] is None:
        return not pred
    gold = parse(row["label"], parsing_timeout=None)
    return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write the table as markdown here")
    args = ap.parse_args(argv)
    rows = read_corpus()
    readers = {"grpo_lab": grpo_lab_agrees}
    try:
        import math_verify  # noqa: F401
        readers["math-verify"] = math_verify_agrees
    except ImportError:
        pass
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    misses: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        for name, agrees in readers.items():
            ok = agrees(row)
            counts[row["source"]][name] += ok
            counts["all"][name] += ok
            if not ok:
                misses[name].append(row["text"][-80:])
        counts[row["source"]]["n"] += 1
        counts["all"]["n"] += 1
    names = list(readers)
    lines = ["| rows | n | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for source, c in sorted(counts.items(), key=lambda kv: kv[0] == "all"):
        lines.append(f"| {source} | {c['n']} | "
                     + " | ".join(f"{c[nm]}/{c['n']} ({c[nm] / c['n']:.0%})" for nm in names) + " |")
    if "math-verify" not in readers:
        lines.append("\nmath-verify is not installed: its column is missing (pip install -e \".[math]\").")
    text = "\n".join(lines)
    print(text)
    for name in names:
        print(f"\n{name} disagrees on {len(misses[name])}:")
        for m in misses[name]:
            print("   ", repr(m))
    if args.out:
        args.out.write_text(f"# Answer readers against hand labels\n\n`{' '.join(['python', 'bench/bench_answer_reader.py'])}`"
                            f" on {cpu_line()}; corpus data/answer_labels.jsonl ({len(rows)} rows).\n\n{text}\n\n"
                            + "\n".join(f"{name} disagrees on: " + "; ".join(repr(m) for m in misses[name])
                                        for name in names) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
