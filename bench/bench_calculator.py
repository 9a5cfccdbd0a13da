"""SmolLM2-135M-Instruct learns to call the calculator (agents/calculator.py): multi-turn GRPO
with the tool's output forced into the sequence and masked out of the loss.

    python bench/bench_calculator.py --steps 30 --threads 2

Measures, on the fixed held-out questions (calculator.HELD_OUT, greedy): the base's accuracy
without the tool (``calculator_plain``: the plain question, no system prompt) and with it
(``calculator``, the system prompt ``SYSTEM`` describing the call syntax); then trains
(objective "agent", policy "hf", GRPO_LAB_MODELS unset: ~/.cache/grpo_lab/models) and
evaluates the held-out set after every step: accuracy, the call rate and the well-formed
share of calls (held out, greedy; the training episodes' own, sampled, are in the metrics as
tool/...). Writes runs/calculator/ (the run), bench/RESULTS_calculator.md (the table) and
data/agents/calculator_run.json (the curve and before/after episodes with the tool's output
in ⟦ ⟧, read by lesson 13).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench_op_overhead import cpu_line, load_average  # noqa: E402
from grpo_lab.agents import step as agent_step  # noqa: E402,F401 (registers the environments)
from grpo_lab.agents.environments import get_environment, tool_metrics  # noqa: E402
from grpo_lab.agents.episodes import sample_episodes  # noqa: E402
from grpo_lab.policies.hf import load_hf_policy  # noqa: E402
from grpo_lab.tasks import TASKS  # noqa: E402
from grpo_lab.training.config import TrainConfig  # noqa: E402
from grpo_lab.training.trainer import train  # noqa: E402

SYSTEM = ("You have a calculator. To use it, write the calculation followed by '=', for "
          "example 12 * 34 =, and the calculator writes the result.")
MODEL = "smollm2-135m"


def marked(policy, ep, i: int) -> str:
    """Episode ``i`` as text, the environment's tokens in ⟦ ⟧ (nothing stripped)."""
    r = ep.scored.rollout
    ids, own, real = r.completion_ids[i], r.loss_mask[i], r.completion_mask[i]
    out, span, mine = [], [], None
    for t, o, ok in zip(ids.tolist(), own.tolist(), real.tolist()):
        if not ok:
            break
        if mine is not None and o != mine:
            text = policy.tokenizer.decode(span, skip_special_tokens=True)
            out.append(text if mine else f"⟦{text}⟧")
            span = []
        span.append(t)
        mine = o
    if span:
        text = policy.tokenizer.decode(span, skip_special_tokens=True)
        out.append(text if mine else f"⟦{text}⟧")
    return "".join(out)


