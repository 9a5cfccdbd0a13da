"""The fast path of this machine, chosen by measurement: a short probe times each phase of a
step of the run's own transformers model under each candidate setting and keeps the fastest
that passes the accuracy check (``TrainConfig.speed.fast_path="probe"``, ``grpo-lab preflight``).

Why measure: the fastest settings differ from one CPU to the next and cannot be read off its
flags. On an AVX2-only EPYC a bf16 matmul is emulated (4-9x slower than fp32); on an EPYC with
AVX512_BF16 a bare bf16 matmul is 2-2.8x faster, yet grpo_lab's bf16 sampling copy was no
faster than fp32 there (before the lean decoder ran on a bf16 copy); on an AMX Xeon
bf16 autocast made a SmolLM2 step slower (13.2 s vs 10.5 s). So the probe times, on the run's
model:

    rollout   sample(B prompts x G completions, max_new tokens), no grad, one per mode:
                fp32        the master weights (the lean decoder: decoder.py)
                bf16 copy   hf.sample_dtype="bfloat16" (a bf16 copy of the weights, the
                            lean decoder on it)
                autocast    hf.autocast=True (every forward under bf16 autocast)
    update    completion_logprobs + backward of sum(logp * A) on that rollout:
                fp32, autocast
    threads   each of the above with 1 thread and with every core (the phase's best is kept)

Each (phase, mode, threads) is timed ``rounds`` times, interleaved (round r times every
candidate once before round r + 1), after one untimed warm-up of each; the median is kept. A
setting of the run is (hf.sample_dtype, hf.autocast): its rollout is the bf16 copy when
sample_dtype is set, else autocast or fp32; its update is autocast or fp32. Its estimated step
is its rollout + its update, each at its best thread count.

Accuracy check (the bound of tests/test_speed_levers.py::test_bf16_paths_stay_close_to_fp32):
on the fp32 rollout, the mean |log-prob difference| over completion tokens of the bf16 copy,
and of the autocast training forward, against fp32 must stay below ``LOGP_TOLERANCE`` nats;
a mode that fails it is never chosen.

The choice: the fastest setting whose modes pass, if its estimated step beats the default's
(fp32, no autocast, the threads ``threads=0`` gives a run started now: ``free_cores``) by more
than ``MARGIN``; else the default (and the run's own threads). So the probe never picks something it measured as slower than the default, and a
difference inside the timing noise of a shared machine keeps the default.

Opt-in, not the default: bf16 sampling and autocast change the numbers a seeded run produces
(other tokens are sampled), so the default would make one command give different results on
two machines, and a probe measured while other processes load the CPU can mislead (its record
says the load). A learner or a study opts in with ``--speed.fast_path probe``.

Cached per machine: ``cache_dir()/fast_path/<key>.json``, the key a hash of the CPU's model
name and flags, torch's version and CPU capability, the model (base checkpoint, LoRA rank) and
the probe's batch shape; a second run on the same machine reads it (``refresh`` probes again).

Not probed: vLLM as the sampler (where it is installed the record notes it; it needs tis.cap
> 0 and its own environment, bench/bench_vllm.py measures it).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from grpo_lab.machine import free_cores

__all__ = ["probe", "choose", "apply", "machine_id", "cache_path", "LOGP_TOLERANCE", "MARGIN",
           "ROLLOUT_MODES", "UPDATE_MODES", "choice_line"]

LOGP_TOLERANCE = 0.05
"""Mean |log-prob difference| (nats per completion token) a bf16 mode may have against fp32:
tests/test_speed_levers.py's bound (bf16 keeps 8 significant bits; measured 0.005-0.02 on the
tiny model)."""
MARGIN = 0.05
"""A setting replaces the default only when its estimated step is more than 5% faster."""
ROLLOUT_MODES = {"fp32": {"sample_dtype": "", "autocast": False},
                 "bf16 copy": {"sample_dtype": "bfloat16", "autocast": False},
                 "autocast": {"sample_dtype": "", "autocast": True}}
UPDATE_MODES = {"fp32": {"autocast": False}, "autocast": {"autocast": True}}
SETTINGS = [("", False), ("", True), ("bfloat16", False), ("bfloat16", True)]
"""(hf.sample_dtype, hf.autocast) of each setting the probe can choose; the first is the default."""
PROBE_PROMPTS, PROBE_G, PROBE_TOKENS = 4, 8, 32
"""The probe's batch: the run's own prompts x completions x new tokens, at most this many. Not
a smaller batch: how much bf16 gains depends on the shape of the matrix products, not only on
their size. On an AMX Xeon (BENCHMARKS section 32) SmolLM2's autocast update ran 1.04x as fast
as fp32's at 2 x 4 x 16 and 0.94x at 2 x 8 x 16, but 1.52x at 4 x 4 x 24 and 1.61x at
4 x 8 x 24: a probe at 2 x 4 x 16 kept fp32 where bf16 + autocast ran the run's step 1.19x
faster. The shape is in the cache key, so a run of another shape probes again."""
VERSION = 1                        # of the cached record's layout: a new layout probes again


def machine_id() -> dict:
    """What decides which path is fastest here: the CPU's model name and flags (Linux
    /proc/cpuinfo; platform.processor() elsewhere), torch's version and CPU capability."""
    model, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == (platform.processor() or
                                                         platform.machine()):
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return {"cpu": model, "flags": flags, "cores": os.cpu_count() or 1,
            "torch": torch.__version__,
            "capability": torch.backends.cpu.get_cpu_capability()}


