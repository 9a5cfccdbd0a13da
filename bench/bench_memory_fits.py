"""What fits where, checked on the CPU (issue 38, item 3): the bytes one rank holds in a real
GRPO step, for each way the exchange holds the weights, against distributed/fits.py's formula.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_memory_fits.py \
        [--world 2] [--out bench/RESULTS_memory_fits.md]

One ``launch.spawn`` of ``--world`` gloo processes; every rank runs every case in turn, each a
fresh policy and exchange, beta 0 (the formula leaves the reference policy out):

  cases: the toy (``tiny_cpu``'s GPT) and the tiny transformers model (``hf_tiny_cpu``,
  data/hf_tiny), each under allreduce (replicated), sharded (the sharder) and fsdp2; plus
  activation checkpointing of every block (``checkpoint_every 1``) and, for the tiny HF model,
  LoRA rank 4.

Per rank and case, after one warm-up step (so AdamW's moments exist), all counted tensor by
tensor (policies/memory.py: storages, a DTensor's as its local shard; deterministic):

  ``state``    weights + gradients + AdamW moments held right after an update's optimizer
               step (the sharder's owned moments found on its ShardedOptimizer), vs
               ``fits.state_bytes`` for the same P, T, N: these must agree exactly up to
               FSDP2's dim-0 padding and the sharder's extra buffers, and the ratio says so.
  ``update``   held before the update (weights + moments) + ``PeakMemory``'s peak over the
               update (the objective's forward and backward, the exchange's reduce, the
               optimizer step) vs ``fits.peak_bytes(...)["update"]`` for this rank's tokens
               (rows x (prompt + completion length)).
  ``rollout``  the same over the rollout (``ex.gathered()`` + collect: sampling, KV cache,
               rewards, advantages) vs ``fits.peak_bytes(...)["rollout"]``.

The formula's transient part is an estimate made for GPUs (bf16 activations and KV cache,
fused attention); on this CPU everything is fp32 and attention keeps its scores, so the
update's and the rollout's ratios say how far that estimate is from a CPU run of a tiny model,
and the results file names what the formula leaves out.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from grpo_lab.distributed import fits, launch

CASES = [  # (label, preset, TrainConfig overrides)
    ("toy", "tiny_cpu", {}),
    ("toy, checkpoint_every 1", "tiny_cpu", {"checkpoint_every": 1}),
    ("hf_tiny", "hf_tiny_cpu", {}),
    ("hf_tiny, checkpoint_every 1", "hf_tiny_cpu", {"checkpoint_every": 1}),
    ("hf_tiny, LoRA r 4", "hf_tiny_cpu", {"hf": {"lora_r": 4}}),
]
EXCHANGES = {"allreduce": "replicated", "sharded": "sharder", "fsdp2": "fsdp2"}
COMMON = dict(kl={"beta": 0.0}, threads=1, eval_size=0, prompts_per_step=8, group_size=4, steps=2)


def held(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor: its local shard)."""
    from grpo_lab.policies.memory import storages
    seen = {}
    for t in tensors:
        if t is not None:
            for st in storages(t):
                seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def optimizer_tensors(ex) -> list:
    """The tensors of this rank's optimizer state: torch's AdamW's, or the sharder's owned
    shards' (its ShardedOptimizer, the one the exchange's step closes over)."""
    if ex.optimizer is not None:
        return [v for st in ex.optimizer.state.values() for v in st.values()
                if torch.is_tensor(v)]
    from grpo_lab.distributed.sharder import ShardedOptimizer
    (owner,) = [c.cell_contents for c in ex.step.__closure__
                if isinstance(c.cell_contents, ShardedOptimizer)]
    return [v for st in owner.state.values() for v in vars(st).values() if torch.is_tensor(v)]


def shape_of(policy) -> fits.Shape:
    """fits.Shape of a toy GPT or an HF policy, P counting each tied tensor once."""
    P = sum(p.numel() for p in policy.parameters())       # parameters() yields a tie once
    cfg = getattr(getattr(policy, "model", None), "config", None)
    if cfg is None:                                       # the toy: kv = all heads x head dim
        c = policy.cfg
        return fits.Shape(P, c.n_layer, c.n_embd, c.vocab_size, c.n_embd)
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return fits.Shape(P, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size,
                      cfg.num_key_value_heads * head)


