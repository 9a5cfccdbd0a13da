"""One training step in two halves, the same for every caller (trainer, notebooks, widgets).

    collect(policy, cfg, step, ctx) -> Batch                      (no grad)
        draw B prompts, seeded by (seed, step, draw): the same list on every rank
        this rank's contiguous slice of them -> G completions each (rollout.sample), prompt i
            sampled with its own generator seeded by (seed, step, draw, i)
        score (rewards.weighted_reward; step rewards for process supervision)
        gather every rank's rewards (gather_rows; the identity on one process)
        [dynamic sampling (DAPO): keep prompts whose G rewards differ, decided on the gathered
         rewards, so every rank keeps the same prompts]
        group ids: the grouper on all kept prompts (every rank computes the same ids)
        advantages on the global batch; this rank keeps the rows it sampled
        [the step variants (variants.py) add what they need at fixed points: per-row
         tensors (the reference's log-probs, the trainer's), reward shaping of this rank's rows
         before the gather (DAPO's soft overlong penalty, beta * KL when kl.placement="reward"), an
         advantage of their own (process supervision), the rows the loss keeps (overlong,
         verl's rollout rejection: tis.level seq_mean_k1)]
    objective(policy, batch, cfg, world) -> (loss, shares)        (with grad)
        grpo: loss.surrogate_loss on this rank's rows, the active variants' token weights
        (truncated IS, masks) and per-token terms (beta * KL, the entropy bonus) passed in,
        scaled by N * local / global normaliser, so
        the mean over ranks of the gradients is the gradient of the global batch's loss for
        every aggregation (token_mean divides by the global token count, not the rank's).
        supervised: cross-entropy on the answer tokens of demonstrations, likewise.
        ``shares`` are this rank's shares of the logged statistics: summed over ranks they give
        the global batch's value (on one process, the value itself).
    backward(objective, policy, split_batch(batch, m), cfg, world) -> shares
        gradient accumulation: the same decomposition inside a rank. A micro-batch of whole
        prompts keeps the global counts, so its loss is its share of the global loss, and the
        m backwards add up to the gradient (and the shares to the statistics) of the batch.

Everything a step computes depends only on (seed, step) and the global batch, so a run on N
processes computes what one process does, up to the float rounding of a gradient averaged
from N parts (tests/test_scaling.py). Metrics in ``Batch.metrics`` are those of the global
batch, the same on every rank.
"""
from __future__ import annotations

import hashlib
import math
import operator
import random
from dataclasses import dataclass, field
from functools import partial, reduce
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from grpo_lab.agents.environments import refuse_environment_tasks
from grpo_lab.distributed.group import Group
from grpo_lab.algorithm.advantages import (advantage_diagnostics, grouped_advantages,
                                           informative_groups, reward_group_diagnostics)
from grpo_lab.algorithm.grouping import cluster_diagnostics
from grpo_lab.algorithm.loss import AGGREGATIONS, surrogate_loss
from grpo_lab.algorithm.variants import Tokens, active_variants
from grpo_lab.registry import check_new, lookup
from grpo_lab.algorithm.rollout import (DRAWS, Scored, add_time, cat_scored,
                                        completion_logprobs, now, rollout_scorer, take_scored)
from grpo_lab.policies.engine import UPDATE_FORWARDS, left_pad, positions
from grpo_lab.tasks import get_task
from grpo_lab.tasks.rewards import resolve_rewards, step_rewards
from grpo_lab.timelimit import guard
from grpo_lab.tokenizer import EOS, PAD, encode


def max_new_tokens(cfg) -> int:
    return cfg.max_new_tokens or max(get_task(t).max_answer_len for t in cfg.task_names) + 2


