"""grpo_lab's multi-turn GRPO step vs TRL 1.16's GRPOTrainer on the very same calculator episodes.

grpo_lab samples B x G episodes of the calculator environment (agents/calculator.py:
``sample_episodes``, the tool's result forced into the sequence); TRL gets those token sequences
through ``rollout_func`` (TRL's experimental hook: prompt_ids, completion_ids, logprobs, and
``env_mask``, which TRL 1.16 takes as its ``tool_mask``: 1 for the model's tokens, 0 for the
environment's; its loss mask is completion_mask x tool_mask, grpo_trainer.py). Compared on
identical inputs, one step from the same weights:

  (a) the tokens each side trains on: grpo_lab's ``Rollout.policy_mask`` against TRL's
      completion_mask x tool_mask, and the attended tokens (completion_mask) on each side;
  (b) the rewards: the environment's return (grpo_lab) against what TRL's reward functions
      return (the return handed over as a field, plus ``--length_weight`` x completion tokens
      counted by each side on its own) and a TRL-side reading of its decoded completion text
      with the calculator's answer reader (weight 0: a check, not a reward); the advantages;
  (c) the per-token log-probs, the loss and the gradient of every parameter (max abs diff,
      and relative to the largest gradient entry);
  (d) the update's seconds (advantages, loss forward, backward, AdamW step) on the same
      episodes, TRL's trainer step (its rollout_func hands the cached episodes back, so
      neither side samples) and grpo_lab's update alternating before and after it.

Settings shared: beta 0, one update per rollout, eps 0.2 / 0.28, grad clip 1, AdamW without
weight decay, constant lr, the std-scaled group advantage (eps 1e-4 on both) and the
per-sequence token mean (grpo_lab "seq_mean_token_mean" = TRL loss_type "grpo"). Where the
methods differ (kept, reported): TRL's ratio denominator is the training forward's own
log-probs detached (num_iterations 1: exactly 1), grpo_lab's the sampler's (KV-cached
sampling: 1 up to float rounding); TRL's positions count left padding (its forward passes no
position_ids), grpo_lab's count real tokens only (the table reports the prompts' padding).

    python bench/bench_agents_trl.py                                  # data/hf_tiny, fast
    python bench/bench_agents_trl.py --model ~/.cache/grpo_lab/models/smollm2-135m --chat \\
        --B 2 --G 4 --length_weight 0 --rounds 3
TRL is a bench dependency only: a separate venv with trl 1.16.0, transformers 5.24.0.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench_calculator import SYSTEM  # noqa: E402
from bench_op_overhead import cpu_line, load_average  # noqa: E402
from grpo_lab.agents.calculator import extract, same_number  # noqa: E402
from grpo_lab.agents.credit import get_credit  # noqa: E402
from grpo_lab.agents.environments import get_environment  # noqa: E402
from grpo_lab.agents.episodes import sample_episodes  # noqa: E402
from grpo_lab.agents.step import reset_seeds  # noqa: E402
from grpo_lab.algorithm.advantages import grouped_advantages  # noqa: E402
from grpo_lab.algorithm.rollout import completion_logprobs  # noqa: E402
from grpo_lab.distributed.exchanges import AdamW, make_exchange  # noqa: E402
from grpo_lab.training.config import TrainConfig  # noqa: E402
from grpo_lab.training.step import Batch, backward, grpo_objective, prompt_generators  # noqa: E402
from grpo_lab.training.trainer import setup  # noqa: E402


NOTES = """How the two sides meet, and where they differ (TRL 1.16.0's grpo_trainer.py):

- The hand-over: ``rollout_func(prompts, trainer)`` gets each prompt G times (TRL's
  RepeatSampler, ``shuffle_dataset=False``) and returns grpo_lab's unpadded prompt ids,
  completion ids (actions and observations in one sequence), the sampler's log-probs and
  ``env_mask``; TRL pops ``env_mask`` as its ``tool_mask`` (``_generate``), pads it with 1 and
  trains on completion_mask x tool_mask (``_generate_and_score_completions``,
  ``_compute_loss``); completion_mask (every real token) is what it attends to. TRL accepted
  the hand-built episodes as they are.
- The ratio's denominator: with one update per rollout TRL uses the training forward's own
  log-probs, detached (ratio exactly 1); grpo_lab uses the sampler's (KV-cached sampling: the
  ratio is 1 up to float rounding, the row "sampler vs its training forward"). The gradient is
  then -A grad log p / |o_i| on both sides, equal up to that rounding; the loss value is the
  mean of the group-centred advantages, 0 on both sides up to rounding (its sign is noise).
