"""``grpo-lab study``: one command per study, ``experiments.run_experiment`` from a shell.

    grpo-lab study --base smollm_cpu --seeds 3 --steps 16 --out_dir runs/clip \
        --arm symmetric --arm clip_higher eps_high=0.28 --plugin my_lab.py [--resume]

An arm is ``--arm NAME [KEY=VALUE ...]``, repeated: the name, then TrainConfig fields in the
flags' spelling (``eps_high=0.28``, ``reward_weights=accuracy=1,format=0.1``, ``hf.lora_r=8``),
parsed as the ``train`` flags are; ``--set KEY=VALUE ...`` applies to every arm. Seeds are
0..N-1. The table, each arm's paired difference from the first arm and the forecast go to
the terminal and to out_dir/results.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def add_study_args(s: argparse.ArgumentParser) -> None:
    from grpo_lab.cli import add_plugin_arg
    from grpo_lab.training.config import PRESETS

    s.add_argument("--base", default="defaults", choices=sorted(PRESETS),
                   help="the preset every arm starts from (default: defaults)")
    s.add_argument("--arm", nargs="+", action="append", required=True,
                   metavar="NAME_OR_KEY=VALUE",
                   help="one arm: its name, then KEY=VALUE config fields; repeat per arm")
    s.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config fields for every arm (the study's base overrides)")
    s.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per arm (default 3)")
    s.add_argument("--steps", type=int, default=None, help="steps of every run")
    s.add_argument("--out_dir", required=True, help="the study's folder")
    s.add_argument("--resume", action="store_true",
                   help="continue the study in out_dir: only runs without a result run")
    s.add_argument("--processes", type=int, default=None,
                   help="runs at once (default: one per core); threads = cores // processes")
    s.add_argument("--target", type=float, default=None,
                   help="held-out accuracy whose steps-to-reach each run reports")
    s.add_argument("--pilot_steps", type=int, default=2,
                   help="steps of the pilot that forecasts cost and power (0: none)")
    s.add_argument("--sd", type=float, default=None,
                   help="seed-to-seed sd of a paired difference in eval/accuracy (else the "
                        "pilot's)")
    s.add_argument("--effect", type=float, default=None,
                   help="a difference in eval/accuracy to find the seeds for (80%% power)")
    s.add_argument("--start_method", default=None, choices=("fork", "spawn", "forkserver"),
                   help="how worker processes start (default fork where there is one)")
    s.add_argument("--debug", action="store_true", help="show tracebacks")
    add_plugin_arg(s)


def parse_fields(pairs: list[str], where: str) -> dict:
    """["eps_high=0.28", "hf.lora_r=8"] -> TrainConfig overrides, typed as the train flags
    are; an unknown field or a bad value is an error naming it and ``where``."""
    from grpo_lab.cli import add_config_args, overrides
    from grpo_lab.training.config import TrainConfig

    p = argparse.ArgumentParser(prog=where, add_help=False, exit_on_error=False)
    add_config_args(p, TrainConfig, skip=("plugins",))
    argv = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{where}: expected KEY=VALUE, got {pair!r}")
        if f"--{key}" not in p._option_string_actions:
            raise ValueError(f"{where}: unknown config field {key!r} (in {pair!r})")
        argv += [f"--{key}", value]
    try:
        args, rest = p.parse_known_args(argv)
    except argparse.ArgumentError as e:
        raise ValueError(f"{where}: {e}") from None
    if rest:
        raise ValueError(f"{where}: could not read {rest}")
    return overrides(args, TrainConfig)


def arms(specs: list[list[str]]) -> dict[str, dict]:
    """[["clip_higher", "eps_high=0.28"], ["symmetric"]] -> {name: overrides}."""
    out: dict[str, dict] = {}
    for spec in specs:
        name, pairs = spec[0], spec[1:]
        if "=" in name:
            raise ValueError(f"--arm {' '.join(spec)}: an arm starts with its name, got {name!r}")
        if name in out:
            raise ValueError(f"--arm {name!r} is given twice")
        out[name] = parse_fields(pairs, f"--arm {name}")
    return out


def run_study(args) -> int:
    from grpo_lab.cli import plugin_spec
    from grpo_lab.training.experiments import difference_sentence, run_experiment

    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    base = parse_fields(args.set, "--set")
    if args.steps is not None:
        base["steps"] = args.steps
    if args.plugin:
        base["plugins"] = plugin_spec(args)
    res = run_experiment(arms(args.arm), seeds=range(args.seeds), base=base,
                         processes=args.processes, target=args.target,
                         base_preset=args.base, out_dir=args.out_dir, resume=args.resume,
                         pilot_steps=args.pilot_steps, sd=args.sd, effect=args.effect,
                         start_method=args.start_method)
    names = res.strategies
    lines = [res.to_markdown(), "", res._legend(), ""]
    lines += [difference_sentence(res.compare(n, names[0])) for n in names[1:]]
    lines += [f"note: {n}" for n in res.notes] + (res.plan or {}).get("lines", [])
    text = "\n".join(lines)
    print(text)
    Path(args.out_dir, "results.md").write_text(text + "\n")
    return 0