def seed_of(*parts) -> int:
    """A 63-bit seed from any tuple of values (stable across processes and runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2 ** 63 - 1)


def prompt_generators(seed: int, step: int, draw: int, indices) -> list[torch.Generator]:
    """One generator per prompt, seeded by (seed, step, draw, prompt index)."""
    return [torch.Generator().manual_seed(seed_of(seed, step, draw, i)) for i in indices]


@dataclass
class StepContext:
    """What a step needs besides the policy and the config, resolved once per run (built by
    trainer.setup)."""
    draw: Callable                # (rng, n) -> n training examples
    grouper: Callable             # grouping.StepGrouper
    ref: torch.nn.Module | None = None   # frozen reference policy (beta > 0)
    group: Group = Group()
    clock: dict = field(default_factory=dict)  # seconds per phase of this step (time/*_s)
    carry: dict = field(default_factory=dict)  # an objective's state across steps, rebuilt
                                               # from (seed, step) when absent (resume)
    score: Callable | None = None  # cfg.rollout's sample-and-score; None: not resolved yet
    rewards: dict = field(default_factory=dict)  # {name: (function, weight)}: resolve_rewards
    max_new: int = 0              # the longest completion (max_new_tokens)
    mine: range = range(0)        # this rank's slice of the B prompts (Group.slice)

    def resolve(self, policy, cfg) -> None:
        """What stays the same for the whole run, resolved once (trainer.setup; a context
        built by hand: at its first draw): the longest completion, this rank's prompts, the
        rewards, the task generator and a grouper function under the user-code time limit (when
        they are user code), cfg.rollout's sample-and-score (vLLM: its engine built now)."""
        self.max_new, self.mine = max_new_tokens(cfg), self.group.slice(cfg.prompts_per_step)
        self.rewards = resolve_rewards(cfg.reward_weights)
        self.draw = guard(f"the task generator of {cfg.task!r}", self.draw,
                          *(get_task(t).make for t in cfg.task_names))
        self.grouper = guard(f"grouper {cfg.grouping!r}", self.grouper)  # a StepGrouper: itself
        self.score = rollout_scorer(policy, cfg, self)


class Batch(NamedTuple):
    """One GRPO step's data on this rank, plus the global counts the loss normalises by."""
    scored: Scored                # this rank's prompts and rows (N_r = B_r * G)
    advantages: torch.Tensor      # (N_r,) outcome, or (N_r, Tc) process supervision
    rows: dict                    # name -> (N_r, Tc) per-row tensors the variants' loss reads
                                  # ("ref": the reference's log-probs, "old": the trainer's)
    n_rows: int                   # rows of the global batch the loss keeps (B * G unless filtered)
    n_tokens: int                 # completion tokens of those rows
    cluster_ids: torch.Tensor     # (B,) group id of each prompt of the global batch
    metrics: dict                 # reward/, group/, adv/, sample/, completion/ of the global batch
    max_len: int = 0              # the longest completion, dr_grpo's constant (0: max_new_tokens)


# ---- a step over several ranks or draws: the bookkeeping, the identity on one process
#
# Every rank draws the same B prompts and samples its contiguous slice (``Group.slice``). With
# dynamic sampling a rank's kept rows are picked out of its draws (``my_rows``). The grouper
# and the advantages need the *global* batch, so on N ranks the ranks share each kept prompt's
# place, rewards (per-token rewards for process supervision), lengths and stop flags
# (``gather_rows``); each rank keeps the advantages of the rows it sampled. With one draw and
# one process both return their input.

class Gathered(NamedTuple):
    """What the grouper and the advantages read of a batch's N = B*G rows, G per prompt: this
    rank's (step.collect), or every rank's put together in global prompt order (gather_rows)."""
    rewards: torch.Tensor         # (N,)
    parts: dict                   # reward function name -> (N,)
    lengths: torch.Tensor         # (N,) completion tokens
    stopped: torch.Tensor         # (N,) bool
    step_rewards: list | None     # (N,) lists of per-token rewards (process supervision)
    rejected: torch.Tensor | None = None  # (N,) bool rows a variant rejects (tis.level seq_mean_k1)


def my_rows(kept, draws, mine: range) -> tuple[Scored, list[int]]:
    """This rank's kept rows (it sampled them) and their prompts' places in the global batch,
    when dynamic sampling drew more than once or kept fewer than the B prompts of its one draw
    (else collect keeps every row as sampled)."""
    parts = []
    for d, (_, s) in enumerate(draws):
        local = [i - mine.start for dd, i in kept if dd == d and i in mine]
        if local:
            parts.append(take_scored(s, torch.isin(s.rollout.prompt_index, torch.tensor(local))))
    places = [p for p, (d, i) in enumerate(kept) if i in mine]            # ascending
    empty = take_scored(draws[0][1], torch.zeros(len(draws[0][1].rewards), dtype=torch.bool))
    return (cat_scored(parts) if parts else empty), places