- The sampler's log-probs that rollout_func returns enter TRL's loss only under vLLM
  (importance-sampling correction); on the CPU they are carried and unused.
- bf16: TRL's GRPOConfig turns ``bf16`` on unless told (its docs: "Defaults to True if fp16 is
  not set"), and on the CPU its loss forward then runs under bf16 autocast. Left at that
  default, the same hf_tiny case (B=8 x G=8) measured log-probs apart by up to 0.24 and the
  gradient by 20% of its largest entry (per tensor up to 32%): the bench sets ``bf16=False``
  (grpo_lab runs float32 on the CPU).
- Positions: TRL's loss forward passes input_ids and attention_mask only, no position_ids, so
  a left-padded prompt gets the model's default positions; grpo_lab counts real tokens only.
  Not exercised here: the calculator's prompts all tokenize to one length (padding 0), which
  the table reports.
- Rewards: TRL's reward functions see its decoded completion text, the dataset's columns and
  the rollout_func's extra fields. The environment's return is handed over as a field (the
  environment ran once, in grpo_lab's rollout); the length term is counted by each side; the
  answer reader on TRL's decoded text is a check with weight 0. The environment pays only on a
  "done" step, the text reading does not know how an episode ended: a row could differ where an
  episode cut by turns or tokens still ends in the right number, or where the whole sequence
  decoded at once reads differently from its turns decoded apart (none did in these runs).
- TRL's ``mask_truncated_completions`` (off here, its default) reads "truncated" as a last token
  that is neither <eos> nor pad: an episode cut after an observation would count as truncated.
- (d) times the update only: the same episodes on both sides (TRL's rollout_func returns the
  cached ones), so neither side samples: grpo_lab's advantages, loss forward, backward and
  AdamW step (its own exchange, as train() steps) against TRL's whole trainer step (its
  rollout_func call, reward functions, advantages, loss forward, backward, clip, AdamW).
