"""A learned reward model, and why GRPO here prefers verifiable rewards (issue 14).

RLHF (Ouyang et al. 2022) cannot check an answer, so it learns a reward model r_phi from
scored samples and optimises the policy against r_phi instead of the true reward. The policy
then searches for whatever r_phi over-rates: the proxy rises while the true reward stalls or
falls, more so the further the policy moves from the data r_phi was trained on ("reward
hacking"; Gao, Schulman & Hilton 2022, "Scaling laws for reward model overoptimization",
measure the gold reward rising, then falling, as KL(policy || init) grows). DeepSeekMath
(sec. 4) and this workbench use rule-based, verifiable rewards (tasks.py) for this reason.

Here the reward model is the cheapest thing that shows the effect honestly:

    data:   the base policy's own samples on a task (rollout.sample_and_score), each scored by
            the verifiable accuracy reward, 0 or 1 (a human labeller's stand-in)
    model:  a small char-level GPT body (model.GPT, from scratch: 2 layers, width 48) and a
            scalar head read at the last real token of "<prompt><completion>[<eos>]"
            (left-padded, so position T-1); r_phi = sigmoid(logit), in [0, 1]
    loss:   binary cross-entropy on the 0/1 labels, a held-out split by prompt
    reward: ``learned_reward(completions, examples, stopped)``, registered as "learned"
            (rewards.register_reward), so GRPO trains against it through the one trainer:
            ``reward_weights={"learned": 1.0, "accuracy": 0.0}`` (weight 0 still logs
            reward/accuracy, the true reward of the same samples). ``use_reward_model(m)``
            picks the model (forked workers, as run_experiment's, inherit it); without one,
            the first call trains ``default_reward_model()`` (seeded, seconds), so
            ``plugins="grpo_lab.training.reward_model"`` is enough in any process

Why this model (measured, BENCHMARKS.md "Learned reward model and reward hacking"): no
variant tried learns to check a sum from a few thousand samples. From scratch, 2 x 48, 300
steps: 256 prompts x 4 samples, held-out BCE 0.789 -> 0.759; 1024 x 4 (the default, 7 s)
0.772 -> 0.663, 60% agreement with the label; 4096 x 4, 1000 steps, 0.652, 62%. From the
base policy's own body (the usual RLHF choice: it already computes sums), 1024 x 4: 0.698
(lr 3e-4, 300 steps), 0.775 (lr 1e-3, 600 steps). Predicting the base rate scores 0.685.
So the reward model learns surface features of the base policy's answers, as a small RM on
little data does (Gao et al.: smaller RMs and less RM data over-optimise sooner): the base
is right more often on answers ending in 5-7 (55%) than in 0-3 (37%), and the RM scores a
held-out correct answer below the same answer with its last digit made 7. GRPO finds that.
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from grpo_lab.policies.model import GPT, GPTConfig
from grpo_lab.policies.engine import left_pad, positions
from grpo_lab.tasks.rewards import check_batch, register_reward, resolve_rewards
from grpo_lab.tasks import get_task, sample_examples
from grpo_lab.tokenizer import EOS, encode


@dataclass
class RMData:
    """Scored completions: N rows, row i is ``completions[i]`` written for ``examples[i]``."""
    examples: list                # (N,) Example
    completions: list             # (N,) str
    stopped: list                 # (N,) bool, emitted <eos>
    labels: torch.Tensor          # (N,) float, the verifiable score (0/1 accuracy)
    groups: torch.Tensor          # (N,) long, prompt index: the held-out split is by prompt

    def __post_init__(self):
        n = len(self.completions)
        if n == 0:
            raise ValueError("RMData is empty: a reward model needs at least one scored "
                             "completion")
        check_batch(self.completions, self.examples, self.stopped)
        if self.labels.shape != (n,) or self.groups.shape != (n,):
            raise ValueError(f"{n} completions but labels of shape {tuple(self.labels.shape)} "
                             f"and groups of shape {tuple(self.groups.shape)}: need ({n},)")


def collect_scored(policy, n_prompts: int = 256, G: int = 4, task: str = "addition",
                   temperature: float = 1.0, seed: int = 0, exclude: set | None = None) -> RMData:
    """The policy's own samples, scored by the accuracy reward: n_prompts * G rows.

    ``exclude``: prompts never to draw (the held-out evaluation set)."""
    from grpo_lab.algorithm.rollout import sample_and_score
    examples = sample_examples([get_task(task)], n_prompts, random.Random(f"rm-data-{seed}"),
                               exclude)
    s = sample_and_score(policy, examples, G, get_task(task).max_answer_len + 2,
                         resolve_rewards({"accuracy": 1.0}), temperature,
                         generator=torch.Generator().manual_seed(seed))
    rows = [examples[i] for i in s.rollout.prompt_index.tolist()]
    return RMData(rows, s.texts, s.rollout.stopped.tolist(), s.parts["accuracy"].clone(),
                  s.rollout.prompt_index.clone())


def rm_inputs(completions, examples, stopped) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ids (N, T) and key mask (N, T) of "<prompt><completion>[<eos>]", left-padded, so the
    last real token of every row is at T-1 (a completion that stopped ends in <eos>)."""
    check_batch(completions, examples, stopped)
    if not completions:
        raise ValueError("no completions to score")
    seqs = [encode(e.prompt) + encode(c) + ([EOS] if s else [])
            for c, e, s in zip(completions, examples, stopped)]
    return left_pad(seqs)                                                  # (N, T) each


