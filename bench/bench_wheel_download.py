"""What the set-up page's wheel route downloads: the bytes of every file pip would fetch.

    python bench/bench_wheel_download.py --torch TORCH_CPU_WHEEL_OR_SPEC --wheel dist/grpo_lab-0.1.0-py3-none-any.whl

``pip install --dry-run --ignore-installed --report`` resolves the route's two halves in one
call (torch's CPU build first, then the grpo_lab wheel and its requirements) without installing
anything; each file's size is read from the disk (a local mirror, ``file://``) or from the index's
``Content-Length``. The on-disk size after installing is in bench/RESULTS_wheel_install.md (a
real install into a fresh venv); this is the other half of "how big is the install": what a
learner's connection carries.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request


def artifact_bytes(url: str) -> int:
    """The size of one file pip would fetch: stat for file://, the index's Content-Length else."""
    if url.startswith("file://"):
        return os.path.getsize(urllib.parse.unquote(url[len("file://"):]))
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60) as r:
        return int(r.headers["Content-Length"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch", required=True, help="torch's CPU wheel (a path) or a spec pip resolves")
    ap.add_argument("--wheel", required=True, help="the grpo_lab wheel (make wheel)")
    ap.add_argument("--top", type=int, default=12, help="rows of the per-package table")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                        "--quiet", "--report", report, a.torch, a.wheel], check=True)
        with open(report) as f:
            rows = [(artifact_bytes(i["download_info"]["url"]), i["metadata"]["name"],
                     i["metadata"]["version"]) for i in json.load(f)["install"]]
    rows.sort(reverse=True)
    total = sum(n for n, _, _ in rows)
    print("| package | version | MB downloaded |\n|---|---|---|")
    for n, name, version in rows[:a.top]:
        print(f"| {name} | {version} | {n / 1e6:.1f} |")
    rest = rows[a.top:]
    print(f"| {len(rest)} others | | {sum(n for n, _, _ in rest) / 1e6:.1f} |")
    print(f"\n{len(rows)} packages, {total / 1e6:.0f} MB downloaded ({total / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
