"""One GRPO step of a real HF model on the CPU, by phase: grpo_lab's speed levers one at a
time, grpo_lab vs TRL 1.16 with the same precision, and the step's FLOPs against this CPU's
measured matmul throughput (issue 22; BENCHMARKS.md section 15).

Every run is a child process (spawned), so its peak resident memory (ru_maxrss) is its own;
runs of one table are interleaved round by round, so load drifts hit every column. Per-step
times are medians over the steps after the first (step 0 pays one-off costs: the bf16
sampling copy, allocator warm-up). The machine is shared: read ratios within a table.

    # the profile: each lever alone on top of "before", then all of them ("after")
    PYTHONPATH=. benchvenv/bin/python bench/bench_hf_speed.py profile \\
        --model /work/models/smollm2-135m-instruct --steps 3 --rounds 1
    # grpo_lab ("after" levers) vs TRL, beta 0 and 0.04, full and LoRA, bf16 on both sides
    PYTHONPATH=. benchvenv/bin/python bench/bench_hf_speed.py trl \\
        --model /work/models/smollm2-135m-instruct --steps 3 --rounds 3
    PYTHONPATH=. benchvenv/bin/python bench/bench_hf_speed.py matmul     # GFLOP/s fp32, bf16
    PYTHONPATH=. benchvenv/bin/python bench/bench_hf_speed.py adamw      # AdamW variants, CPU s
    PYTHONPATH=. benchvenv/bin/python bench/bench_hf_speed.py finite     # the finite check, CPU s
    PYTHONPATH=. .venv/bin/python bench/bench_hf_speed.py decode         # one decode step, ms
    PYTHONPATH=. .venv/bin/python bench/bench_hf_speed.py int8           # int8 sampler: speed, KL

Needs the bench venv (trl 1.16.0, peft) for ``trl``; ``profile`` and ``matmul`` run in .venv.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES = ("time/prefill_s", "time/decode_forward_s", "time/decode_sample_s",
          "time/decode_cache_s", "time/ref_s", "time/loss_forward_s", "time/backward_s",
          "time/optimizer_s", "time/check_s")
BEFORE = {"sampler": {"draw": "race", "drop_finished": False},
          "speed": {"update_forward": "all_positions"},
          "hf": {"sample_dtype": "", "autocast": False, "decoder": "transformers"}}
LEAN = {"hf": {"decoder": "lean"}}              # the third round's lever: policies/decoder.py
LEVERS = {                                      # name -> overrides on top of BEFORE
    "before": {},
    "inverse-CDF draw": {"sampler": {"draw": "inverse_cdf"}},
    "drop finished rows": {"sampler": {"drop_finished": True}},
    "logits on the completion only": {"speed": {"update_forward": "completion"}},
    "prompt once in the update": {"speed": {"update_forward": "prompt_once"}},
    "bf16 sampling copy": {"hf": {"sample_dtype": "bfloat16"}},
    "bf16 autocast (every forward)": {"hf": {"autocast": True}},
    "after (fp32 levers)": {"sampler": {"draw": "inverse_cdf", "drop_finished": True},
                            "speed": {"update_forward": "prompt_once"}},
    "packed update forward": {"speed": {"update_forward": "packed"}},
    "after (all)": {"sampler": {"draw": "inverse_cdf", "drop_finished": True},
                    "speed": {"update_forward": "packed"},
                    "hf": {"sample_dtype": "bfloat16", "autocast": True, **LEAN["hf"]}},
}
AFTER = LEVERS["after (all)"]
# the second round of levers (issue 22, the update): each is on in grpo_lab's code; a bench
# run names the ones it turns back off ("undo"), so each is measured alone against the others
UNDO = ("fused AdamW", "chosen log-prob", "summed finite check")
LEVERS.update({                 # on top of "after (fp32 levers)" (the update forward prompt_once)
    "after: none of the update levers": {"undo": UNDO},
    "+ fused AdamW": {"undo": ("chosen log-prob", "summed finite check")},
    "+ chosen log-prob": {"undo": ("fused AdamW", "summed finite check")},
    "+ summed finite check": {"undo": ("fused AdamW", "chosen log-prob")},
    "+ packed update forward": {"undo": UNDO, "speed": {"update_forward": "packed"}},
    "after: all update levers": {"speed": {"update_forward": "packed"}},
})
for _k in list(LEVERS)[-6:]:
    LEVERS[_k] = {**LEVERS["after (fp32 levers)"], **LEVERS[_k]}
LEVERS["+ lean decoder"] = {**LEVERS["after: all update levers"], **LEAN}   # the third round


def _old_chosen_logprobs(logits, ids, temperature=1.0, with_entropy=True):
    """engine.chosen_logprobs as rollout.completion_logprobs called it before the 'chosen
    log-prob' lever: autograd's log_softmax -> gather, the entropy from exp * logp (no graph),
    computed whether asked or not."""
    import torch.nn.functional as F
    logp = F.log_softmax(logits.float() / temperature, -1)                 # (N, Tc, V)
    tok_logp = logp.gather(2, ids[..., None]).squeeze(2)                   # (N, Tc)
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)                             # (N, Tc)
    return tok_logp, entropy


def _old_first_non_finite(named):
    """exchanges.first_non_finite before the 'summed finite check' lever: isfinite -> all."""
    for name, t in named:
        if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None


def undo_levers(names) -> None:
    """Turn the named update levers back off in this (child) process."""
    import dataclasses

    import grpo_lab.distributed.exchanges as exchanges
    import grpo_lab.policies.policy as policy
    import grpo_lab.algorithm.rollout as rollout
    for name in names:
        if name == "fused AdamW":
            policy.POLICIES["hf"] = dataclasses.replace(policy.POLICIES["hf"], fused_adamw=False)
        elif name == "chosen log-prob":
            rollout.chosen_logprobs = _old_chosen_logprobs
        elif name == "summed finite check":
            exchanges.first_non_finite = _old_first_non_finite
        else:
            raise ValueError(f"no update lever {name!r}; known: {UNDO}")


# ---- one run in a child process: rows per step + peak RSS

class HeadClock:
    """Global forward hooks that time the output head (a Linear with vocab-size outputs):
    seconds without gradients (sampling, reference) and with (the update's forward)."""

    def __init__(self, vocab: int):
        self.vocab, self.t0, self.s = vocab, {}, {"head_nograd_s": 0.0, "head_grad_s": 0.0}
        from torch.nn.modules.module import (register_module_forward_hook,
                                             register_module_forward_pre_hook)
        self.h = [register_module_forward_pre_hook(self.pre),
                  register_module_forward_hook(self.post)]

    def is_head(self, m) -> bool:
        return isinstance(m, torch.nn.Linear) and m.out_features == self.vocab

    def pre(self, m, args):
        if self.is_head(m):
            self.t0[id(m)] = time.perf_counter()

    def post(self, m, args, out):
        if self.is_head(m):
            k = "head_grad_s" if torch.is_grad_enabled() else "head_nograd_s"
            self.s[k] += time.perf_counter() - self.t0.pop(id(m))

    def take(self) -> dict:
        out, self.s = self.s, dict.fromkeys(self.s, 0.0)
        return out


def grpo_lab_run(a, beta: float, levers: dict, lora_r: int = 0, seed: int = 0) -> dict:
    from bench_hf_trl import WEIGHTS

    from grpo_lab.training.config import merge, preset
    from grpo_lab.training.trainer import train
    torch.set_num_threads(a.threads)
    import dataclasses

    import grpo_lab.training.step as step_mod
    levers = dict(levers)
    undo_levers(levers.pop("undo", ()))
    clock = HeadClock(_vocab(a.model))
    heads, cpu, rollout_cpu = [], [time.process_time()], []
    collect = step_mod.OBJECTIVES["grpo"].collect

    def timed_collect(*args, **kw):                 # the rollout's CPU seconds
        c = time.process_time()
        out = collect(*args, **kw)
        rollout_cpu.append(time.process_time() - c)
        return out

    import grpo_lab.training.trainer as trainer_mod
    save, saving = trainer_mod._checkpoint, [0.0]

    def timed_save(*args, **kw):                    # the run's last checkpoint: not a step's work
        c = time.process_time()                     # (TRL's side saves nothing)
        save(*args, **kw)
        saving[0] += time.process_time() - c

    def on_step(m, p):
        heads.append({**clock.take(), "cpu_s": time.process_time() - cpu[-1] - saving[0]})
        saving[0] = 0.0
        cpu.append(time.process_time())

    trainer_mod._checkpoint = timed_save

    step_mod.OBJECTIVES["grpo"] = dataclasses.replace(step_mod.OBJECTIVES["grpo"],
                                                      collect=timed_collect)
    with tempfile.TemporaryDirectory() as d:
        c = preset("hf_tiny_cpu", **{
            "base_checkpoint": a.model, "out_dir": d, "steps": a.steps, "lr": a.lr,
            "prompts_per_step": a.B, "group_size": a.G, "max_new_tokens": a.max_new,
            "temperature": 1.0, "kl": {"beta": beta}, "seed": seed, "eval_size": 0, "eval_every": 0,
            "reward_weights": WEIGHTS, "time_budget_s": 0.0, "ckpt_every": 10 ** 6,
            "threads": a.threads, "warmup_steps": 0,
            **merge({"hf": {"chat_template": a.chat_template, "lora_r": lora_r}}, BEFORE, levers)})
        cpu[0] = time.process_time()
        h = train(c, progress=False, on_step=on_step)
    rows = [{**{k: x.get(k, 0.0) for k in PHASES}, **hd, "step_s": x["time/step_s"],
             "rollout_s": x["time/rollout_s"], "rollout_cpu_s": rc,
             "mean_len": x["completion/mean_len"]}
            for x, hd, rc in zip(h[1:], heads, rollout_cpu)]
    return {"rows": rows}


def _vocab(model: str) -> int:
    import json
    return json.loads((Path(model) / "config.json").read_text())["vocab_size"]


def trl_run(a, beta: float, lora_r: int = 0, seed: int = 0) -> dict:
    from bench_hf_trl import trl_steps
    torch.set_num_threads(a.threads)
    extra = {}
    if lora_r:
        from peft import LoraConfig
        extra["peft_config"] = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0,
                                          target_modules="all-linear", task_type="CAUSAL_LM")
    rows = trl_steps(a, beta, a.steps, seed, bf16=a.bf16, warmup_steps=0, trainer_kw=extra)
    return {"rows": rows}


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB (Linux's ru_maxrss is in KB); nan where the
    ``resource`` module does not exist (Windows: the tables then print "nan MB")."""
    try:
        import resource
    except ImportError:
        return float("nan")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(q, fn, args, kw):
    try:
        out = fn(*args, **kw)
        out["peak_rss_mb"] = peak_rss_mb()
        q.put(out)
    except BaseException as e:                                             # noqa: BLE001
        import traceback
        q.put({"error": f"{e!r}\n{traceback.format_exc()}"})


def in_child(fn, *args, **kw) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q, fn, args, kw))
    p.start()
    out = q.get()
    p.join()
    if "error" in out:
        raise RuntimeError(out["error"])
    return out


# ---- tables

SKIP = [1]                                      # steps left out at the start of each run


def med(rows, k):
    return statistics.median(r[k] for r in rows[SKIP[0]:])


def ci(values, fmt=".2f") -> str:
    from grpo_lab.training.experiments import mean_ci
    m, lo, hi = mean_ci(values)
    return f"{m:{fmt}}" + (f" [{lo:{fmt}}, {hi:{fmt}}]" if len(values) > 1 else "")


def load() -> str:
    import os
    return "load average %.1f / %.1f / %.1f" % os.getloadavg()


def scaled(r: dict) -> dict:
    """A step's wall-clock phases scaled to CPU seconds by the step's share of a core
    (CPU s / wall s): on a shared machine the wall clock counts other processes' turns."""
    f = r["cpu_s"] / r["step_s"]
    return {k: (v * f if k.startswith("time/") or k.startswith("head_") or k == "rollout_s"
                else v) for k, v in r.items()}


def profile(a) -> list[str]:
    runs = {name: [] for name in LEVERS if not a.levers or name in a.levers}
    for rnd in range(a.rounds):
        for name in runs:
            out = in_child(grpo_lab_run, a, a.beta, LEVERS[name], 0, rnd)
            runs[name].append(out)
            print(f"round {rnd} {name}: {med(out['rows'], 'step_s'):.2f} s/step wall, "
                  f"{med(out['rows'], 'cpu_s'):.2f} CPU s, peak {out['peak_rss_mb']:.0f} MB, "
                  f"{load()}", flush=True)
    cols = ["prefill", "decode fwd (body)", "decode fwd (head)", "sampling", "cache/rows",
            "rollout other", "ref fwd", "loss fwd", "backward", "optimizer", "finite check",
            "step CPU s"]
    out = [f"| lever (alone, on top of '{next(iter(runs))}') | " + " | ".join(cols)
           + " | step / first row (CPU s) | step wall s | peak RSS MB | mean len |",
           "|---|" + "---|" * (len(cols) + 4)]
    base = [r for o in runs[next(iter(runs))] for r in o["rows"][a.skip:]]   # the first lever
    base_cpu = statistics.median(r["cpu_s"] for r in base)
    for name, outs in runs.items():
        raw = [r for o in outs for r in o["rows"][a.skip:]]
        rows = [scaled(r) for r in raw]
        m = lambda k: statistics.median(r[k] for r in rows)                # noqa: E731
        dec = m("time/decode_forward_s")
        head = m("head_nograd_s")                   # sampling's head (+ a reference's, beta > 0)
        other = m("rollout_s") - m("time/prefill_s") - dec - m("time/decode_sample_s") \
            - m("time/decode_cache_s") - m("time/ref_s")
        cells = [m("time/prefill_s"), dec - head, head, m("time/decode_sample_s"),
                 m("time/decode_cache_s"), other, m("time/ref_s"), m("time/loss_forward_s"),
                 m("time/backward_s"), m("time/optimizer_s"), m("time/check_s"), m("cpu_s")]
        ratio = [r["cpu_s"] / base_cpu for r in raw]
        out.append(f"| {name} | " + " | ".join(f"{c:.2f}" for c in cells)
                   + f" | {ci(ratio)} | {statistics.median(r['step_s'] for r in raw):.1f} | "
                   f"{statistics.mean(o['peak_rss_mb'] for o in outs):.0f} | "
                   f"{m('mean_len'):.1f} |")
    out += ["", "Seconds are CPU seconds: each phase's wall time (the loop's time/* metrics) "
            "scaled by its step's CPU s / wall s (the share of a core the run got on the shared "
            "machine). rollout other = rollout - prefill - decode forwards - sampling - cache "
            "(tokenizer decode, rewards, grouping, advantages); head = the output layer, timed "
            "by forward hooks, in no-grad forwards (sampling). Step / first row: each measured "
            "step's CPU s over the first row's median step, mean [95% interval]. "
            f"{load()} at the end."]
    return out


def trl_table(a) -> list[str]:
    betas = [float(b) for b in a.betas.split(",")] if a.betas else [0.0, a.beta]
    settings = [(b, 0) for b in betas] + ([(a.beta, a.lora_r)] if a.lora_r else [])
    if a.lora_only:
        settings = [(a.beta, a.lora_r)]
    res = {(s, side): [] for s in settings for side in ("grpo_lab", "TRL")}
    for rnd in range(a.rounds):
        for beta, r in settings:
            for side in ("grpo_lab", "TRL"):
                out = (in_child(grpo_lab_run, a, beta, a.after, r, rnd) if side == "grpo_lab"
                       else in_child(trl_run, a, beta, r, rnd))
                res[((beta, r), side)].append(out)
                print(f"round {rnd} beta {beta} lora {r} {side}: "
                      f"{med(out['rows'], 'step_s'):.2f} s/step wall, "
                      f"{med(out['rows'], 'cpu_s'):.2f} CPU s (rollout "
                      f"{med(out['rows'], 'rollout_cpu_s'):.2f}), peak "
                      f"{out['peak_rss_mb']:.0f} MB, {load()}", flush=True)
    out = ["| beta | weights trained | grpo_lab CPU s/step (rollout + update) | TRL CPU s/step "
           "(rollout + update) | TRL / grpo_lab, step | TRL / grpo_lab, rollout | TRL / "
           "grpo_lab, update | wall s/step grpo_lab / TRL | peak RSS MB grpo_lab / TRL |",
           "|---|---|---|---|---|---|---|---|---|"]
    for beta, r in settings:
        o, t = res[((beta, r), "grpo_lab")], res[((beta, r), "TRL")]
        oc, tc = [med(x["rows"], "cpu_s") for x in o], [med(x["rows"], "cpu_s") for x in t]
        orl = [med(x["rows"], "rollout_cpu_s") for x in o]
        trl_ = [med(x["rows"], "rollout_cpu_s") for x in t]
        ou = [med([{"u": y["cpu_s"] - y["rollout_cpu_s"]} for y in x["rows"]], "u") for x in o]
        tu = [med([{"u": y["cpu_s"] - y["rollout_cpu_s"]} for y in x["rows"]], "u") for x in t]
        ow, tw = [med(x["rows"], "step_s") for x in o], [med(x["rows"], "step_s") for x in t]
        mean = statistics.mean
        out.append(f"| {beta} | {'LoRA r=%d' % r if r else 'all'} | {mean(oc):.2f} "
                   f"({mean(orl):.2f} + {mean(ou):.2f}) | {mean(tc):.2f} "
                   f"({mean(trl_):.2f} + {mean(tu):.2f}) | {ci([y / x for x, y in zip(oc, tc)])} | "
                   f"{ci([y / x for x, y in zip(orl, trl_)])} | "
                   f"{ci([y / x for x, y in zip(ou, tu)])} | {mean(ow):.1f} / "
                   f"{mean(tw):.1f} | "
                   f"{mean(x['peak_rss_mb'] for x in o):.0f} / "
                   f"{mean(x['peak_rss_mb'] for x in t):.0f} |")
    each = "one torch thread" if a.threads == 1 else f"{a.threads} torch threads"
    out += ["", f"CPU s: the process's CPU time per optimizer step ({each} each), "
            f"median over each run's steps after the first {SKIP[0]}; update = step - rollout "
            "(grpo_lab: reference forward inside the rollout; TRL: inside its "
            "_generate_and_score_completions too); ratios per round, mean "
            f"[95% interval] over the rounds. {load()} at the end."]
    return out


def matmul_gflops(threads: int = 1) -> list[str]:
    """Measured GEMM throughput, one thread, in CPU seconds: the update's shape (2048 tokens
    x 576 -> 1536), the head's (256 x 576 -> 49152) and the decode's (32 rows)."""
    torch.set_num_threads(threads)
    out = ["| shape (M x K -> N) | fp32 GFLOP/s | bf16 GFLOP/s | bf16 / fp32 |", "|---|---|---|---|"]
    for M, K, N in ((2048, 576, 1536), (256, 576, 49152), (32, 576, 1536), (32, 576, 49152)):
        r = {}
        for dt in (torch.float32, torch.bfloat16):
            x, w = torch.randn(M, K, dtype=dt), torch.randn(N, K, dtype=dt)
            x @ w.T
            best = float("inf")
            for _ in range(3):                      # CPU seconds: load-independent
                t = time.process_time()
                n = 0
                while time.process_time() - t < 0.2:
                    x @ w.T
                    n += 1
                best = min(best, (time.process_time() - t) / n)
            r[dt] = 2 * M * K * N / best / 1e9
        out.append(f"| {M} x {K} -> {N} | {r[torch.float32]:.1f} | {r[torch.bfloat16]:.1f} | "
                   f"{r[torch.bfloat16] / r[torch.float32]:.2f} |")
    return out


def adamw_cpu(a) -> list[str]:
    """One AdamW step + grad clipping over the model's weights (fp32, one thread), CPU s:
    torch's per-tensor loop, foreach, fused."""
    from safetensors.torch import load_file
    torch.set_num_threads(a.threads)
    w0 = [v.float() for v in load_file(str(Path(a.model) / "model.safetensors")).values()]
    out = ["| AdamW implementation | CPU s per step (2 rounds) |", "|---|---|"]
    res = {}
    for _ in range(2):
        for name, kw in (("for-loop", {"foreach": False}), ("foreach", {"foreach": True}),
                         ("fused", {"fused": True})):
            ps = [torch.nn.Parameter(w.clone()) for w in w0]
            for p in ps:
                p.grad = torch.randn_like(p) * 1e-3
            opt = torch.optim.AdamW(ps, lr=1e-6, **kw)
            opt.step()                                  # allocates the moments
            t = time.process_time()
            for _ in range(2):
                torch.nn.utils.clip_grad_norm_(ps, 1.0)
                opt.step()
            res.setdefault(name, []).append((time.process_time() - t) / 2)
    out += [f"| {k} | {' / '.join(f'{x:.2f}' for x in v)} |" for k, v in res.items()]
    return out


def finite_cpu(a) -> list[str]:
    """The loop's check that every weight and AdamW moment is finite, over SmolLM2's tensors
    (3 x 134.5 M fp32 floats, one thread), CPU s: element-wise (isfinite -> all per tensor)
    vs one sum per tensor (exchanges.first_non_finite)."""
    from safetensors.torch import load_file

    from grpo_lab.distributed.exchanges import first_non_finite
    torch.set_num_threads(a.threads)
    w = [v.float() for v in load_file(str(Path(a.model) / "model.safetensors")).values()]
    named = [(f"{k}{i}", t.clone() if k else t) for k in ("", "m", "v") for i, t in enumerate(w)]
    res = {}
    for _ in range(3):
        for name, fn in (("element-wise", _old_first_non_finite), ("summed", first_non_finite)):
            t = time.process_time()
            assert fn(named) is None
            res.setdefault(name, []).append(time.process_time() - t)
    n = sum(t.numel() for _, t in named)
    return ["| finite check | CPU s per step (3 repeats) |", "|---|---|",
            *[f"| {k} | {' / '.join(f'{x:.3f}' for x in v)} |" for k, v in res.items()],
            "", f"{len(named)} tensors, {n / 1e6:.1f} M floats."]


def cpu_per_call(fn, reps: int) -> float:
    """CPU seconds per call of ``fn``, averaged over ``reps`` calls after one warm-up call."""
    fn()
    t = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t) / reps