def held_out_eval(policy, task: str, n: int, samples: int = 0) -> tuple[dict, list]:
    """Greedy episodes on the first ``n`` held-out questions -> (accuracy, tool metrics), the
    first ``samples`` episodes as {prompt, completion, reward}."""
    env, exs = get_environment(task), TASKS[task].eval_fn()[:n]
    ep = sample_episodes(policy, exs, env, 1, greedy=True)
    ok = [float(e == "done" and float(r) > 0) for e, r in zip(ep.end, ep.scored.rewards)]
    rows = [{"prompt": exs[i].prompt, "completion": marked(policy, ep, i),
             "reward": float(ep.scored.rewards[i])} for i in range(min(samples, len(exs)))]
    return {"accuracy": sum(ok) / len(ok), **tool_metrics(ep.info)}, rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--eval_size", type=int, default=50)
    ap.add_argument("--eval_every", type=int, default=1,
                    help="held-out evaluation every N updates (each costs about as much as "
                         "4 s per question on the 2-core CPU)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--model", default=MODEL, help="data/hf_tiny: a smoke test of the pipeline")
    ap.add_argument("--no_chat", action="store_true",
                    help="no chat template and no system prompt (data/hf_tiny has no template)")
    ap.add_argument("--out", default="runs/calculator")
    ap.add_argument("--results", default="bench/RESULTS_calculator.md")
    ap.add_argument("--json", default="data/agents/calculator_run.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    command = "python bench/bench_calculator.py " + " ".join(argv if argv is not None
                                                              else sys.argv[1:])
    cpu, load0 = cpu_line(), load_average()
    t0 = time.perf_counter()

    system = "" if a.no_chat else SYSTEM
    plain = load_hf_policy(a.model, chat_template=not a.no_chat)
    base_plain, _ = held_out_eval(plain, "calculator_plain", a.eval_size)
    plain.cfg.system_prompt = system
    base_tool, before = held_out_eval(plain, "calculator", a.eval_size, samples=4)
    del plain
    print(f"base held out ({a.eval_size}): without the tool {base_plain['accuracy']:.3f}, "
          f"with it {base_tool['accuracy']:.3f} (call rate {base_tool.get('call_rate')}, "
          f"well-formed {base_tool.get('well_formed')}) [{time.perf_counter() - t0:.0f} s]",
          flush=True)

    cfg = TrainConfig(objective="agent", task="calculator", policy="hf", base_checkpoint=a.model,
                      hf={"chat_template": not a.no_chat}, system_prompt=system,
                      prompts_per_step=a.prompts, group_size=a.group, lr=a.lr,
                      temperature=a.temperature, kl={"beta": 0.0}, dynamic={"sampling": False},
                      warmup_steps=0, lr_schedule="constant", steps=a.steps, seed=a.seed,
                      eval_every=a.eval_every, eval_size=a.eval_size, ckpt_every=1000, threads=a.threads,
                      time_budget_s=0.0, out_dir=a.out)
    after: list = []

    def on_step(m, policy):
        print(f"step {m['step']:2d}: held out {m.get('eval/accuracy', float('nan')):.3f} "
              f"call {m.get('eval/tool/call_rate', float('nan')):.3f} "
              f"well-formed {m.get('eval/tool/well_formed', float('nan')):.3f} | train reward "
              f"{m['reward/mean']:.3f} call {m.get('tool/call_rate', float('nan')):.3f} "
              f"well-formed {m.get('tool/well_formed', float('nan')):.3f} | "
              f"{m['time/step_s']:.0f} s step, {m['time/elapsed_s']:.0f} s", flush=True)
        if m["step"] == a.steps - 1:
            after.extend(held_out_eval(policy, "calculator", 4, samples=4)[1])   # samples only

    base_eval = {"eval/accuracy": base_tool["accuracy"],
                 **{f"eval/tool/{k}": v for k, v in base_tool.items() if k != "accuracy"}}
    history = train(cfg, progress=False, on_step=on_step, base_eval=base_eval)
    load1 = load_average()
    rows = [h for h in history if "eval/accuracy" in h]
    steps = [{"step": h["step"] + 1, "heldout_acc": h["eval/accuracy"],
              "call_rate": h.get("eval/tool/call_rate"), "well_formed": h.get("eval/tool/well_formed"),
              "train_reward": h.get("reward/mean"), "train_call_rate": h.get("tool/call_rate"),
              "train_well_formed": h.get("tool/well_formed"), "step_s": h.get("time/step_s")}
             for h in rows]                    # step 0: the base; step k: after k updates
    timed = [h["time/step_s"] for h in history if "time/step_s" in h]
    result = {"command": command, "cpu": cpu,
              "load": {"start": list(load0), "end": list(load1)},
              "config": {"prompts_per_step": a.prompts, "group_size": a.group, "lr": a.lr,
                         "temperature": a.temperature, "eval_size": a.eval_size,
                         "eval_every": a.eval_every,
                         "threads": a.threads, "seed": a.seed, "system_prompt": system},
              "base": {"without_tool": base_plain, "with_tool": base_tool},
              "steps": steps, "before": before, "after": after,
              "step_s_mean": sum(timed) / max(len(timed), 1),
              "wall_s": time.perf_counter() - t0}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    best = max(steps, key=lambda s: s["heldout_acc"])
    lines = [f"# SmolLM2-135M-Instruct learns the calculator (bench/bench_calculator.py)", "",
             f"Command: `{command}`", "", f"CPU: {cpu}; load average (1, 5, 15 min) "
             f"{' '.join(f'{x:.2f}' for x in load0)} at the start, "
             f"{' '.join(f'{x:.2f}' for x in load1)} at the end; {a.threads} threads.", "",
             f"Held out: the first {a.eval_size} of calculator.held_out (fixed seed), greedy.", "",
             f"Base without the tool (plain question): {base_plain['accuracy']:.3f}; base with "
             f"the tool: {base_tool['accuracy']:.3f} (call rate "
             f"{base_tool.get('call_rate', float('nan')):.3f}, well-formed "
             f"{base_tool.get('well_formed', float('nan')):.3f}).", "",
             f"Final (after {a.steps} steps): {steps[-1]['heldout_acc']:.3f}; best "
             f"{best['heldout_acc']:.3f} after {best['step']} steps. Mean step "
             f"{result['step_s_mean']:.1f} s (with the per-step held-out evaluation: wall "
             f"{result['wall_s']:.0f} s in all).", "",
             "| updates | held-out acc | held-out call rate | held-out well-formed | train reward "
             "| train call rate | train well-formed | step s |",
             "|---|---|---|---|---|---|---|---|"]
    f = lambda x: "-" if x is None or x != x else f"{x:.3f}"          # noqa: E731
    for s in steps:
        lines.append(f"| {s['step']} | {f(s['heldout_acc'])} | {f(s['call_rate'])} | "
                     f"{f(s['well_formed'])} | {f(s['train_reward'])} | {f(s['train_call_rate'])} "
                     f"| {f(s['train_well_formed'])} | {f(s['step_s'])} |")
    lines += ["", "Before (base, greedy, held out; the tool's output in ⟦ ⟧):", ""]
    lines += [f"- {r['prompt']} -> `{r['completion']!r}` reward {r['reward']}" for r in before]
    lines += ["", "After:", ""]
    lines += [f"- {r['prompt']} -> `{r['completion']!r}` reward {r['reward']}" for r in after]
    Path(a.results).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