"""


def grpo_lab_batch(policy, cfg, ctx, examples, ep, length_weight: float):
    """The episodes -> (rewards (N,), step.Batch): collect_episodes' advantage path on one
    process, the reward plus ``length_weight`` x completion tokens."""
    r, G, B = ep.scored.rollout, cfg.group_size, len(examples)
    rewards = ep.scored.rewards + length_weight * r.completion_mask.sum(1)          # (N,)
    prompt_index = torch.arange(B).repeat_interleave(G)                            # (N,)
    cluster_ids = torch.as_tensor(ctx.grouper([e.prompt for e in examples],
                                              [e.task for e in examples], rewards,
                                              prompt_index, 0, examples=examples))  # (B,)
    lengths = r.policy_mask.sum(1)
    adv = grouped_advantages(cluster_ids, prompt_index, rewards, cfg.group.combine, cfg.advantage,
                             lengths)                                               # (N,)
    env = get_environment(cfg.task)
    adv = get_credit(env.settings.credit).fn(adv, ep.turns, r.prompt_index,
                                             r.completion_ids.shape[1], env.settings)
    scored = ep.scored._replace(rewards=rewards)
    return rewards, Batch(scored, adv, {}, B * G, int(lengths.sum()), cluster_ids, {})


def rows_of(r):
    """Rollout -> TRL's rollout_func lists: unpadded prompt ids, completion ids, sampler
    log-probs (0.0 on the environment's tokens), env_mask (1: the policy's token)."""
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    for i in range(r.completion_ids.shape[0]):
        real = r.completion_mask[i]
        out["prompt_ids"].append(r.prompt_ids[i][r.prompt_mask[i]].tolist())
        out["completion_ids"].append(r.completion_ids[i][real].tolist())
        out["logprobs"].append(r.logprobs[i][real].tolist())
        out["env_mask"].append(r.policy_mask[i][real].int().tolist())
    return out


def trl_trainer(a, cfg, policy, examples, ep, d: str, probe: dict):
    """A GRPOTrainer on a fresh copy of the checkpoint whose rollout_func returns ``ep``'s
    sequences, each prompt's G episodes in grpo_lab's order -> trainer."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    G, rows = cfg.group_size, rows_of(ep.scored.rollout)
    where = {e.prompt: k for k, e in enumerate(examples)}
    returns = ep.scored.rewards.tolist()

    def rollout_func(prompts, trainer):
        """Each prompt arrives G times (TRL's RepeatSampler): its k-th copy gets episode k."""
        seen, order = {}, []
        for p in prompts:
            k = seen.get(p, 0)
            seen[p] = k + 1
            order.append(where[p] * G + k)
        probe["order"] = order
        return {**{key: [v[i] for i in order] for key, v in rows.items()},
                "env_return": [returns[i] for i in order]}

    def env_return(completions, env_return, **_):          # the environment's, handed over
        probe["env_return"] = list(env_return)
        return list(env_return)

    def length(completions, completion_ids, **_):          # counted by TRL: its completion
        probe["length"] = [float(len(c)) for c in completion_ids]
        return probe["length"]

    def text_reward(completions, answer, **_):             # TRL's decoded text, read again
        out = [float(same_number(extract(c), ans)) for c, ans in zip(completions, answer)]
        probe["text_reward"] = out
        return out

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=d, per_device_train_batch_size=a.B * G, num_generations=G,
        max_completion_length=ep.scored.rollout.completion_ids.shape[1],
        temperature=cfg.temperature, beta=0.0, loss_type="grpo", scale_rewards="group",
        epsilon=cfg.clip.eps_low, epsilon_high=cfg.clip.eps_high, max_grad_norm=cfg.grad_clip,
        learning_rate=cfg.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=cfg.weight_decay, adam_epsilon=cfg.adam_eps, gradient_checkpointing=False,
        reward_weights=[1.0, a.length_weight, 0.0], shuffle_dataset=False,
        max_steps=a.rounds + 1, logging_steps=10 ** 6, save_strategy="no", report_to="none",
        disable_tqdm=True, use_cpu=True, bf16=False, seed=a.seed, dataloader_num_workers=0)
    data = Dataset.from_dict({"prompt": [e.prompt for e in examples],
                              "answer": [e.answer for e in examples]})
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return GRPOTrainer(model=model, reward_funcs=[env_return, length, text_reward], args=args,
                       train_dataset=data, processing_class=policy.tokenizer,
                       rollout_func=rollout_func)