# the variables that limit the instruction sets torch's kernels, oneDNN and MKL use
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def isa_line() -> str:
    """torch's CPU capability and the ISA_LIMITS variables set, if any."""
    limits = [f"{k}={os.environ[k]}" for k in ISA_LIMITS if k in os.environ]
    return (f"torch's CPU capability {torch.backends.cpu.get_cpu_capability()}"
            + "".join(f", {x}" for x in limits)
            + (" (instruction sets limited by these variables run on this CPU's caches and "
               "memory: an estimate for a CPU that has only them)" if limits else ""))


def decode_step_ms(a) -> list[str]:
    """One decode step of the model at ``--rows`` rows (8, 16, 32; a 36-token prompt cache + 1), CPU
    ms, ``--threads`` threads: transformers' forward with its DynamicCache, the lean decoder
    with MKL's GEMMs, the lean decoder with small_gemm's kernel (up to 8 rows; one thread
    only); the GEMMs alone, every linear layer of the model (its own weights, streamed as in a
    step), MKL vs the kernel; the same step on a bf16 sampling copy (transformers' forward,
    the lean decoder); and the bf16 head on the prefill's last position as transformers slices
    it, strided or made contiguous (hf._contiguous_input). Rounds interleaved; each figure the
    median of 3 rounds of 5 steps."""
    import copy

    from grpo_lab.policies import decoder as dec_mod
    from grpo_lab.policies import small_gemm
    from grpo_lab.policies.hf import load_hf_policy
    torch.set_num_threads(a.threads)
    model = load_hf_policy(a.model).eval().model
    lean = dec_mod.decoder_for(model)
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]  # + head
    bf16 = copy.deepcopy(model).to(torch.bfloat16).requires_grad_(False)  # a sampling copy
    lean16 = dec_mod.decoder_for(bf16)

    def timed(fn):
        return cpu_per_call(fn, 5) * 1e3                                   # ms

    res = {}
    rows = [int(x) for x in a.rows.split(",")]
    for n in rows:
        ids = torch.randint(0, model.config.vocab_size, (n, 36))
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
            out16 = bf16(input_ids=ids, use_cache=True)
        cache = lean.start(copy.deepcopy(out.past_key_values), 1, 4)
        cache16 = lean16.start(copy.deepcopy(out16.past_key_values), 1, 4)
        tok, pos = torch.randint(0, model.config.vocab_size, (n,)), torch.full((n,), 36)
        mask = torch.ones(n, 37, dtype=torch.bool)
        xs = {k: torch.randn(n, k) for k in {w.shape[1] for w in linears}}

        def hf_step(m=model, o=out):
            c = copy.deepcopy(o.past_key_values)         # a fresh 36-column cache each call
            with torch.no_grad():
                m(input_ids=tok[:, None], attention_mask=mask.long(),
                  position_ids=pos[:, None], cache=c, use_cache=True, logits_to_keep=1)

        def hf16_step():
            hf_step(bf16, out16)

        def lean16_step():
            cache16.t = 36
            lean16.step(tok, pos, mask, cache16)

        h16 = torch.randn(n, 36, bf16.config.hidden_size, dtype=torch.bfloat16)

        def head16(contiguous):                          # the prefill's last position
            def run():
                with torch.no_grad():
                    x = h16[:, -1:]                       # (n, 1, C), strided as transformers'
                    bf16.lm_head(x.contiguous() if contiguous else x)
            return run

        def lean_step(kernel):
            def run():
                cache.t = 36
                keep = small_gemm.AVAILABLE
                small_gemm.AVAILABLE = kernel and keep
                try:
                    lean.step(tok, pos, mask, cache)
                finally:
                    small_gemm.AVAILABLE = keep
            return run

        def gemms(kernel):
            def run():
                with torch.no_grad():
                    for w in linears:
                        x = xs[w.shape[1]]
                        (small_gemm.linear_rows8(x, w) if kernel and small_gemm.applies(x, w)
                         else torch.nn.functional.linear(x, w))
            return run
        copy_ms = timed(lambda: copy.deepcopy(out.past_key_values))
        copy16_ms = timed(lambda: copy.deepcopy(out16.past_key_values))
        for _ in range(3):
            for name, fn in (("transformers forward", hf_step), ("lean, MKL", lean_step(False)),
                             ("lean, small_gemm", lean_step(True)), ("GEMMs, MKL", gemms(False)),
                             ("GEMMs, small_gemm", gemms(True)),
                             ("bf16 copy: transformers forward", hf16_step),
                             ("bf16 copy: lean", lean16_step),
                             ("bf16 head, the strided (n, 1, C) slice", head16(False)),
                             ("bf16 head, that slice made contiguous", head16(True))):
                ms = timed(fn) - {hf_step: copy_ms, hf16_step: copy16_ms}.get(fn, 0.0)
                res.setdefault((name, n), []).append(ms)
    names = list(dict.fromkeys(k for k, _ in res))
    out = ["| what (ms per decode step, CPU) | " + " | ".join(f"{n} rows" for n in rows) + " |",
           "|---|" + "---|" * len(rows)]
    for name in names:
        out.append(f"| {name} | " + " | ".join(
            f"{statistics.median(res[name, n]):.1f}" for n in rows) + " |")
    out += ["", f"{len(linears)} weight matrices ({sum(w.numel() for w in linears) / 1e6:.1f} M "
            "weights); small_gemm applies up to 8 rows only (above it the row is MKL's). "
            f"numba {'present' if small_gemm.AVAILABLE else 'absent'}; {load()}."]
    return out