def gather_rows(group: Group, places: list[int], mine: Gathered, G: int) -> Gathered:
    """All ranks' (places, rows) -> the global batch's rows, in prompt order (one process:
    ``mine``, its places already in order)."""
    if group.world == 1:
        return mine
    shared = group.gather((places, *mine))
    order = [p for pl, *_ in shared for p in pl]                          # place of each block
    by_place = sorted(range(len(order)), key=order.__getitem__)           # blocks in place order

    def rows(tensors):                                                    # (N, ...) in place order
        t = torch.cat(tensors)
        return t.view(len(order), G, *t.shape[1:])[by_place].reshape(-1, *t.shape[1:])
    parts = {k: rows([x[2][k] for x in shared]) for k in shared[0][2]}
    steps_all = None
    if mine.step_rewards is not None:
        flat = [row for x in shared for row in x[5]]
        steps_all = [flat[i] for b in by_place for i in range(b * G, (b + 1) * G)]
    rejected = None if mine.rejected is None else rows([x[6] for x in shared])
    return Gathered(rows([x[1] for x in shared]), parts, rows([x[3] for x in shared]),
                    rows([x[4] for x in shared]), steps_all, rejected)


def _varies(rewards: torch.Tensor, G: int) -> torch.Tensor:
    """(B*G,) rewards -> (B,) bool: the prompt's G rewards are not all equal (DAPO's filter,
    advantages.informative_groups with the prompts as groups)."""
    if not len(rewards):
        return torch.zeros(0, dtype=torch.bool)
    return informative_groups(rewards, torch.arange(len(rewards)) // G)[1]


def score_draw(cfg, ctx: StepContext, step: int, policy, d: int):
    """Draw ``d`` of B prompts, seeded by (seed, step, d) -> (its B examples, this rank's
    slice of them sampled and scored: ``ctx.score``, prompt i with its own generator)."""
    if ctx.score is None:                    # a context built by hand, not by trainer.setup
        ctx.resolve(policy, cfg)
    examples = ctx.draw(random.Random(f"{cfg.seed}-prompts-{step}-{d}"), cfg.prompts_per_step)
    return examples, ctx.score(policy, [examples[i] for i in ctx.mine], cfg.group_size,
                               ctx.max_new, ctx.rewards, cfg.temperature, cfg.top_k or None,
                               generator=prompt_generators(cfg.seed, step, d, ctx.mine),
                               draw=DRAWS[cfg.sampler.draw],
                               drop_finished=cfg.sampler.drop_finished,
                               clock=ctx.clock, top_p=cfg.top_p)


def dynamic_draws(cfg, ctx: StepContext, step: int, policy):
    """DAPO's dynamic sampling: draws until B prompts whose G rewards differ (at most
    ``dynamic.max_draws``), decided on the gathered rewards, so every rank keeps the same
    prompts; short of B, topped up with the first draw's dull prompts. -> (kept [(draw,
    index)] sorted, per draw (examples, this rank's Scored), informative flags per draw)."""
    G, B = cfg.group_size, cfg.prompts_per_step
    draws, flags, kept = [], [], []
    for d in range(cfg.dynamic.max_draws):
        draws.append(score_draw(cfg, ctx, step, policy, d))
        f = torch.cat(ctx.group.gather(_varies(draws[-1][1].rewards, G)))  # (B,) rank order
        flags.append(f)
        kept += [(d, i) for i in range(B) if f[i]][:B - len(kept)]
        if len(kept) == B:
            break
    if len(kept) < B:                  # bounded: top up with the first draw's dull prompts
        kept += [(0, i) for i in range(B) if not flags[0][i]][:B - len(kept)]
    return sorted(kept), draws, flags


def _vectors(ctx: StepContext):
    """The step's prompt vectors from the grouper's fixed embedder (None: fit per batch)."""
    batch = getattr(ctx.grouper, "last_batch", None)
    return None if batch is None else batch.embeddings


def loss_rows(variants, cfg, stopped: torch.Tensor,
              rejected: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (the rows whose tokens the loss keeps (N,) bool, the rows per-row normalisers count
    (N,) bool): a variant's ``keep`` (overlong: "filter" counts the kept rows, "mask" every
    row), else every row; ``rejected`` rows (verl's rollout rejection, ``reject_rows``) leave
    both, as verl removes them from the response mask."""
    hooks = [v.keep for v in variants if v.keep is not None]              # the first decides
    keep, counts_dropped = (hooks[0](cfg, stopped) if hooks else
                            (torch.ones_like(stopped, dtype=torch.bool), False))
    counted = torch.ones_like(keep) if counts_dropped else keep
    if rejected is not None:
        keep, counted = keep & ~rejected, counted & ~rejected
    return keep, counted


def reject_rows(variants, cfg, rows: dict, r) -> torch.Tensor | None:
    """(N_r,) bool: this rank's rows a variant's ``reject`` hook takes out of the loss and its
    normaliser (None: no variant rejects)."""
    hooks = [v.reject for v in variants if v.reject is not None]
    if not hooks or not len(r.completion_ids):
        return None if not hooks else torch.zeros(0, dtype=torch.bool)
    return reduce(operator.or_, (h(cfg, rows, r) for h in hooks))


@torch.no_grad()
def collect(policy, cfg, step: int, ctx: StepContext) -> Batch:
    """Prompts -> rollouts -> rewards -> group ids -> advantages: one ``Batch``."""
    G, B = cfg.group_size, cfg.prompts_per_step
    variants = active_variants(cfg)                                       # variants.py
    # 1. B prompts, G completions each, scored (this rank samples its slice; DAPO redraws)
    if cfg.dynamic.sampling:
        kept, draws, flags = dynamic_draws(cfg, ctx, step, policy)
    else:
        draws, flags = [score_draw(cfg, ctx, step, policy, 0)], None
        kept = [(0, i) for i in range(B)]                                  # every prompt
    # 2. this rank's rows (one draw: all it sampled) and their prompts' places in the global
    #    batch; the per-row tensors the variants need (reference's, trainer's)
    one = len(draws) == 1 and len(kept) == B          # one draw, every prompt kept: as sampled
    mine, places = (draws[0][1], list(ctx.mine)) if one else my_rows(kept, draws, ctx.mine)
    r = mine.rollout
    rows = {k: x for v in variants if v.rows is not None                 # name -> (N_r, Tc)
            for k, x in v.rows(policy, cfg, r, ctx).items()}
    # 3. the variants' reward shaping of this rank's rows (overlong penalty, KL in the
    #    reward), then the global batch's rewards, lengths, stop flags (N ranks: gather_rows)
    for v in variants:
        if v.shape_rewards is not None:
            mine = v.shape_rewards(cfg, mine, rows, ctx.max_new)
    steps = (step_rewards(mine.texts, [mine.examples[i] for i in r.prompt_index.tolist()],
                          r.stopped.tolist()) if any(v.step_rewards for v in variants) else None)
    g = Gathered(mine.rewards, mine.parts, r.completion_mask.sum(1), r.stopped, steps,
                 reject_rows(variants, cfg, rows, r))                      # this rank's rows
    if ctx.group.world > 1:
        g = gather_rows(ctx.group, places, g, G)                           # every rank's rows
    own = torch.tensor([p * G + j for p in places for j in range(G)], dtype=torch.long)
    examples = [draws[d][0][i] for d, i in kept]                           # (B,)
    prompt_index = torch.arange(B).repeat_interleave(G)                    # (N,)
    # 4. group ids: the grouper on the global batch's prompts
    prompts, tasks = [e.prompt for e in examples], [e.task for e in examples]
    cluster_ids = torch.as_tensor(ctx.grouper(prompts, tasks, g.rewards, prompt_index, step,
                                              examples=examples))          # (B,)
    group_ids = cluster_ids[prompt_index]                                  # (N,)
    # 5. advantages on the global batch, (N,) or a variant's own (process supervision: (N, T),
    #    adv_flat their values over real tokens); this rank keeps its rows
    own_adv = [v.advantages for v in variants if v.advantages is not None]
    if own_adv:
        adv_all, adv_flat = own_adv[0](cfg, g, cluster_ids, prompt_index, group_ids)
    else:                                                                  # (N,) checked finite
        adv_all = adv_flat = grouped_advantages(cluster_ids, prompt_index, g.rewards,
                                                cfg.group.combine, cfg.advantage, g.lengths)
    adv = adv_all[own]                                                     # (N_r,) or (N_r, T)
    if adv.dim() == 2:
        adv = adv[:, :r.completion_ids.shape[1]]                           # (N_r, Tc)
    # 6. the global counts the loss normalises by: the rows it keeps (overlong, verl's
    #    rejection), their tokens
    keep, counted = loss_rows(variants, cfg, g.stopped, g.rejected)        # (N,), (N,)
    loss_reads = {k: rows[k] for v in variants for k in v.loss_rows if k in rows}
    return Batch(mine, adv, loss_reads, int(counted.sum()), int(g.lengths[keep].sum()), cluster_ids,
                 _metrics(ctx, g, prompts, tasks, cluster_ids, group_ids, prompt_index,
                          adv_all, adv_flat, kept, draws, flags), ctx.max_new)


def _metrics(ctx, g, prompts, tasks, cluster_ids, group_ids, prompt_index, adv_all, adv_flat,
             kept, draws, flags) -> dict:
    """reward/, group/, adv/, completion/, sample/ metrics of the global batch."""
    quality = ({"group/purity": 1.0} if len(set(cluster_ids.tolist())) == len(prompts)
               else cluster_diagnostics(prompts, cluster_ids.numpy(), tasks, tfidf=_vectors(ctx)))
    acc = g.parts.get("accuracy")     # completion/len_right (accuracy 1), /len_wrong (the rest):
    sides = () if acc is None else (("right", acc == 1), ("wrong", acc != 1))  # Dr. GRPO's bias
    metrics = {
        "reward/mean": float(g.rewards.mean()), "reward/std": float(g.rewards.std()),
        **{f"reward/{k}": float(v.mean()) for k, v in g.parts.items()},
        **reward_group_diagnostics(g.rewards, group_ids),
        **{k: v for k, v in quality.items() if not math.isnan(v)},
        "adv/abs_mean": float(adv_flat.abs().mean()),
        **advantage_diagnostics(adv_flat, prompt_index if adv_all.dim() == 1 else None),
        "completion/mean_len": float(g.lengths.float().mean()),
        "completion/stopped_frac": float(g.stopped.float().mean()),
        "completion/truncated_frac": float((~g.stopped).float().mean()),
        **{f"completion/len_{name}": float(g.lengths[side].float().mean())   # absent where
           for name, side in sides if side.any()},                            # a side is
    }
    if flags is not None:
        metrics.update({"sample/draws": len(draws), "sample/informative_frac":
                        float(torch.cat(flags).float().mean()),
                        "sample/topped_up": sum(not flags[d][i] for d, i in kept)})  # health.py
    return metrics


# ---- the objectives: (policy, batch, cfg, world) -> (loss, shares)

GRPO_STATS = ("loss/total", "clip/low_frac", "clip/high_frac", "clip/ratio_mean",
              "policy/entropy")


def logged_stats(names: tuple, cfg) -> tuple:
    """The statistics an objective logs: ``names`` without loss/kl when beta = 0 (no KL is
    computed then; a metric that was not computed is absent, not 0). The same on every rank."""
    return tuple(k for k in names if cfg.kl.beta != 0 or k != "loss/kl")


def grpo_stat_keys(cfg) -> tuple:
    """The statistics grpo_objective shares, the same on every rank: GRPO_STATS, the active
    variants' (``stat_keys``), clip/dual_frac when clip.dual_clip > 0."""
    own = tuple(k for v in active_variants(cfg) if v.stat_keys is not None
                for k in v.stat_keys(cfg))
    return GRPO_STATS + own + (("clip/dual_frac",) if cfg.clip.dual_clip else ())


def _zero_loss(policy) -> torch.Tensor:
    """A loss of 0 that still reaches every parameter, so backward gives zero gradients (a
    rank that holds no prompt this step still takes part in the exchange)."""
    return sum(p.sum() * 0.0 for p in policy.parameters())


def _rows_of(t: Tokens, w, keep) -> tuple[Tokens, torch.Tensor | None]:
    """The rows ``keep`` (N,) bool of every tensor of ``t`` and of the weight ``w``."""
    pick = lambda x: None if x is None else x[keep]                       # noqa: E731
    return Tokens(*(pick(x) for x in t[:-1]), {k: x[keep] for k, x in t.rows.items()}), pick(w)


def grpo_objective(policy, batch: Batch, cfg, world: int = 1):
    variants, r = active_variants(cfg), batch.scored.rollout
    keep, counted = loss_rows(variants, cfg, r.stopped,                    # (N_r,) tokens kept,
                              reject_rows(variants, cfg, batch.rows, r))   # rows counted
    n = int(counted.sum())                                                 # rows normalised by
    keys = grpo_stat_keys(cfg)
    if n == 0 or not batch.n_tokens:               # no row, or (overlong "mask") no token kept
        return _zero_loss(policy), dict.fromkeys(keys, 0.0)
    logp, entropy = completion_logprobs(policy, r, cfg.temperature, return_entropy=True,
                                        forward=UPDATE_FORWARDS[cfg.speed.update_forward],
                                        entropy_grad=bool(cfg.entropy_bonus.coef))
    dev = logp.device                                    # the batch is kept on the CPU
    keep, counted, m = keep.to(dev), counted.to(dev), r.policy_mask.to(dev)  # (N_r,) x2, (N_r, Tc)
    kept = m & keep[:, None]                                               # (N_r, Tc) in the loss
    rows, sampler = {k: x.to(dev) for k, x in batch.rows.items()}, r.logprobs.to(dev)
    t = Tokens(logp, rows.get("old", sampler), sampler, entropy, m & (keep | ~counted)[:, None],
               batch.advantages.to(dev), rows)    # overlong "mask" (TRL): the rows stay
    ws = [v.weight(cfg, t) for v in variants if v.weight is not None]     # (N_r, Tc) detached
    w = reduce(operator.mul, ws) if ws else None  # their product: the pg term's weight
    mine, mine_w = ((t, w) if counted.all()       # overlong "filter", verl's rejection:
                    else _rows_of(t, w, counted))  # the counted rows only
    loss, stats = surrogate_loss(                  # checked: TrainConfig checked the settings
        mine.logp, mine.old, mine.advantages, mine.mask, cfg.clip, cfg.loss.aggregation,
        batch.max_len or max_new_tokens(cfg), cfg.loss.ratio_level, cfg.loss.policy, mine_w,
        [partial(v.term, cfg, mine) for v in variants if v.term is not None], checked=True)
    n_tok = int(kept.sum())
    stats["policy/entropy"] = float(entropy.detach()[kept].sum()) / max(n_tok, 1)
    for v in variants:
        if v.stats is not None:
            stats.update(v.stats(cfg, t._replace(mask=kept), w))
    per_rows = AGGREGATIONS[cfg.loss.aggregation].per == "rows"     # what its normaliser counts
    share = n / batch.n_rows if per_rows else n_tok / batch.n_tokens       # 1.0 on one process
    shares = {k: stats[k] * (share if k == "loss/total" else n_tok / batch.n_tokens) for k in keys}
    return loss * (world * share), shares


class DemoBatch(NamedTuple):
    """Supervised step data on this rank: demonstrations, answer tokens as targets."""
    ids: torch.Tensor             # (B_r, T) long, left-padded
    mask: torch.Tensor            # (B_r, T) bool, real tokens
    target_mask: torch.Tensor     # (B_r, T) bool, answer + <eos> tokens (predicted)
    n_tokens: int                 # target tokens of the global batch
    metrics: dict


def demo_batch(examples, policy=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Examples -> ids (B, T), key mask (B, T), loss mask (B, T) on answer + <eos> targets.

    Prompt and answer are tokenized apart, as sampling sees them (a BPE merge across the
    "=" would teach tokens the sampler never starts from); ``policy`` gives the tokenizer
    (default: the toy char tokenizer)."""
    enc, eos, pad = (encode, EOS, PAD) if policy is None else \
        (policy.encode, policy.eos_id, policy.pad_id)
    seqs, n_answer = [], []
    for ex in examples:
        answer = enc(ex.answer) + [eos]
        seqs.append(enc(ex.prompt) + answer)
        n_answer.append(len(answer))
    ids, mask = left_pad(seqs, pad)                                        # (B, T)
    T = ids.shape[1]
    target_mask = torch.arange(T) >= T - torch.tensor(n_answer)[:, None]   # (B, T) predict these
    return ids, mask, target_mask


def collect_demos(policy, cfg, step: int, ctx: StepContext, rng=None) -> DemoBatch:
    """B demonstrations seeded by (seed, step), or drawn from ``rng`` -> this rank's slice."""
    examples = ctx.draw(rng or random.Random(f"{cfg.seed}-batch-{step}"), cfg.prompts_per_step)
    ids, mask, tmask = demo_batch([examples[i] for i in ctx.group.slice(len(examples))], policy)
    n_tokens = sum(len(policy.encode(e.answer)) + 1 for e in examples)      # global targets
    return DemoBatch(ids, mask, tmask, n_tokens, {})


def collect_demo_stream(policy, cfg, step: int, ctx: StepContext) -> DemoBatch:
    """``collect_demos`` with the demonstrations of step s the s-th batch of one stream,
    random.Random(seed) (the order the shipped base policies were pretrained in, pretrain.py),
    not a draw seeded by (seed, step). The stream lives in ``ctx.carry``; a context that has
    not drawn up to ``step`` (a resumed run) replays the stream from the start, so a resume
    stays exact."""
    at, rng = ctx.carry.get("demo_stream", (0, None))
    if rng is None or at != step:
        rng = random.Random(cfg.seed)
        for _ in range(step):
            ctx.draw(rng, cfg.prompts_per_step)
    ctx.carry["demo_stream"] = (step + 1, rng)              # after this step's draw, below
    return collect_demos(policy, cfg, step, ctx, rng)


def supervised_objective(policy, batch: DemoBatch, cfg, world: int = 1):
    dev = next(policy.parameters()).device
    ids, mask, t = batch.ids.to(dev), batch.mask.to(dev), batch.target_mask[:, 1:].to(dev)
    logits, _ = policy(ids, positions(mask), mask)                         # (B_r, T, V)
    ce = F.cross_entropy(logits[:, :-1][t].float(), ids[:, 1:][t], reduction="sum")  # t -> t+1
    return ce * world / batch.n_tokens, {"train/loss": float(ce.detach()) / batch.n_tokens}


def split_batch(batch, m: int) -> list:
    """This rank's ``Batch`` or ``DemoBatch`` -> up to ``m`` micro-batches of whole prompts
    (contiguous, sizes differing by at most one; fewer when the rank holds fewer prompts),
    each keeping the global counts (n_rows, n_tokens) that the objectives normalise by."""
    if isinstance(batch, DemoBatch):
        chunks = [c for c in torch.arange(batch.ids.shape[0]).tensor_split(m) if len(c)]
        return [batch._replace(ids=batch.ids[c], mask=batch.mask[c],
                               target_mask=batch.target_mask[c]) for c in chunks] or [batch]
    if not isinstance(batch, Batch):
        raise ValueError(f"micro-batches split a GRPO Batch or a DemoBatch, not a "
                         f"{type(batch).__name__}")
    index = batch.scored.rollout.prompt_index                              # (N_r,)
    chunks = [c for c in torch.arange(len(batch.scored.examples)).tensor_split(m) if len(c)]
    picks = [torch.isin(index, c) for c in chunks]                         # (N_r,) bool each
    return [batch._replace(scored=take_scored(batch.scored, p), advantages=batch.advantages[p],
                           rows={k: x[p] for k, x in batch.rows.items()})
            for p in picks] or [batch]


def backward(objective, policy, parts: list, cfg, world: int = 1,
             clock: dict | None = None) -> dict:
    """objective's backward on each micro-batch (``split_batch``), adding up in ``.grad`` ->
    the shares, summed; ``clock`` gets time/loss_forward_s and time/backward_s added."""
    shares, clock = {}, {} if clock is None else clock
    for part in parts:
        t0 = now()
        loss, s = objective(policy, part, cfg, world)
        t1 = now()
        loss.backward()
        add_time(clock, "time/loss_forward_s", t1 - t0)
        add_time(clock, "time/backward_s", now() - t1)
        shares = {k: shares.get(k, 0.0) + v for k, v in s.items()}
    return shares


@dataclass(frozen=True)
class Objective:
    """An objective of the one trainer, with what it needs and allows as fields (the trainer
    and config.py read these, never the name)."""
    name: str
    collect: Callable             # (policy, cfg, step, ctx) -> batch          (no grad)
    loss: Callable                # (policy, batch, cfg, world) -> (loss, shares)
    uses_reference: bool = True   # runs a frozen reference policy when beta > 0
    needs_group: bool = True      # a group-relative baseline: group_size >= 2
    splits: bool = True           # its loss keeps global normalisers: micro_batches > 1 works
    critic: bool = False          # trains a value head beside the policy (vf_lr applies)
    prepare: Callable | None = None   # (policy, cfg, load) -> None: attach extra modules
    check: Callable | None = None     # (cfg) -> None: raise on settings it does not support
    description: str = ""
    evaluate: Callable | None = None  # (policy, eval_sets, weights, max_new, samples=) -> metrics
                                      # (None: trainer.evaluate_tasks, single-turn greedy)


OBJECTIVES: dict[str, Objective] = {}


def register_objective(name: str, collect: Callable, loss: Callable, **capabilities) -> Objective:
    """Add an objective (``TrainConfig(objective=name)``) -> its record; the registry's naming
    rule (registry.check_new): re-registering the same function replaces it, another function
    under a taken name is an error."""
    check_new(OBJECTIVES, "objective", name, loss, lambda o: o.loss)
    OBJECTIVES[name] = Objective(name, collect, loss, **capabilities)
    return OBJECTIVES[name]


def get_objective(name: str) -> Objective:
    return lookup(OBJECTIVES, name, "objective", "register your own with step.register_objective")


def check_objective(cfg) -> Objective:
    """The objective ``cfg.objective`` names against the config -> its record: G for a group
    baseline, the critic's lr, micro-batches (global normalisers, an exchange that reduces
    after backward), then the objective's own ``check``."""
    objective = get_objective(cfg.objective)
    if cfg.group_size < 2 and objective.needs_group:       # PPO's critic needs no group
        raise ValueError(f"group_size (G) must be >= 2 for a group-relative baseline, "
                         f"got {cfg.group_size}")
    if cfg.ppo.vf_lr and not objective.critic:
        critics = sorted(n for n, o in OBJECTIVES.items() if o.critic)
        raise ValueError(f"ppo.vf_lr={cfg.ppo.vf_lr} is the critic's learning rate: it needs "
                         f"objective={critics[0]!r}, not {cfg.objective!r}")
    if objective.check is not None:
        objective.check(cfg)
    why = (f"objective={cfg.objective!r} (its loss is not normalised by global counts yet)"
           if not objective.splits else
           f"exchange.name={cfg.exchange.name!r} (DDP reduces during each backward)"
           if cfg.exchange.kind.reduces_in_backward else
           "exchange.overlap=True (it reduces during each backward)"
           if cfg.exchange.overlap else None)
    if cfg.micro_batches > 1 and why:
        raise ValueError(f"micro_batches={cfg.micro_batches} does not work with {why}")
    return objective


register_objective("grpo", collect, grpo_objective, check=refuse_environment_tasks,
                   description="GRPO: group-relative advantages, clipped surrogate + beta * KL")
register_objective("supervised", collect_demos, supervised_objective, uses_reference=False,
                   check=refuse_environment_tasks,
                   description="cross-entropy on task demonstrations (answers only)")
register_objective("pretrain", collect_demo_stream, supervised_objective, uses_reference=False,
                   needs_group=False, check=refuse_environment_tasks,
                   description="the supervised warm-up (preset pretrain_cpu, pretrain.py): "
                               "cross-entropy on demonstrations drawn from one seeded stream")