class RewardModel(nn.Module):
    """r_phi(prompt, completion): a GPT body and a scalar head at the last token -> logits (N,)."""

    def __init__(self, body: GPT):
        super().__init__()
        self.body = body
        self.head = nn.Linear(body.cfg.n_embd, 1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        _, _, h = self.body(ids, positions(mask), mask, return_hidden=True)  # (N, T, C)
        return self.head(h[:, -1]).squeeze(-1)                              # (N,) last token

    @torch.no_grad()
    def score(self, completions, examples, stopped, batch: int = 512) -> torch.Tensor:
        """sigmoid(logit) per completion -> (N,) in [0, 1]."""
        self.eval()
        ids, mask = rm_inputs(completions, examples, stopped)
        return torch.cat([torch.sigmoid(self(ids[i:i + batch], mask[i:i + batch]))
                          for i in range(0, len(ids), batch)])


def split(data: RMData, held_out: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (train rows, held-out rows) as index tensors; a fraction ``held_out`` of the prompts
    (all their completions) goes to the held-out side."""
    if not 0 < held_out < 1:
        raise ValueError(f"held_out must be a fraction in (0, 1), got {held_out}")
    prompts = sorted(set(data.groups.tolist()))
    if len(prompts) < 2:
        raise ValueError(f"{len(prompts)} prompt(s) cannot be split into train and held-out")
    random.Random(f"rm-split-{seed}").shuffle(prompts)
    n_out = min(max(1, round(held_out * len(prompts))), len(prompts) - 1)
    out = torch.isin(data.groups, torch.tensor(prompts[:n_out]))           # (N,) bool
    return (~out).nonzero().flatten(), out.nonzero().flatten()


def train_reward_model(data: RMData, steps: int = 300, lr: float = 1e-3, batch: int = 64,
                       held_out: float = 0.25, seed: int = 0,
                       body: GPT | None = None) -> tuple[RewardModel, dict]:
    """Fit r_phi to the labels by BCE with AdamW -> (model in eval mode, log). ``body``: a
    GPT to start from (copied; e.g. the base policy); default a fresh 2-layer, width-48 GPT.

    log: train_loss (per step), heldout_loss_before / heldout_loss_after (BCE on the held-out
    prompts), heldout_acc_after (sigmoid > 0.5 agrees with the label), base_rate (mean train
    label: the BCE of always predicting it is the bar to beat), n_train, n_heldout."""
    if steps < 1 or batch < 1 or not lr > 0:
        raise ValueError(f"need steps >= 1, batch >= 1, lr > 0; got {steps}, {batch}, {lr}")
    lo, hi = float(data.labels.min()), float(data.labels.max())
    if not (0 <= lo and hi <= 1):
        raise ValueError(f"BCE needs labels in [0, 1], got values from {lo} to {hi} (divide a "
                         f"weighted reward by its largest possible value first)")
    torch.manual_seed(seed)
    model = RewardModel(copy.deepcopy(body) if body is not None else
                        GPT(GPTConfig(n_layer=2, n_head=4, n_embd=48)))
    ids, mask = rm_inputs(data.completions, data.examples, data.stopped)   # (N, T)
    tr, ho = split(data, held_out, seed)
    y = data.labels.float()

    def held_loss():
        model.eval()
        with torch.no_grad():
            logits = model(ids[ho], mask[ho])
        return float(F.binary_cross_entropy_with_logits(logits, y[ho])), logits

    before, _ = held_loss()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    losses = []
    with torch.enable_grad():     # also when first used inside the step's no_grad collect
        for _ in range(steps):
            model.train()
            rows = tr[torch.randint(len(tr), (batch,), generator=g)]       # (batch,)
            loss = F.binary_cross_entropy_with_logits(model(ids[rows], mask[rows]), y[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    after, logits = held_loss()
    model.eval().requires_grad_(False)
    return model, {"train_loss": losses, "heldout_loss_before": before,
                   "heldout_loss_after": after,
                   "heldout_acc_after": float(((logits > 0).float() == y[ho]).float().mean()),
                   "base_rate": float(y[tr].mean()), "n_train": len(tr), "n_heldout": len(ho)}


# ---- the registered reward: "learned" scores completions with the active reward model
ACTIVE: dict[str, RewardModel] = {}
"""The reward model "learned" uses; set by ``use_reward_model`` (forked workers inherit it),
else trained on first use by ``default_reward_model``."""


def default_data(base: str = "data/base_policy.safetensors") -> RMData:
    """The bench's reward-model data, seeded: 1024 addition prompts x 4 samples of the base
    policy at temperature 1, none from the held-out set."""
    from grpo_lab.policies.policy import load_policy_any
    from grpo_lab.tasks.task_data import load_eval
    policy = load_policy_any(base).eval()
    held = {e.prompt for e in load_eval("addition")}
    return collect_scored(policy, n_prompts=1024, exclude=held)


def default_reward_model(base: str = "data/base_policy.safetensors",
                         **kw) -> tuple[RewardModel, dict]:
    """The bench's reward model, deterministic: ``default_data``, 300 AdamW steps (seconds on
    one thread)."""
    return train_reward_model(default_data(base), **kw)


def use_reward_model(model: RewardModel) -> None:
    """Make ``model`` the one the "learned" reward scores with (this process and its forks)."""
    ACTIVE["learned"] = model


@register_reward("learned")
def learned_reward(completions, examples, stopped) -> list[float]:
    """r_phi(prompt, completion) in [0, 1] per completion, from the active reward model."""
    check_batch(completions, examples, stopped)
    if not completions:
        return []
    if "learned" not in ACTIVE:
        use_reward_model(default_reward_model()[0])
    return ACTIVE["learned"].score(completions, examples, stopped).tolist()


# ---- the figure (bench/bench_reward_hacking.py writes the curves; notebooks load them)
def _band(ax, x, runs, label, color=None, smooth: int = 1):
    """Mean of ``runs`` (seeds, len(x)) with a min-max band; a trailing moving average of
    ``smooth`` points first (per seed)."""
    v = torch.tensor(runs, dtype=torch.float64)                            # (seeds, T)
    if smooth > 1:
        c = torch.cat([torch.zeros(len(v), 1, dtype=v.dtype), v.cumsum(1)], 1)
        k = torch.arange(1, v.shape[1] + 1).clamp(max=smooth)              # (T,) window
        v = (c[:, 1:] - c[:, torch.arange(v.shape[1]) + 1 - k]) / k        # (seeds, T)
    line, = ax.plot(x, v.mean(0), label=label, color=color)
    ax.fill_between(x, v.min(0).values, v.max(0).values, color=line.get_color(), alpha=0.2)


def plot_reward_hacking(results: dict, smooth: int = 20):
    """One panel per variant: the learned reward the policy optimises (training samples,
    moving average of ``smooth`` steps) and the true accuracy (held-out, greedy), mean over
    seeds with a min-max band -> Figure. ``results``: bench/RESULTS_reward_hacking.json."""
    import matplotlib.pyplot as plt
    variants = results["variants"]
    ncols = min(2, len(variants))                          # 2 per row: readable at notebook width
    nrows = -(-len(variants) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(9, 2.6 * nrows + 0.9), sharey=True,
                             squeeze=False, layout="constrained")
    for ax in axes.flat[len(variants):]:
        ax.remove()
    for ax, (name, v) in zip(axes.flat, variants.items()):
        _band(ax, v["steps"], v["learned"], f"learned reward (train, avg {smooth})", "C1",
              smooth)
        _band(ax, v["steps"], v["train_accuracy"], f"true accuracy (train, avg {smooth})",
              "C0", smooth)
        _band(ax, v["eval_steps"], v["eval_accuracy"], "true accuracy (held-out)", "C2")
        ax.set_title(f"{name} (n={len(v['seeds'])} seeds)", fontsize=10)
        ax.set_xlabel("GRPO step", fontsize=9)
        ax.set_ylabel("reward / accuracy", fontsize=9)
        ax.tick_params(labelsize=9)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=9, frameon=False)
    fig.suptitle("GRPO against a learned reward model: proxy vs true reward (Gao et al. 2022); "
                 "mean over seeds, min-max band", fontsize=10)
    return fig


__all__ = ["RMData", "RewardModel", "collect_scored", "rm_inputs", "split", "train_reward_model",
           "default_data", "default_reward_model", "use_reward_model", "learned_reward",
           "plot_reward_hacking"]