def compare_one_step(a, cfg, policy, ctx, examples, ep, trainer, probe) -> dict:
    """(a)-(c) on one step from the same weights (nothing updated)."""
    r, G = ep.scored.rollout, cfg.group_size
    rewards, batch = grpo_lab_batch(policy, cfg, ctx, examples, ep, a.length_weight)
    policy.train()
    policy.zero_grad()
    loss_g, _ = grpo_objective(policy, batch, cfg)
    loss_g.backward()
    grads_g = {n: p.grad.detach().clone() for n, p in policy.model.named_parameters()
               if p.grad is not None}
    logp_g = completion_logprobs(policy, r, cfg.temperature).detach()             # (N, Tc)

    model = trainer.model
    model.train()
    model.zero_grad()
    inputs = [{"prompt": e.prompt, "answer": e.answer} for e in examples for _ in range(G)]
    out = trainer._generate_and_score_completions(inputs)
    assert probe["order"] == list(range(len(inputs))), probe["order"]
    trainer.current_gradient_accumulation_steps = 1   # the train loop sets it (no accumulation)
    loss_t = trainer.compute_loss(model, out)
    loss_t.backward()
    grads_t = {n: p.grad.detach().clone() for n, p in model.named_parameters()
               if p.grad is not None}
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    att = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    with torch.no_grad():
        logp_t = trainer._get_per_token_logps_and_entropies(
            model, ids, att, out["completion_ids"].shape[1])[0]                    # (N, Tc)

    cm_t = out["completion_mask"].bool()
    lm_t = (out["completion_mask"] * out["tool_mask"]).bool()
    Tc = r.completion_ids.shape[1]
    assert lm_t.shape[1] == Tc and bool((out["completion_ids"][cm_t] ==
                                         r.completion_ids[r.completion_mask]).all())
    lm_g, cm_g = r.policy_mask, r.completion_mask
    both = lm_g & lm_t
    dlogp = (logp_g - logp_t).abs()[both]
    names = sorted(set(grads_g) | set(grads_t))
    missing = [n for n in names if n not in grads_g or n not in grads_t]
    diff = max(float((grads_g[n] - grads_t[n]).abs().max()) for n in names if n not in missing)
    scale = max(float(grads_t[n].abs().max()) for n in names if n not in missing)
    rel = [float((grads_g[n] - grads_t[n]).norm() / grads_t[n].norm().clamp_min(1e-30))
           for n in names if n not in missing]
    adv_t = out["advantages"].flatten()
    text = torch.tensor(probe["text_reward"])
    return {
        "rows": len(inputs), "Tc": Tc, "prompt_pad": int((~r.prompt_mask).sum()),
        "obs_tokens": int((cm_g & ~lm_g).sum()), "policy_tokens": int(lm_g.sum()),
        "rows_with_obs": int((cm_g & ~lm_g).any(1).sum()),
        "calls": sum(i.get("calls", 0) for i in ep.info),
        "loss_mask_agree": int((lm_g == lm_t).sum()), "cells": lm_g.numel(),
        "loss_g_only": int((lm_g & ~lm_t).sum()), "loss_t_only": int((lm_t & ~lm_g).sum()),
        "attend_agree": int((cm_g == cm_t).sum()), "obs_t": int((cm_t & ~lm_t).sum()),
        "rewards_g": rewards.tolist(), "returns": ep.scored.rewards.tolist(),
        "text_reward": text.tolist(),
        "rewards_t": [x + a.length_weight * n for x, n in zip(probe["env_return"],
                                                              probe["length"])],
        "text_agree": int((text == ep.scored.rewards).sum()), "end": list(ep.end),
        "adv_maxdiff": float((batch.advantages.flatten() - adv_t).abs().max()),
        "adv_scale": float(adv_t.abs().max()),
        "logp_maxdiff": float(dlogp.max()) if dlogp.numel() else 0.0,
        "sampler_vs_train": float((r.logprobs - logp_g).abs()[lm_g].max()),
        "loss_g": float(loss_g), "loss_t": float(loss_t),
        "grad_maxdiff": diff, "grad_scale": scale, "grad_rel_max": max(rel),
        "grad_rel_median": statistics.median(rel), "params": len(names), "missing": missing,
    }