def measure_case(preset_name: str, kw: dict, exchange: str, out_dir: str) -> dict:
    from grpo_lab.distributed.exchanges import AdamW, ExchangeConfig, make_exchange, trainable
    from grpo_lab.distributed.group import Group
    from grpo_lab.policies.memory import PeakMemory
    from grpo_lab.training.config import preset
    from grpo_lab.training.step import backward
    from grpo_lab.training.trainer import setup

    cfg = preset(preset_name, out_dir=out_dir, exchange={"name": exchange}, **COMMON, **kw)
    group = Group.current()
    run = setup(cfg, group)
    policy, ctx = run.policy, run.ctx
    shape = shape_of(policy)
    T = sum(p.numel() for _, p in trainable(policy))
    ex = make_exchange(policy, cfg.exchange, AdamW(cfg.lr, cfg.adam_eps), group.world,
                       group.rank, cfg.blocks)

    def rollout(step):
        with ex.gathered():
            return run.objective.collect(policy, cfg, step, ctx)

    def update(batch):
        ex.zero_grad()
        backward(run.objective.loss, ex.module, [batch], cfg, group.world)
        ex.reduce()
        ex.step()

    update(rollout(0))                                   # warm-up: AdamW's moments exist
    ex.zero_grad()

    def quiet() -> int:                                  # weights + moments, no gradients
        return held([*policy.parameters(), *policy.buffers(), *optimizer_tensors(ex)])

    before = quiet()
    with PeakMemory() as m:
        batch = rollout(1)
    rollout_peak = before + m.peak
    before = quiet()
    with PeakMemory() as m:
        update(batch)
    update_peak = before + m.peak
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    state = held([*policy.parameters(), *grads, *optimizer_tensors(ex)])
    r = batch.scored.rollout
    tokens = r.prompt_ids.shape[0] * (r.prompt_ids.shape[1] + r.completion_ids.shape[1])
    base_bytes = 4                                       # fp32 frozen base (hf.dtype default)
    holding = EXCHANGES[exchange]
    lora = T if T < shape.params else 0.0
    formula = fits.peak_bytes(shape, group.world, holding, tokens, tokens, lora_params=lora,
                              checkpointing=bool(cfg.checkpoint_every))
    return {"P": shape.params, "T": T, "tokens": tokens,
            "state": state, "state_formula": fits.state_bytes(shape.params, T or shape.params,
                                                              group.world, holding,
                                                              base_bytes=base_bytes),
            "update": update_peak, "update_formula": formula["update"],
            "rollout": rollout_peak, "rollout_formula": formula["rollout"]}


def worker(rank: int, world: int, labels: list[str]) -> list[dict]:
    torch.set_num_threads(1)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, name, kw in (c for c in CASES if c[0] in labels):
            for exchange in EXCHANGES:
                t = time.perf_counter()
                got = measure_case(name, kw, exchange, str(Path(tmp) / f"{len(out)}"))
                out.append({"case": label, "exchange": exchange, **got,
                            "seconds": time.perf_counter() - t})
    return out


def machine() -> tuple[str, str]:
    """(CPU model and the flags that matter here, the load average now)."""
    cpu = platform.processor()
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(ln.split(":", 1)[1].strip() for ln in info.splitlines()
                     if ln.startswith("Model name"))
        cores = next(ln.split(":", 1)[1].strip() for ln in info.splitlines()
                     if ln.startswith("CPU(s)"))
        flags = next(ln.split(":", 1)[1].split() for ln in info.splitlines()
                     if ln.startswith("Flags"))
        keep = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
        cpu = f"{model}, {cores} CPUs, flags: {' '.join(keep)}"
    except (OSError, StopIteration):
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return cpu, load


def mb(b: float) -> str:
    return f"{b / 1e6:,.3f}"


def write(rows_by_rank: list[list[dict]], world: int, out: Path, cpu: str, load0: str,
          load1: str, wall: float) -> None:
    lines = ["# What fits where, checked on the CPU (bench/bench_memory_fits.py)", "",
             f"Command: `PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python "
             f"bench/bench_memory_fits.py --world {world}`; {world} gloo processes, "
             f"{wall:.0f} s.", f"Machine: {cpu}; load average {load0} before, {load1} after.",
             "", f"Every case: 8 prompts x 4 completions over {world} ranks, beta 0, one "
             "warm-up step, then one rollout and one update measured. MB = 1e6 bytes, the "
             "mean over ranks (their shares differ by FSDP2's rounding and the sharder's "
             "owners). Ratio = measured / formula.", "",
             "| case | exchange | P | T | tokens/rank | state MB | formula | ratio | "
             "update peak MB | formula | ratio | rollout peak MB | formula | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows_by_rank[0]):
        mean = {k: sum(rk[i][k] for rk in rows_by_rank) / world
                for k in ("state", "state_formula", "update", "update_formula", "rollout",
                          "rollout_formula", "tokens")}
        cells = [r["case"], r["exchange"], f"{r['P']:,}", f"{r['T']:,}", f"{mean['tokens']:.0f}"]
        for k in ("state", "update", "rollout"):
            cells += [mb(mean[k]), mb(mean[f"{k}_formula"]),
                      f"{mean[k] / mean[f'{k}_formula']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--out", default="bench/RESULTS_memory_fits.md")
    ap.add_argument("--cases", nargs="*", default=[c[0] for c in CASES],
                    help="labels of the cases to run (default: all)")
    args = ap.parse_args()
    cpu, load0 = machine()
    t = time.perf_counter()
    rows = launch.spawn(worker, args.world, (args.cases,), run_timeout_s=1800)
    wall = time.perf_counter() - t
    write(rows, args.world, Path(args.out), cpu, load0, machine()[1], wall)


if __name__ == "__main__":
    main()
