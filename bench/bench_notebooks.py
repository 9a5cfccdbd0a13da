"""Wall time of every notebook, quick and full mode: the timing table of the teacher's guide.

    PYTHONPATH=. python bench/bench_notebooks.py --mode quick            # all notebooks
    PYTHONPATH=. python bench/bench_notebooks.py --mode full --only 00_quickstart
    PYTHONPATH=. python bench/bench_notebooks.py --render                # table from the JSON only

Each notebook (notebooks/*.ipynb, then the exercise solutions) runs top to bottom in a fresh
python3 kernel through nbclient, as "Run All" does, with ``GRPO_LAB_QUICK`` set to 1 (quick)
or 0 (full). Measured: wall time from kernel start to the last cell's reply, and the slowest
cell. Results accumulate in bench/RESULTS_notebooks.json (one entry per notebook and mode,
so quick and full can be measured in separate runs); the table is written into
notebooks/WORKSHOP.md between its ``timings`` markers. Each entry records the load average
before and after: the CPUs are shared, so a load above the core count means the time is
longer than on an idle laptop.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS_notebooks.json"
GUIDE = ROOT / "notebooks" / "WORKSHOP.md"
BEGIN, END = "<!-- timings:begin (bench/bench_notebooks.py) -->", "<!-- timings:end -->"


def notebooks() -> list[Path]:
    nb = ROOT / "notebooks"
    return sorted(nb.glob("*.ipynb")) + sorted((nb / "exercises" / "solutions").glob("*.ipynb"))


def name_of(path: Path) -> str:
    return str(path.relative_to(ROOT / "notebooks"))


def run_one(path: Path, quick: bool, timeout: float) -> dict:
    import nbformat
    from nbclient import NotebookClient

    os.environ["GRPO_LAB_QUICK"] = "1" if quick else "0"                  # the kernel inherits it
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    nb = nbformat.read(path, as_version=4)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    status = "ok"
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=True,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    except Exception as e:                                 # still report the time, and where
        status = f"{type(e).__name__}"
        for i, cell in enumerate(nb.cells):
            for o in cell.get("outputs", []):
                if o.get("output_type") == "error":
                    status = f"stopped at cell {i}: {o['ename']}: {str(o['evalue'])[:100]}"
    wall = time.perf_counter() - t0
    slowest, cell_s = None, 0.0
    for i, cell in enumerate(nb.cells):
        ex = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in ex and "shell.execute_reply" in ex:
            s = (datetime.fromisoformat(ex["shell.execute_reply"].replace("Z", "+00:00"))
                 - datetime.fromisoformat(ex["iopub.execute_input"].replace("Z", "+00:00"))
                 ).total_seconds()
            if s > cell_s:
                slowest, cell_s = i, s
    return {"notebook": name_of(path), "mode": "quick" if quick else "full",
            "seconds": round(wall, 1), "slowest_cell": slowest, "slowest_cell_s": round(cell_s, 1),
            "status": status, "load_before": round(load0, 2),
            "load_after": round(os.getloadavg()[0], 2),
            "measured": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": {}}


def fmt_time(s: float | None) -> str:
    return "-" if s is None else (f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min")


def render(data: dict) -> str:
    """The markdown table (one row per notebook) and the totals line."""
    runs, rows, totals = data["runs"], [], {"quick": 0.0, "full": 0.0}
    names = [name_of(p) for p in notebooks()]
    for n in names:
        cells = []
        for mode in ("quick", "full"):
            r = runs.get(f"{n}|{mode}")
            if r is None:
                cells.append("not measured")
                continue
            totals[mode] += r["seconds"]
            status = re.sub(r"\x1b\[[0-9;]*m", "", r["status"])            # no terminal colours
            note = "" if status == "ok" else f" ({status})"
            cells.append(f"{fmt_time(r['seconds'])} (slowest cell {r['slowest_cell']}: "
                          f"{fmt_time(r['slowest_cell_s'])}; load {r['load_before']:.1f}){note}")
        rows.append(f"| `{n}` | {cells[0]} | {cells[1]} |")
    machine = data.get("machine", "")
    return "\n".join([
        f"Measured by `bench/bench_notebooks.py` ({machine}); a run-all in a fresh kernel, "
        "model load and imports included. \"load\" is the 1-minute load average when the "
        "notebook started: the CPUs were shared with other users, so above 2 the times are "
        "longer than on an idle 2-core laptop.",
        "",
        "| notebook | quick (`GRPO_LAB_QUICK=1`) | full |",
        "|---|---|---|",
        *rows,
        f"| **total** | **{fmt_time(totals['quick'])}** | **{fmt_time(totals['full'])}** |",
    ])


def write_guide(table: str) -> None:
    text = GUIDE.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{GUIDE} has no {BEGIN!r} ... {END!r} block to fill")
    head, rest = text.split(BEGIN, 1)
    GUIDE.write_text(head + BEGIN + "\n" + table + "\n" + END + rest.split(END, 1)[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["quick", "full", "both"], default="quick")
    ap.add_argument("--only", nargs="*", default=None,
                    help="notebook names (e.g. 00_quickstart, exercises/solutions/loss)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per cell")
    ap.add_argument("--render", action="store_true", help="only rewrite the table from the JSON")
    args = ap.parse_args(argv)
    paths = notebooks()
    if args.only:
        known = {name_of(p).removesuffix(".ipynb"): p for p in paths}
        unknown = [n for n in args.only if n.removesuffix(".ipynb") not in known]
        if unknown:
            raise SystemExit(f"unknown notebook(s) {unknown}; known: {sorted(known)}")
        paths = [known[n.removesuffix(".ipynb")] for n in args.only]
    data = load()
    if not args.render:
        import torch
        data["machine"] = (f"{platform.machine()}, {os.cpu_count()} CPU cores, torch "
                           f"{torch.__version__}, Python {platform.python_version()}")
        for mode in (["quick", "full"] if args.mode == "both" else [args.mode]):
            for p in paths:
                r = run_one(p, mode == "quick", args.timeout)
                print(json.dumps(r), flush=True)
                data["runs"][f"{r['notebook']}|{mode}"] = r
                RESULTS.write_text(json.dumps(data, indent=1) + "\n")      # after each notebook
    table = render(data)
    write_guide(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
