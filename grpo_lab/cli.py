"""``grpo-lab`` command line, generated from the config dataclasses.

Every field of ``TrainConfig`` / ``PretrainConfig`` becomes a ``--flag`` whose help is the
docstring under the field, so the CLI and the configs cannot drift apart; a sub-config's
fields are dotted (``--exchange.name sharded``).

    grpo-lab train [--preset tiny_cpu] [--resume] [--nproc N] [--FIELD VALUE ...]
    torchrun --nproc_per_node=N -m grpo_lab.cli train [...]   # the same run, N processes
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

from grpo_lab.config import (MOVED_FIELDS, PRESETS, SUB_CONFIGS, PretrainConfig, TrainConfig,
                             field_docs, migrate, preset, to_dict)
from grpo_lab.paths import checkout_dir


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


def parse_bool(text: str) -> bool:
    """true/false, 1/0, yes/no (any case) -> bool; anything else is an error naming the text."""
    t = text.strip().lower()
    if t in ("1", "true", "yes"):
        return True
    if t in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, 1/0 or yes/no, got {text!r}")


def field_type(f: dataclasses.Field, default):
    """The type a flag's text converts to: the default's, or for ``X | None = None`` X."""
    if default is not None:
        return type(default)
    name = str(f.type).split("|")[0].strip()                               # "float | None"
    types = {"int": int, "float": float, "str": str}
    if name not in types:
        raise TypeError(f"field {f.name!r} of type {f.type!r} has no command-line form")
    return types[name]


def add_config_args(parser: argparse.ArgumentParser, cls, skip=(), prefix: str = "") -> None:
    """One ``--flag`` per field of ``cls`` (but ``skip``), default None (= the config's); the
    fields of a sub-config dataclass become ``--field.sub``."""
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            add_config_args(parser, type(default), prefix=f"{prefix}{f.name}.")
            continue
        kind = {dict: parse_weights, bool: parse_bool}.get(type(default), field_type(f, default))
        shown = ",".join(f"{k}={v}" for k, v in default.items()) if isinstance(default, dict) \
            else default
        parser.add_argument(f"--{prefix}{f.name}", type=kind, default=None,
                            help=f"{docs.get(f.name, '')} (default: {shown})".replace("%", "%%"))
    if cls is TrainConfig:                        # one release: --vf_lr for --ppo.vf_lr, ...
        for old, (sub, new) in MOVED_FIELDS.items():
            default = getattr(getattr(cls(), sub), new)
            parser.add_argument(f"--{old}", type=field_type(None, default), default=None,
                                help=argparse.SUPPRESS)


def overrides(args, cls, prefix: str = "") -> dict:
    """The flags given on the command line -> {field: value}, sub-configs as nested dicts."""
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            sub = overrides(args, type(default), f"{prefix}{f.name}.")
            if sub:
                out[f.name] = sub
        elif getattr(args, prefix + f.name, None) is not None:
            out[f.name] = getattr(args, prefix + f.name)
    if cls is TrainConfig:
        out.update({old: getattr(args, old) for old in MOVED_FIELDS
                    if getattr(args, old, None) is not None})
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpo-lab", description="GRPO workbench")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train the policy with GRPO and write its report")
    t.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help="named preset whose values the other flags override (default tiny_cpu)")
    t.add_argument("--resume", action="store_true",
                   help="continue exactly from out_dir/checkpoint.safetensors, with the config "
                        "saved there (a flag that changes it is an error, unless --override)")
    t.add_argument("--override", action="store_true",
                   help="with --resume: let the flags given change the saved config (recorded "
                        "in metrics.jsonl as resume/overrides and in the report)")
    t.add_argument("--plugin", action="append", default=None, metavar="MODULE",
                   help="import this module (a name or a .py path) first, so the groupers, "
                        "tasks, rewards and estimators it registers can be named; repeatable")
    t.add_argument("--nproc", type=int, default=None,
                   help="run on N local processes through torch's launcher (torchrun "
                        "--standalone --nproc_per_node=N); results do not depend on N")
    add_config_args(t, TrainConfig)
    e = sub.add_parser("eval", help="held-out greedy accuracy of a policy or training checkpoint")
    e.add_argument("--checkpoint", default="data/base_policy.safetensors")
    e.add_argument("--task", default="addition",
                   help='a task, "a,b" for several, or "mixture" for the grouping mixture')
    e.add_argument("--eval_size", type=int, default=200)
    pre = sub.add_parser("pretrain", help="supervised warm-up of the base policy")
    add_config_args(pre, PretrainConfig)
    b = sub.add_parser("bench", help="list the bench/ scripts, or run bench/bench_NAME.py")
    b.add_argument("name", nargs="?", help="e.g. codecs, sharder, train_dist, scaling")
    b.add_argument("bench_args", nargs=argparse.REMAINDER, help="passed to the script")
    lab = sub.add_parser("lab", help="open JupyterLab on notebooks/")
    lab.add_argument("--workshop", action="store_true",
                     help="open fresh copies of the exercises (runs/workshop/) in a reset workspace")
    for cmd in (t, e, pre):
        cmd.add_argument("--debug", action="store_true",
                         help="show the full traceback of an error (default: one clear line)")
    return p


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


def launch_torchrun(nproc: int, argv: list[str]) -> int:
    """``grpo-lab train --nproc N ...`` -> torch's own launcher running ``-m grpo_lab.cli
    train ...`` on N local processes (``torch.distributed.run``, what ``torchrun`` calls)."""
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    from torch.distributed import run as torchrun

    rest, skip = [], False
    for a in argv:                                    # drop --nproc N / --nproc=N
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            rest.append(a)
    try:
        torchrun.main(["--standalone", f"--nproc_per_node={nproc}", "-m", "grpo_lab.cli", *rest])
    except Exception as e:                            # ChildFailedError: a rank failed
        print(f"grpo-lab: error: a training process failed: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1
    return 0


def train_config(args) -> TrainConfig:
    """The run's config: preset + flags, or with --resume the saved config + flags."""
    given = overrides(args, TrainConfig)
    if args.plugin:                                   # --plugin a --plugin b -> plugins "a,b"
        given["plugins"] = ",".join(filter(None, [given.get("plugins", ""), *args.plugin]))
    if not args.resume:
        return preset(args.preset or "tiny_cpu", **given)
    from grpo_lab.checkpoint import read_training_checkpoint
    from grpo_lab.config import from_dict

    if args.preset is not None:
        raise ValueError(f"--preset {args.preset} with --resume: a resumed run takes its saved "
                         f"config; change fields with flags and --override")
    out_dir = given.get("out_dir", TrainConfig().out_dir)
    saved = read_training_checkpoint(Path(out_dir) / "checkpoint.safetensors")["config"]
    saved, given = migrate(saved), migrate(given)     # flat names of older configs
    merged = {**saved, **given}
    for sub in SUB_CONFIGS:
        if sub in given:
            merged[sub] = {**saved.get(sub, {}), **given[sub]}
    return from_dict(merged)


def run_train(cfg: TrainConfig, resume: bool, allow_override: bool = False) -> int:
    """Train in this process; under torchrun (RANK in the environment) join its group first."""
    from grpo_lab.report import write_report
    from grpo_lab.trainer import train

    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = 0
    if distributed:
        import torch.distributed as dist

        from grpo_lab.distributed.launch import init_from_env
        rank, _, _ = init_from_env(timeout_s=cfg.exchange.timeout_s)
    try:
        history = train(cfg, resume=resume, allow_override=allow_override)
    finally:
        if distributed:
            dist.destroy_process_group()
    if rank == 0:
        md = write_report(history, cfg.out_dir, to_dict(cfg))
        print(md.read_text().split("![")[0].strip())
        print(f"report: {md} and {md.with_suffix('.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            if args.override and not args.resume:
                raise ValueError("--override only applies with --resume")
            cfg = train_config(args)
            if args.nproc is not None:
                return launch_torchrun(args.nproc, argv if argv is not None else sys.argv[1:])
            return run_train(cfg, args.resume, args.override)
        elif args.command == "eval":
            from grpo_lab.task_data import load_eval
            from grpo_lab.policy import load_policy_any
            from grpo_lab.trainer import evaluate_tasks, max_new_tokens

            cfg = TrainConfig(task=args.task)
            if args.eval_size < 1:
                raise ValueError(f"--eval_size must be >= 1, got {args.eval_size}")
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
    except KeyboardInterrupt:
        print("grpo-lab: interrupted; the last checkpoint (if any) is intact: continue with "
              "--resume", file=sys.stderr)
        return 130
    except (ValueError, OSError, FloatingPointError, RuntimeError) as e:
        if getattr(args, "debug", False):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"grpo-lab: error: {type(e).__name__}: {first} (--debug shows the traceback)",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
