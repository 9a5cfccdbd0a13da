"""``grpo-lab`` command line, generated from the config dataclasses.

Every field of ``TrainConfig`` / ``PretrainConfig`` becomes a ``--flag`` whose help is the
docstring under the field, so the CLI and the configs cannot drift apart.

    grpo-lab train [--preset tiny_cpu] [--resume] [--FIELD VALUE ...]
    grpo-lab eval --checkpoint PATH [--task addition]
    grpo-lab pretrain [--FIELD VALUE ...]
    grpo-lab bench [NAME [ARGS ...]]     # list bench/ scripts, or run bench/bench_NAME.py
    grpo-lab lab                         # JupyterLab on notebooks/

``bench`` and ``lab`` need a checkout of the repository (bench/ and notebooks/ sit beside
the package, not inside it).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from grpo_lab.config import PRESETS, PretrainConfig, TrainConfig, field_docs, preset, to_dict


def parse_weights(text: str) -> dict[str, float]:
    """``"accuracy=1,format=0.1"`` -> {"accuracy": 1.0, "format": 0.1}."""
    out = {}
    for part in text.split(","):
        name, sep, val = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected name=weight, got {part!r}")
        try:
            out[name.strip()] = float(val)
        except ValueError:
            raise argparse.ArgumentTypeError(f"weight of {name!r} is not a number: {val!r}")
    return out


def field_type(f: dataclasses.Field, default):
    """The type a flag's text converts to: the default's, or for ``X | None = None`` X."""
    if default is not None:
        return type(default)
    name = str(f.type).split("|")[0].strip()                               # "float | None"
    types = {"int": int, "float": float, "str": str}
    if name not in types:
        raise TypeError(f"field {f.name!r} of type {f.type!r} has no command-line form")
    return types[name]


def add_config_args(parser: argparse.ArgumentParser, cls, skip=()) -> None:
    """One ``--flag`` per field of ``cls`` (but ``skip``), default None (= the config's)."""
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kind = {dict: parse_weights, bool: lambda s: s.lower() in ("1", "true", "yes")}.get(
            type(default), field_type(f, default))
        shown = ",".join(f"{k}={v}" for k, v in default.items()) if isinstance(default, dict) \
            else default
        parser.add_argument(f"--{f.name}", type=kind, default=None,
                            help=f"{docs.get(f.name, '')} (default: {shown})".replace("%", "%%"))


def overrides(args, cls) -> dict:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
            if getattr(args, f.name, None) is not None}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpo-lab", description="GRPO workbench")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train the policy with GRPO and write its report")
    t.add_argument("--preset", default="tiny_cpu", choices=sorted(PRESETS),
                   help="named preset whose values the other flags override")
    t.add_argument("--resume", action="store_true",
                   help="continue exactly from out_dir/checkpoint.safetensors")
    add_config_args(t, TrainConfig)
    e = sub.add_parser("eval", help="held-out greedy accuracy of a policy or training checkpoint")
    e.add_argument("--checkpoint", default="data/base_policy.safetensors")
    e.add_argument("--task", default="addition",
                   help='a task, "a,b" for several, or "mixture" for the grouping mixture')
    e.add_argument("--eval_size", type=int, default=200)
    pre = sub.add_parser("pretrain", help="supervised warm-up of the base policy")
    add_config_args(pre, PretrainConfig)
    b = sub.add_parser("bench", help="list the bench/ scripts, or run bench/bench_NAME.py")
    b.add_argument("name", nargs="?", help="e.g. codecs, sharder, train_dist")
    b.add_argument("bench_args", nargs=argparse.REMAINDER, help="passed to the script")
    lab = sub.add_parser("lab", help="open JupyterLab on notebooks/")
    lab.add_argument("--workshop", action="store_true",
                     help="open fresh copies of the exercises (runs/workshop/) in a reset workspace")
    return p


def checkout_dir(name: str) -> Path:
    """``name`` (bench or notebooks) beside the installed package, in a repository checkout."""
    path = Path(__file__).resolve().parent.parent / name
    if not path.is_dir():
        raise FileNotFoundError(f"no {name}/ directory at {path}: 'grpo-lab {name}' needs a "
                                f"checkout of the grpo_lab repository (pip install -e .)")
    return path


def bench_scripts() -> dict[str, Path]:
    return {p.stem[len("bench_"):]: p for p in sorted(checkout_dir("bench").glob("bench_*.py"))}


def run_bench(name: str | None, bench_args: list[str]) -> int:
    scripts = bench_scripts()
    if name is None:
        for n, p in scripts.items():
            print(f"{n:16s} {p}")
        return 0
    if name not in scripts:
        raise ValueError(f"unknown bench {name!r}; known: {sorted(scripts)}")
    root = scripts[name].parent.parent                                     # run from the checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    return subprocess.call([sys.executable, str(scripts[name]), *bench_args], cwd=root, env=env)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            from grpo_lab.report import write_report
            from grpo_lab.trainer import train

            cfg = preset(args.preset, **overrides(args, TrainConfig))
            history = train(cfg, resume=args.resume)
            md = write_report(history, cfg.out_dir, to_dict(cfg))
            print(md.read_text().split("![")[0].strip())
            print(f"report: {md} and {md.with_suffix('.png')}")
        elif args.command == "eval":
            from grpo_lab.tasks import load_eval
            from grpo_lab.trainer import evaluate_tasks, load_policy_any, max_new_tokens

            cfg = TrainConfig(task=args.task)
            model = load_policy_any(args.checkpoint)
            sets = {t: load_eval(t)[:args.eval_size] for t in cfg.task_names}
            res = evaluate_tasks(model, sets, cfg.reward_weights, max_new_tokens(cfg))
            print(json.dumps({"checkpoint": args.checkpoint, "task": args.task, **res}))
        elif args.command == "pretrain":
            from grpo_lab.pretrain import main as pretrain_main

            pretrain_main(PretrainConfig(**overrides(args, PretrainConfig)))
        elif args.command == "bench":
            return run_bench(args.name, args.bench_args)
        elif args.command == "lab":
            notebooks = checkout_dir("notebooks")
            if args.workshop:
                from grpo_lab.workshop import lab_command
                return subprocess.call(lab_command(notebooks))
            return subprocess.call([sys.executable, "-m", "jupyterlab", str(notebooks)])
    except (ValueError, FileNotFoundError) as e:
        print(f"grpo-lab: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