def cache_dir() -> Path:
    """$GRPO_LAB_CACHE/fast_path, else ~/.cache/grpo_lab/fast_path (beside the models)."""
    env = os.environ.get("GRPO_LAB_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "grpo_lab") / "fast_path"


def _shape(cfg) -> dict:
    from grpo_lab.training.step import max_new_tokens
    return {"B": min(cfg.prompts_per_step, PROBE_PROMPTS), "G": min(cfg.group_size, PROBE_G),
            "max_new": min(max_new_tokens(cfg), PROBE_TOKENS)}


def cache_path(cfg) -> Path:
    """The record of ``cfg``'s probe on this machine (its key: module docstring)."""
    key = {"machine": machine_id(), "model": str(cfg.base_checkpoint), "lora_r": cfg.hf.lora_r,
           "chat_template": cfg.hf.chat_template, "task": cfg.task,
           "answer_format": cfg.answer_format, "update_forward": cfg.speed.update_forward,
           "shape": _shape(cfg), "version": VERSION}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    name = Path(str(cfg.base_checkpoint).rstrip("/\\")).name or "model"
    return cache_dir() / f"{name}-{digest}.json"


def measure(phase: str, mode: str, threads: int, fn) -> float:
    """Seconds one call of ``fn`` takes (the tests replace this to set the timings)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _prompts(policy, cfg, n: int) -> list[list[int]]:
    from grpo_lab.tasks.instruct import render_all
    from grpo_lab.tasks.task_data import load_eval
    exs = render_all(load_eval(cfg.task_names[0])[:n], cfg.answer_format)
    return [policy.encode(e.prompt) for e in exs]


def _set_mode(policy, **fields) -> None:
    for k, v in fields.items():
        setattr(policy.cfg, k, v)


def _update(policy, r, cfg) -> None:
    from grpo_lab.algorithm.rollout import completion_logprobs
    from grpo_lab.policies.engine import UPDATE_FORWARDS
    policy.train()
    policy.zero_grad(set_to_none=True)
    logp = completion_logprobs(policy, r, cfg.temperature,
                               forward=UPDATE_FORWARDS[cfg.speed.update_forward])       # (N, Tc)
    adv = torch.linspace(-1, 1, logp.shape[0])                                          # (N,)
    (logp * adv[:, None] * r.completion_mask).sum().backward()
    policy.zero_grad(set_to_none=True)


def _accuracy(policy, r, cfg) -> dict:
    """Mean |log-prob - fp32's| over completion tokens: the bf16 copy (sampling) and the
    autocast training forward (the update)."""
    from grpo_lab.algorithm.rollout import completion_logprobs
    m = r.completion_mask                                                   # (N, Tc)
    out = {}
    for name, train in (("fp32", False), ("bf16 copy", False), ("autocast", True)):
        _set_mode(policy, **ROLLOUT_MODES[name])
        policy.train(train)
        with torch.set_grad_enabled(train):
            out[name] = completion_logprobs(policy, r, cfg.temperature).detach()   # (N, Tc)
    _set_mode(policy, **ROLLOUT_MODES["fp32"])
    return {k: float((v - out["fp32"])[m].abs().mean()) for k, v in out.items() if k != "fp32"}


def probe(cfg, rounds: int = 2, threads: list[int] | None = None) -> dict:
    """Time every candidate on ``cfg``'s model (module docstring) -> the record: the
    machine, the load, the medians {phase: {mode: {threads: s}}}, the accuracy check, each
    setting's estimate and the choice."""
    from grpo_lab.algorithm.rollout import DRAWS, sample
    from grpo_lab.policies.policy import load_for
    from grpo_lab.training.step import prompt_generators
    if cfg.policy != "hf":
        raise ValueError(f"speed.fast_path='probe' times a transformers model's phases; policy="
                         f"{cfg.policy!r} has none of its candidates (use policy='hf')")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    was = torch.get_num_threads()
    default_threads = free_cores()             # what threads=0 gives a run started now
    threads = sorted(set(threads or {1, default_threads, os.cpu_count() or 1}) | {default_threads})
    shape = _shape(cfg)
    base = dataclasses.replace(cfg, hf=dataclasses.replace(cfg.hf, sample_dtype="",
                                                           autocast=False))
    policy = load_for(base)
    ps = _prompts(policy, cfg, shape["B"])
    gens = lambda: prompt_generators(cfg.seed, 0, 0, range(len(ps)))    # noqa: E731
    draw, drop = DRAWS[cfg.sampler.draw], cfg.sampler.drop_finished
    r = sample(policy, ps, shape["G"], shape["max_new"], cfg.temperature,
               generator=gens(), draw=draw, drop_finished=drop)
    errors = _accuracy(policy, r, cfg)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3

    def rollout(mode):
        def go():
            _set_mode(policy, **ROLLOUT_MODES[mode])
            sample(policy, ps, shape["G"], shape["max_new"], cfg.temperature,
                   generator=gens(), draw=draw, drop_finished=drop)
        return go

    def update(mode):
        def go():
            _set_mode(policy, sample_dtype="", **UPDATE_MODES[mode])
            _update(policy, r, cfg)
        return go
    cands = ([("rollout", m, t, rollout(m)) for m in ROLLOUT_MODES for t in threads]
             + [("update", m, t, update(m)) for m in UPDATE_MODES for t in threads])
    times: dict = {}
    try:
        for rnd in range(rounds + 1):                # round 0: the warm-up, not kept
            for phase, mode, t, fn in cands:
                torch.set_num_threads(t)
                s = measure(phase, mode, t, fn)
                if rnd:
                    times.setdefault(phase, {}).setdefault(mode, {}).setdefault(t, []).append(s)
    finally:
        torch.set_num_threads(was)
        _set_mode(policy, **ROLLOUT_MODES["fp32"])
    medians = {ph: {m: {t: statistics.median(v) for t, v in ts.items()} for m, ts in ms.items()}
               for ph, ms in times.items()}
    record = {"version": VERSION, "machine": machine_id(), "load": list(load),
              "model": str(cfg.base_checkpoint), "shape": shape, "rounds": rounds,
              "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "seconds": {ph: {m: {str(t): s for t, s in ts.items()} for m, ts in ms.items()}
                          for ph, ms in medians.items()},
              "logp_error": errors, "tolerance": LOGP_TOLERANCE,
              "vllm": ("installed, not probed (bench/bench_vllm.py)"
                       if importlib.util.find_spec("vllm") else "not installed")}
    record.update(choose(medians, errors, default_threads))
    return record


