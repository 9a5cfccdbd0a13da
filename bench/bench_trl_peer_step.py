"""Seconds per step: the toy demo (grpo_lab's 240k-parameter char GPT, preset tiny_cpu) vs TRL's
GRPOTrainer on issue 13's peer, a 605k-parameter GPT-2 with a 16-token char vocabulary.

Issue 13 asks that grpo_lab's step stay at least 1.5x faster than TRL's on that spec. The peer
is built here, nothing downloaded: a char-level WordLevel tokenizer (``tokenizers``: the 10
digits, "+", "=", and <pad>, <eos>, <bos>, <unk>; no special token is added to a prompt, as for
the toy) and ``transformers.GPT2Config`` 3 layers x 128 wide, 4 heads, 64 positions, tied
embeddings: 605,312 parameters. Randomly initialised it would rarely stop (<eos> is 1 of 16
tokens), so its completions would run to the cap while the toy's stop after answer + <eos>;
it is first warmed up on demonstrations with plain cross-entropy (grpo_lab's
objective="supervised" through ``train``, answer + <eos> targets, ``--warmup_steps`` steps),
so both sides stop after about the same number of tokens (the table reports each side's mean
completion length). The weights' values barely change the cost of a step; lengths do.

Three sides: ``grpo_lab`` (the demo: preset tiny_cpu, data/base_policy.safetensors),
``TRL`` (GRPOTrainer on the peer) and ``grpo_lab hf`` (grpo_lab's train on the same peer
GPT-2 through its HF path: the like-for-like control, which separates the framework from the
model's size). All: 16 prompts x G=8 completions of at most 5 tokens (addition's longest
answer + 2, grpo_lab's default), temperature 0.7, lr 1e-4 with cosine decay, mu = 1, rewards
accuracy + 0.5 * partial (bench_hf_trl's reward; the format reward is left out of all: when
this was measured bench_hf_trl did not yet read the stop from the completion ids TRL hands its
reward functions), beta 0.02 (issue 13's demo
settings; a reference model on every side) and beta 0. grpo_lab gets these explicitly
(warm-up 20 steps, the old demo's), so retuned preset defaults do not move the comparison.
TRL runs bench_hf_trl's "as shipped" config (its defaults: loss_type "dapo", activation
checkpointing on) with only lr 1e-4 and a cosine schedule without warm-up set.
One torch thread. The sides alternate in rounds (a fresh run of ``--steps`` steps per side,
beta and round, seed = round; the first 3 steps of each run dropped); the table gives the
median over the rounds' steps and TRL / side with a 95% t-interval over the rounds' ratios
of medians. Where each step goes: grpo_lab logs time/rollout_s (sampling, rewards, reference
forward, advantages) and, per phase, time/sample_s and time/loss_forward_s (the loop's own timers); TRL's
generation, its whole rollout and its loss forward (compute_loss) are timed by wrapping its
methods (its rollout by bench_hf_trl.trl_steps); the rest is backward, optimizer and the
loop's own overhead. The peer is passed to bench_hf_trl's helpers as ``a.model``.

    PYTHONPATH=. python bench/bench_trl_peer_step.py --rounds 5 --steps 30   # trl: bench venv
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench_hf_trl import grpo_lab_steps, trl_steps
from grpo_lab.training.config import preset
from grpo_lab.training.experiments import mean_ci
from grpo_lab.policies.hf import HFPolicy, HFPolicyConfig, transformers_module
from grpo_lab.training.trainer import train

CHARS = "0123456789+="
SIDES = ("grpo_lab", "grpo_lab hf", "TRL")     # the demo; grpo_lab on the peer GPT-2; TRL
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")


def char_tokenizer():
    """A 16-token char-level tokenizer: <pad>=0, <eos>=1, <bos>=2, <unk>=3, then CHARS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(SPECIALS + tuple(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")   # one per char
    tok.decoder = decoders.Fuse()                         # tokens are characters: concatenate
    return transformers_module().PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
        unk_token="<unk>")


def build_peer(out_dir: str, warmup_steps: int, threads: int) -> dict:
    """Write the peer GPT-2 and its tokenizer to ``out_dir``, warmed up on addition
    demonstrations -> {"params", "vocab", "warmup_s", "warmup_acc"}."""
    tf = transformers_module()
    tokenizer = char_tokenizer()
    config = tf.GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=128, n_layer=3,
                           n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                           bos_token_id=tokenizer.bos_token_id,
                           eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    policy = HFPolicy(tf.GPT2LMHeadModel(config), tokenizer,
                      HFPolicyConfig(out_dir, 64, len(tokenizer)))
    policy.save_pretrained(out_dir)
    info = {"params": policy.num_params(), "vocab": len(tokenizer), "warmup_s": 0.0,
            "warmup_acc": None}
    if not warmup_steps:
        return info
    seen = {}
    with tempfile.TemporaryDirectory() as d:
        c = preset("hf_tiny_cpu", base_checkpoint=out_dir, out_dir=d, objective="supervised",
                   steps=warmup_steps, prompts_per_step=64, lr=2e-3, warmup_steps=0,
                   weight_decay=0.01, eval_every=0, eval_size=200, time_budget_s=0.0,
                   ckpt_every=10 ** 6, threads=threads)
        h = train(c, progress=False, on_step=lambda m, p: seen.update(policy=p))
    seen["policy"].save_pretrained(out_dir)
    info.update(warmup_s=h[-1]["time/elapsed_s"], warmup_acc=h[-1]["eval/accuracy"])
    return info


def timed(fn, log: dict, key: str):
    """``fn`` that appends each call's seconds to log[key]."""
    def wrapper(*args, **kw):
        t = time.perf_counter()
        out = fn(*args, **kw)
        log.setdefault(key, []).append(time.perf_counter() - t)
        return out
    return wrapper


def trl_timers(log: dict):
    """-> probe(trainer) for bench_hf_trl.trl_steps: wraps TRL's generation and loss forward
    with timers that append each call's seconds to log["gen_s"], log["loss_s"], and its rollout
    so that each rollout's mean completion length goes to log["mean_len"]."""
    def probe(trainer):
        rollout = trainer._generate_and_score_completions

        def rollout_and_length(*args, **kw):                 # completion tokens, <eos> included
            out = rollout(*args, **kw)
            log.setdefault("mean_len", []).append(float(out["completion_mask"].sum(1).float()
                                                        .mean()))
            return out
        trainer._generate_single_turn = timed(trainer._generate_single_turn, log, "gen_s")
        trainer._generate_and_score_completions = rollout_and_length
        trainer.compute_loss = timed(trainer.compute_loss, log, "loss_s")
    return probe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30, help="steps per side, beta and round")
    ap.add_argument("--warmup_steps", type=int, default=300,
                    help="cross-entropy steps on demonstrations for the peer GPT-2 (0: random)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--trl_checkpointing", choices=("shipped", "off"), default="shipped",
                    help="TRL's activation checkpointing: as TRL 1.16 ships it (on), or off")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_trl_peer_step.md")))
    a = ap.parse_args()
    a.B, a.G, a.max_new, a.lr, a.eval_size, drop = 16, 8, 5, 1e-4, 0, 3
    a.device, a.temperature, a.chat_template = "cpu", 0.7, False     # bench_hf_trl's helpers
    demo = {"preset_name": "tiny_cpu", "base_checkpoint": preset("tiny_cpu").base_checkpoint}
    torch.set_num_threads(a.threads)
    import transformers
    import trl

    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    side = {}                                      # (beta, side) -> {"step_s": [...], ...}
    ratios, per_round = {}, []           # (beta, side) -> [per-round TRL / side medians]
    with tempfile.TemporaryDirectory() as peer:
        info = build_peer(peer, a.warmup_steps, a.threads)
        a.model = peer                         # TRL's and grpo_lab hf's model
        for r in range(a.rounds):
            for beta in (0.02, 0.0):
                runs = {}
                for name in (SIDES if r % 2 == 0 else SIDES[::-1]):
                    log = {}
                    if name == "TRL":
                        rows = trl_steps(a, beta, a.steps, seed=r, shipped=True,
                                         probe=trl_timers(log), learning_rate=a.lr,
                                         lr_scheduler_type="cosine", warmup_steps=0,
                                         **({"gradient_checkpointing": False}
                                            if a.trl_checkpointing == "off" else {}))
                    else:
                        where = demo if name == "grpo_lab" else {}      # else: a.model, HF
                        rows = grpo_lab_steps(a, beta, a.steps, seed=r, warmup_steps=20,
                                              lr_schedule="cosine", **where)
                        log = {k: [x[k] for x in rows] for k in ("gen_s", "loss_s")}  # the loop's
                    cols = {**{k: [x[k] for x in rows] for k in ("step_s", "rollout_s")},
                            **{k: log[k] for k in ("gen_s", "loss_s")},
                            "mean_len": log["mean_len"] if name == "TRL"
                            else [x["mean_len"] for x in rows]}
                    cols = {k: v[drop:] for k, v in cols.items()}
                    runs[name] = cols
                    for k, v in cols.items():
                        side.setdefault((beta, name), {}).setdefault(k, []).extend(v)
                med = {n: statistics.median(c["step_s"]) for n, c in runs.items()}
                for n in SIDES[:2]:
                    ratios.setdefault((beta, n), []).append(med["TRL"] / med[n])
                per_round.append(f"| {r} | {beta} | " + " | ".join(f"{med[n]:.4f}" for n in SIDES)
                                 + f" | {ratios[(beta, SIDES[0])][-1]:.2f} | "
                                   f"{ratios[(beta, SIDES[1])][-1]:.2f} |")
                print(per_round[-1], flush=True)
    m = lambda beta, name, k: statistics.median(side[(beta, name)][k])  # noqa: E731
    acc = "-" if info["warmup_acc"] is None else f"{info['warmup_acc']:.1%}"
    lines = [
        "# The toy demo's step vs TRL's GRPOTrainer on the issue-13 peer spec", "",
        f"Command: `PYTHONPATH=. /work/benchvenv/bin/python bench/bench_trl_peer_step.py "
        f"--rounds {a.rounds} --steps {a.steps} --warmup_steps {a.warmup_steps} "
        f"--threads {a.threads} --trl_checkpointing {a.trl_checkpointing}`", "",
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl "
        f"{trl.__version__}; {a.threads} torch thread(s); 2-core machine shared with other "
        f"jobs (load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end); "
        f"whole bench {time.perf_counter() - t0:.0f} s.", "",
        f"2-digit addition, B={a.B} prompts x G={a.G}, at most {a.max_new} new tokens, "
        f"temperature 0.7, lr {a.lr:g} cosine, rewards accuracy + 0.5 partial. "
        f"`grpo_lab`: the demo, preset tiny_cpu, data/base_policy.safetensors (240k-parameter "
        f"char GPT). `TRL`: GRPOTrainer on the peer GPT-2, {info['params']:,} parameters, "
        f"{info['vocab']}-token char vocabulary, warmed up {a.warmup_steps} cross-entropy steps "
        f"on demonstrations ({info['warmup_s']:.0f} s; held-out greedy accuracy {acc}). "
        f"`grpo_lab hf`: grpo_lab's train (preset hf_tiny_cpu's HF path) on that same GPT-2, "
        f"the like-for-like control. {a.rounds} rounds x {a.steps} steps per side and beta, "
        f"sides alternating, round r runs seed r on every side, first {drop} steps of "
        f"each run dropped; medians; the ratio's interval is the 95% t-interval over the "
        f"rounds' ratios of medians.", "",
        "| beta | side | s/step | TRL / side (95% CI) | mean completion tokens (<eos> in) |",
        "|---|---|---|---|---|"]
    for beta in (0.02, 0.0):
        for n in SIDES:
            ci = "-"
            if (beta, n) in ratios:
                mean, lo, hi = mean_ci(ratios[(beta, n)])
                ci = f"{mean:.2f} [{lo:.2f}, {hi:.2f}]"
            lines.append(f"| {beta} | {n} | {m(beta, n, 'step_s'):.4f} | {ci} | "
                         f"{statistics.mean(side[(beta, n)]['mean_len']):.2f} |")
    lines += ["", "Per round (median s/step):", "",
              "| round | beta | " + " | ".join(SIDES) + " | TRL / grpo_lab | TRL / grpo_lab hf |",
              "|---|---|---|---|---|---|---|", *per_round, "",
              "Where the step goes (medians, s; medians need not add up). rollout: sampling, "
              "rewards, reference forward (beta > 0), advantages; loss forward: the GRPO "
              "objective's forward (grpo_lab's objective, TRL's compute_loss); rest: step - "
              "rollout - loss forward = backward, optimizer, the loop's overhead.", "",
              "| beta | side | step | rollout | of which generation | loss forward | rest |",
              "|---|---|---|---|---|---|---|"]
    for beta in (0.02, 0.0):
        for n in SIDES:
            v = {k: m(beta, n, k) for k in ("step_s", "rollout_s", "gen_s", "loss_s")}
            lines.append(f"| {beta} | {n} | {v['step_s']:.4f} | {v['rollout_s']:.4f} | "
                         f"{v['gen_s']:.4f} | {v['loss_s']:.4f} | "
                         f"{v['step_s'] - v['rollout_s'] - v['loss_s']:.4f} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