def time_updates(a, cfg, policy, ctx, examples, ep, trainer) -> tuple[list, list]:
    """(d): TRL's trainer steps on the cached episodes, grpo_lab's update beside each one,
    alternating before (even steps) and after (odd) -> (grpo_lab s, TRL s), step 0 dropped."""
    from transformers import TrainerCallback

    ex = make_exchange(policy, cfg.exchange, AdamW(cfg.lr, cfg.adam_eps, cfg.weight_decay,
                                                   cfg.grad_clip, cfg.seed, {}, True), 1, 0,
                       cfg.blocks)
    ours, theirs, t0 = [], [], [0.0]

    def grpo_lab_update():
        t = time.perf_counter()
        _, batch = grpo_lab_batch(policy, cfg, ctx, examples, ep, a.length_weight)
        policy.train()
        ex.zero_grad()
        backward(grpo_objective, ex.module, [batch], cfg, 1, {})
        ex.reduce()
        ex.step()
        ours.append(time.perf_counter() - t)

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step % 2 == 0:
                grpo_lab_update()
            t0[0] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            theirs.append(time.perf_counter() - t0[0])
            if state.global_step % 2 == 0:          # global_step counts this step already
                grpo_lab_update()

    trainer.add_callback(Clock())
    trainer.train()
    return ours[1:], theirs[1:]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="data/hf_tiny")
    ap.add_argument("--chat", action="store_true",
                    help="chat template and bench_calculator.SYSTEM (SmolLM2-Instruct)")
    ap.add_argument("--B", type=int, default=32)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=2.0,
                    help="sampling and loss temperature (data/hf_tiny writes '=' at 2.0 only)")
    ap.add_argument("--length_weight", type=float, default=0.05,
                    help="reward += this x completion tokens on both sides (data/hf_tiny never "
                         "answers a product: the return alone is 0 everywhere, loss 0)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--rounds", type=int, default=6, help="timed steps per side")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_agents_trl.md"))
    ap.add_argument("--append", action="store_true", help="add to --out instead of replacing")
    a = ap.parse_args(argv)
    a.model = os.path.expanduser(a.model)
    torch.set_num_threads(a.threads)
    warnings.simplefilter("ignore")
    import transformers
    import trl

    cpu, load0, t_start = cpu_line(), load_average(), time.perf_counter()
    cfg = TrainConfig(objective="agent", task="calculator", policy="hf", base_checkpoint=a.model,
                      hf={"chat_template": a.chat}, system_prompt=SYSTEM if a.chat else "",
                      prompts_per_step=a.B, group_size=a.G, lr=a.lr, temperature=a.temperature,
                      kl={"beta": 0.0}, dynamic={"sampling": False}, warmup_steps=0,
                      lr_schedule="constant", weight_decay=0.0, steps=1, seed=a.seed,
                      eval_every=0, eval_size=0, time_budget_s=0.0, threads=a.threads)
    s = setup(cfg)
    policy, ctx = s.policy, s.ctx
    examples = ctx.draw(random.Random(f"{cfg.seed}-prompts-0-0"), a.B)     # collect_episodes'
    assert len({e.prompt for e in examples}) == a.B
    t = time.perf_counter()
    ep = sample_episodes(policy, examples, get_environment("calculator"), a.G, cfg.temperature,
                         generator=prompt_generators(cfg.seed, 0, 0, range(a.B)),
                         seeds=reset_seeds(cfg.seed, 0, range(a.B)))
    sample_s = time.perf_counter() - t
    probe: dict = {}
    with tempfile.TemporaryDirectory() as d:
        trainer = trl_trainer(a, cfg, policy, examples, ep, d, probe)
        c = compare_one_step(a, cfg, policy, ctx, examples, ep, trainer, probe)
        ours, theirs = time_updates(a, cfg, policy, ctx, examples, ep, trainer)
    load1 = load_average()
    ratio = statistics.median(theirs) / statistics.median(ours)
    pairs = [t / o for o, t in zip(ours, theirs)]
    args = " ".join(sys.argv[1:] if argv is None else argv)
    pct = lambda x, n: f"{x}/{n} ({x / max(n, 1):.1%})"                          # noqa: E731
    lines = [
        f"## {Path(a.model).name}: B={a.B} x G={a.G}, temperature {a.temperature}, "
        f"length_weight {a.length_weight}{', chat template + SYSTEM' if a.chat else ''}", "",
        f"Command: `PYTHONPATH=. /work/venv_trl/bin/python bench/bench_agents_trl.py {args}`", "",
        f"torch {torch.__version__} (CPU build), transformers {transformers.__version__}, trl "
        f"{trl.__version__}; {a.threads} torch thread(s). CPU: {cpu}. Load average (1, 5, 15 "
        f"min) {' '.join(f'{x:.2f}' for x in load0)} at the start, "
        f"{' '.join(f'{x:.2f}' for x in load1)} at the end (2 cores shared with a training "
        f"run: the ratio is side by side). Sampling the episodes (grpo_lab, once) "
        f"{sample_s:.1f} s; the whole bench {time.perf_counter() - t_start:.0f} s.", "",
        f"Episodes: {c['rows']} rows, completion width {c['Tc']}; {c['policy_tokens']} policy "
        f"tokens, {c['obs_tokens']} environment tokens in {c['rows_with_obs']} rows "
        f"({c['calls']} calculator calls); ends {dict((e, c['end'].count(e)) for e in set(c['end']))}; "
        f"prompt left padding {c['prompt_pad']} tokens in all (0: TRL's positions and grpo_lab's "
        f"coincide).", "",
        "| check | grpo_lab vs TRL |", "|---|---|",
        f"| (a) trained-on tokens (policy_mask vs completion_mask x tool_mask), cells agreeing | "
        f"{pct(c['loss_mask_agree'], c['cells'])}; grpo_lab only {c['loss_g_only']}, TRL only "
        f"{c['loss_t_only']} |",
        f"| (a) environment tokens left out of the loss | grpo_lab {c['obs_tokens']}, TRL "
        f"{c['obs_t']} |",
        f"| (a) attended tokens (completion_mask), cells agreeing | "
        f"{pct(c['attend_agree'], c['cells'])} |",
        f"| (b) reward per row (return + {a.length_weight} x tokens, TRL counting its own "
        f"completion tokens) | max abs diff "
        f"{max(abs(x - y) for x, y in zip(c['rewards_g'], c['rewards_t'])):.2e} (largest "
        f"{max(abs(x) for x in c['rewards_t']):.3f}) |",
        f"| (b) environment return vs TRL's reading of its decoded text (answer reader) | "
        f"{pct(c['text_agree'], c['rows'])} rows equal; returns sum {sum(c['returns']):g}, text "
        f"rewards sum {sum(c['text_reward']):g} |",
        f"| (b) advantages | max abs diff {c['adv_maxdiff']:.2e} (largest |A| {c['adv_scale']:.3f}) |",
        f"| (c) per-token log-probs on trained tokens (training forwards) | max abs diff "
        f"{c['logp_maxdiff']:.2e} (grpo_lab's sampler vs its training forward: "
        f"{c['sampler_vs_train']:.2e}) |",
        f"| (c) loss | grpo_lab {c['loss_g']:.6e}, TRL {c['loss_t']:.6e} |",
        f"| (c) gradient, {c['params']} tensors | max abs diff {c['grad_maxdiff']:.2e}, largest "
        f"entry {c['grad_scale']:.2e} (ratio {c['grad_maxdiff'] / max(c['grad_scale'], 1e-30):.1e}); "
        f"per tensor |g_lab - g_trl| / |g_trl|: max {c['grad_rel_max']:.1e}, median "
        f"{c['grad_rel_median']:.1e}{'; missing ' + str(c['missing']) if c['missing'] else ''} |",
        f"| (d) update s (median of {len(ours)}) | grpo_lab {statistics.median(ours):.4f}, TRL "
        f"{statistics.median(theirs):.4f}: **TRL / grpo_lab {ratio:.2f}** (per step pairs "
        f"{min(pairs):.2f}-{max(pairs):.2f}) |", ""]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(a.out)
    head = ("# grpo_lab's multi-turn step vs TRL 1.16 on the same calculator episodes "
            "(bench/bench_agents_trl.py)\n\n" + NOTES + "\n")
    old = out.read_text() if a.append and out.exists() else head
    out.write_text(old + ("\n" if a.append else "") + text)


if __name__ == "__main__":
    main()