def _rollout_mode(sample_dtype: str, autocast: bool) -> str:
    return "bf16 copy" if sample_dtype else "autocast" if autocast else "fp32"


def choose(medians: dict, errors: dict, default_threads: int) -> dict:
    """Each setting's estimate and the choice (module docstring) from the probe's medians
    {phase: {mode: {threads: s}}} and the accuracy check {mode: mean |diff|}."""
    passes = {"fp32": True, **{m: e < LOGP_TOLERANCE for m, e in errors.items()}}
    settings = []
    for sd, ac in SETTINGS:
        ro, up = _rollout_mode(sd, ac), "autocast" if ac else "fp32"
        (t_r, s_r), (t_u, s_u) = (min(medians[ph][m].items(), key=lambda kv: (kv[1], kv[0]))
                                  for ph, m in (("rollout", ro), ("update", up)))
        settings.append({"sample_dtype": sd, "autocast": ac, "rollout": ro, "update": up,
                         "rollout_threads": t_r, "threads": t_u, "step_s": s_r + s_u,
                         "passes": passes[ro] and passes[up]})
    default = settings[0]
    default_s = (medians["rollout"]["fp32"][default_threads]
                 + medians["update"]["fp32"][default_threads])
    best = min((s for s in settings if s["passes"]), key=lambda s: s["step_s"])
    chosen = best if best["step_s"] < (1 - MARGIN) * default_s else dict(
        default, rollout_threads=0, threads=0, step_s=default_s)      # 0: the run's own threads
    keys = ("sample_dtype", "autocast", "rollout_threads", "threads")
    return {"settings": settings, "default_step_s": default_s,
            "choice": {k: chosen[k] for k in keys}, "choice_step_s": chosen["step_s"],
            "speedup": default_s / chosen["step_s"]}