INT8_SETS = {"q, k, v": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",),
             "gate, up": ("gate_proj", "up_proj"), "down": ("down_proj",), "head": ("lm_head",),
             "every linear layer": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                    "up_proj", "down_proj", "lm_head")}


def int8_sampler(a) -> list[str]:
    """Would int8 weights make the sampler 2x faster at a usable mismatch? fbgemm's dynamic
    int8 linear (weights per output channel, activations per tensor, 7-bit on AVX2 CPUs
    without VNNI, i.e. ``reduce_range``): its time against MKL's fp32 GEMM at 8 and 32 rows
    on SmolLM2's shapes, and, with the named projections quantized, the KL(fp32 || int8) per
    token and the |log-prob gap| of the sampled token along completions the fp32 model
    sampled (4 instruct prompts x 32 tokens, T=1)."""
    import copy
    import warnings

    import torch.nn.functional as F

    from grpo_lab.policies.hf import load_hf_policy
    warnings.filterwarnings("ignore", message=".*quantiz.*deprecated")
    torch.set_num_threads(a.threads)
    torch.backends.quantized.engine = "fbgemm"

    def pack(w):
        scale = (w.abs().amax(1) / 127).clamp_min(1e-12).double()              # (N,)
        q = torch.quantize_per_channel(w.detach(), scale, torch.zeros_like(scale, dtype=torch.long),
                                       0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, None)

    class Int8Linear(torch.nn.Module):
        def __init__(self, w):
            super().__init__()
            self.packed = pack(w)

        def forward(self, x):
            y = torch.ops.quantized.linear_dynamic(x.reshape(-1, x.shape[-1]), self.packed, True)
            return y.reshape(*x.shape[:-1], -1)

    def timed(fn):
        return cpu_per_call(fn, 20) * 1e6                                  # us

    out = ["| shape (M x K -> N) | fp32 MKL, us | int8 fbgemm, us | fp32 / int8 |", "|---|---|---|---|"]
    for m in (8, 32):
        for k, n in ((576, 960), (576, 1536), (1536, 576), (576, 49152)):
            x, w = torch.randn(m, k), torch.randn(n, k) * 0.02
            p = pack(w)
            f32 = min(timed(lambda: F.linear(x, w)) for _ in range(3))
            i8 = min(timed(lambda: torch.ops.quantized.linear_dynamic(x, p, True)) for _ in range(3))
            out.append(f"| {m} x {k} -> {n} | {f32:.0f} | {i8:.0f} | {f32 / i8:.2f} |")
    pol = load_hf_policy(a.model, chat_template=True).eval()
    texts = ["What is 17 + 25? Answer with the number only.", "Name the capital of France.",
             "Write a haiku about the sea.", "Sort these words: pear, apple, fig."]
    torch.manual_seed(0)
    with torch.no_grad():
        seqs = [pol.model.generate(torch.tensor([pol.encode(t)]), max_new_tokens=32,
                                   do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
                for t in texts]
        refs = [(F.log_softmax(pol.model(s).logits[0].float(), -1), len(pol.encode(t)))
                for s, t in zip(seqs, texts)]
    out += ["", "| int8 projections (the rest fp32) | KL(fp32 \\|\\| int8) per token, mean | "
            "median | max | \\|log p - log q\\| of the sampled token, mean |", "|---|---|---|---|---|"]
    for name, kinds in INT8_SETS.items():
        qm = copy.deepcopy(pol.model)
        for mod in list(qm.modules()):
            for child, c in list(mod.named_children()):
                if isinstance(c, torch.nn.Linear) and child in kinds:
                    setattr(mod, child, Int8Linear(c.weight))
        kl, gap = [], []
        with torch.no_grad():
            for s, (lp, tp) in zip(seqs, refs):
                lq = F.log_softmax(qm(s).logits[0].float(), -1)
                a_, b_ = lp[tp - 1:-1], lq[tp - 1:-1]                      # (Tc, V)
                kl.append((a_.exp() * (a_ - b_)).sum(-1))
                tok = s[0, tp:, None]
                gap.append((a_.gather(1, tok) - b_.gather(1, tok)).abs()[:, 0])
        kl, gap = torch.cat(kl), torch.cat(gap)
        out.append(f"| {name} | {kl.mean():.4f} | {kl.median():.4f} | {kl.max():.3f} | "
                   f"{gap.mean():.4f} |")
    out += ["", f"{sum(len(s[0]) - tp for s, (_, tp) in zip(seqs, refs))} sampled positions; "
            f"{load()}."]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("profile", "trl", "matmul", "adamw", "finite", "decode",
                                       "int8"))
    ap.add_argument("--model", default="/work/models/smollm2-135m-instruct")
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--G", type=int, default=4)
    ap.add_argument("--max_new", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--lora_r", type=int, default=16, help="trl table: also LoRA (0: skip)")
    ap.add_argument("--lora_only", action="store_true", help="trl table: the LoRA row only")
    ap.add_argument("--betas", default="", help="trl table: full fine-tuning rows at these "
                    "betas, comma-separated ('': 0 and --beta)")
    ap.add_argument("--rows", default="8,16,32", help="decode: the batch's rows, comma-separated")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bf16", type=int, default=1, help="trl: TRL bf16=True (grpo_lab: autocast)")
    ap.add_argument("--skip", type=int, default=1, help="steps left out at each run's start")
    ap.add_argument("--levers", default="", help="profile: comma-separated LEVERS names (all)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    SKIP[0] = a.skip
    a.levers = [x for x in a.levers.split(",") if x]
    a.after = AFTER if a.bf16 else {**AFTER, "hf": {k: v for k, v in AFTER["hf"].items()
                                                    if k not in ("sample_dtype", "autocast")}}
    a.device, a.temperature, a.eval_size = "cpu", 1.0, 0
    a.chat_template = (Path(a.model) / "chat_template.jinja").exists()   # instruct models
    head = [f"Command: `python bench/bench_hf_speed.py {' '.join(sys.argv[1:])}`",
            f"{a.model}, B={a.B} G={a.G} max_new={a.max_new} T=1, lr {a.lr}, threads "
            f"{a.threads}, steps {a.steps} per run ({a.skip} left out), rounds {a.rounds}, torch "
            f"{torch.__version__}; {load()} at the start.", isa_line(), ""]
    if a.what == "matmul":
        lines = matmul_gflops(a.threads)
    elif a.what == "adamw":
        lines = adamw_cpu(a)
    elif a.what == "finite":
        lines = finite_cpu(a)
    elif a.what == "decode":
        lines = decode_step_ms(a)
    elif a.what == "int8":
        lines = int8_sampler(a)
    elif a.what == "profile":
        lines = profile(a)
    else:
        import transformers
        import trl
        head.insert(2, f"transformers {transformers.__version__}, trl {trl.__version__}; "
                       f"TRL bf16={bool(a.bf16)}, grpo_lab: {a.after}.")
        lines = trl_table(a)
    text = "\n".join(head + lines) + "\n"
    print(text)
    Path(a.out or f"bench/RESULTS_hf_speed_{a.what}.md").write_text(
        f"# bench/bench_hf_speed.py {a.what}\n\n{text}")


if __name__ == "__main__":
    main()