def choice_line(record: dict) -> str:
    """One line: what was chosen, by how much, on which CPU and load."""
    c, m = record["choice"], record["machine"]
    sampling = _rollout_mode(c["sample_dtype"], c["autocast"])
    update = "autocast" if c["autocast"] else "fp32"
    threads = (f"threads {c['rollout_threads']} (rollout) / {c['threads']} (update)"
               if c["threads"] else "the run's own threads")
    return (f"sampling {sampling}, update {update}, {threads}: probe step "
            f"{record['choice_step_s']:.3f} s vs the default's {record['default_step_s']:.3f} s "
            f"({record['speedup']:.2f}x) on {m['cpu']} ({m['capability']}), load "
            f"{record['load'][0]:.2f}")


def cached(cfg, refresh: bool = False, say=print) -> dict:
    """``cfg``'s probe record on this machine: read from the cache, else probed now and kept."""
    path = cache_path(cfg)
    if path.exists() and not refresh:
        try:
            record = json.loads(path.read_text())
            if record.get("version") == VERSION:
                return record
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass                                       # a corrupt record: probe again
    say(f"grpo-lab: probing the fast path of {cfg.base_checkpoint} on this machine (once; "
        f"cached in {path})")
    record = probe(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return record


def apply(cfg, record: dict):
    """``cfg`` with the record's choice: hf.sample_dtype, hf.autocast, threads,
    speed.rollout_threads."""
    c = record["choice"]
    return dataclasses.replace(cfg, hf=dataclasses.replace(
        cfg.hf, sample_dtype=c["sample_dtype"], autocast=c["autocast"]),
        threads=c["threads"] or cfg.threads, speed=dataclasses.replace(
            cfg.speed, rollout_threads=c["rollout_threads"] or cfg.speed.rollout_threads))


def for_run(cfg, resume: bool = False):
    """The trainer's entry (``speed.fast_path="probe"``) -> (``cfg`` with the choice applied, the
    record for config.json). A resumed run keeps the record its config.json holds, so it goes
    on with the path it started with."""
    from grpo_lab.distributed.group import Group
    from grpo_lab.training.config import CONFIG_FILE
    from grpo_lab.training.config_file import FAST_PATH_KEY
    if Group.current().world > 1:
        raise ValueError("speed.fast_path='probe' times one process's phases; under a process group "
                         "every rank would probe apart: set the probe's choice by hand "
                         "(hf.sample_dtype, hf.autocast, threads) or run one process")
    record = None
    saved = Path(cfg.out_dir) / CONFIG_FILE
    if resume and saved.exists():
        try:
            record = json.loads(saved.read_text()).get(FAST_PATH_KEY)
        except (json.JSONDecodeError, UnicodeDecodeError):
            record = None
    record = record or cached(cfg)
    return apply(cfg, record), record
