"""Group sampling and scoring: G completions per prompt, the prompt's KV cache computed once;
``sample_and_score`` = sample -> decode -> rewards.weighted_reward, the one path from prompts
to rewards (training, evaluation, widgets, benches), held in a ``Scored``.

GRPO (DeepSeekMath sec. 4.1) samples a group of G outputs {o_1..o_G} for each question q
from the old policy. Here the B prompts are left-padded into one batch and run through
the policy once; the resulting KV cache is repeated G times (``repeat_interleave``), so
the G completions of a prompt share its prompt computation. Completions then grow one
token per step against the cache; a completion that emitted <eos> is finished and gets
padding (mask False) from then on. Sampling stops when all are finished. The decode batch
and its speed levers (a prefix all prompts share prefilled once, finished rows dropped from
the batch, the policy's own decode cache) are the engine's (``engine.Decode``): the same
tokens with or without them.

A token is drawn from the temperature-scaled policy by one of ``DRAWS``: the exponential race
(token = argmax_v log p_v - log E_v, E_v ~ Exp(1): N x V draws per token) or the inverse CDF
(one uniform per row: the first token whose cumulative probability passes it). Both sample
softmax exactly; they map the noise to tokens differently, so the same seed gives other
tokens. With one generator per prompt a prompt's G completions depend only on its own
generator, not on which other prompts share the batch: a data-parallel run samples the same
tokens on 1 or N processes. Every step draws noise for all G rows of a prompt, finished or
not, so the streams do not depend on when rows stop.

``Rollout.logprobs`` holds log pi(token) under the temperature-scaled policy, which is
what the loss computes too; top-k and top-p only truncate what is sampled. Top-p (nucleus
sampling, Holtzman et al. 2020) keeps the smallest set of most likely tokens whose
probability reaches p (the token that crosses p included), after top-k as in transformers;
p = 1 skips the filter, so it leaves the sampler bit for bit as it was. Both filters are
deterministic functions of the logits, so per-prompt generators still draw the same tokens
on 1 or N processes. The full forward
(``completion_logprobs``) reproduces those numbers: tests/test_rollout.py checks it.
"""
from __future__ import annotations

import numbers
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from grpo_lab.policies.engine import (Decode, Recompute, chosen_logprobs, left_pad,
                                     prompt_once_logits, scaled_logits)
from grpo_lab.registry import check_new, lookup, register_settings
from grpo_lab.tasks.rewards import weighted_reward
from grpo_lab.tokenizer import PAD   # batch padding under a False mask (any valid id)


@dataclass
class Rollout:
    """One batch of sampled completions; N = B * G rows, completion i from prompt i // G."""
    prompt_ids: torch.Tensor       # (N, Tp) long, left-padded (the policy's pad_id)
    prompt_mask: torch.Tensor      # (N, Tp) bool, True on real prompt tokens
    completion_ids: torch.Tensor   # (N, Tc) long, the policy's pad_id after <eos>
    completion_mask: torch.Tensor  # (N, Tc) bool, True on sampled tokens (<eos> included)
    logprobs: torch.Tensor         # (N, Tc) float, log-prob of each sampled token, 0 on padding
    prompt_index: torch.Tensor     # (N,) long, index of the prompt (0..B-1) of each row
    stopped: torch.Tensor          # (N,) bool, True if the completion emitted <eos>
    loss_mask: torch.Tensor | None = None  # (N, Tc) bool, the policy's own tokens (a multi-turn
                                           # episode: not the environment's); None: all real

    @property
    def policy_mask(self) -> torch.Tensor:
        """(N, Tc) bool: the tokens the policy chose, what the loss and its statistics read
        (agents/episodes.py: the observations are real tokens the policy did not write)."""
        return self.completion_mask if self.loss_mask is None else self.loss_mask


@torch.no_grad()
def sample(model, prompts: list[list[int]], G: int, max_new_tokens: int,
           temperature: float = 1.0, top_k: int | None = None, greedy: bool = False,
           generator: torch.Generator | list[torch.Generator] | None = None,
           use_cache: bool = True, draw: Callable | None = None, drop_finished: bool = False,
           clock: dict | None = None, top_p: float = 1.0, share_prefix: bool = True) -> Rollout:
    """Sample G completions for each of B prompts (token lists) from the engine ``model`` ->
    Rollout with N = B*G rows, at most ``max_new_tokens`` each (module docstring). ``draw``: one of
    ``DRAWS`` (None: the race); ``generator``: one, or one per prompt; ``use_cache=False``:
    recompute every step; ``drop_finished``, ``share_prefix``: ``engine.Decode``'s levers (the
    same tokens); ``clock``: a dict that gets the seconds per phase added (``CLOCK_KEYS``)."""
    for bad, why in ((G < 1, f"group size G must be >= 1, got {G}"),
                     (max_new_tokens < 1, f"max_new_tokens must be >= 1, got {max_new_tokens}"),
                     (not temperature > 0, f"temperature must be > 0 (use greedy=True for argmax), "
                                        f"got {temperature}"),
                     (top_k is not None and top_k < 1, f"top_k must be >= 1 or None, got {top_k}"),
                     (not 0 < top_p <= 1, f"top_p must be in (0, 1] (1 = off), got {top_p}")):
        if bad:
            raise ValueError(why)
    tick, draw = Ticker({} if clock is None else clock), draw or race_draw
    dev = next(model.parameters()).device       # computed where the model is, returned on the CPU
    p_ids, p_mask = (t.to(dev) for t in left_pad(prompts, model.pad_id))   # (B, Tp)
    B, Tp = p_ids.shape
    if isinstance(generator, (list, tuple)) and len(generator) != B:
        raise ValueError(f"{len(generator)} generators for {B} prompts: give one per prompt")
    if Tp + max_new_tokens > model.cfg.block_size:
        raise ValueError(f"prompt length {Tp} + max_new_tokens {max_new_tokens} exceeds "
                         f"the model's block_size {model.cfg.block_size} (its longest "
                         f"context); shorten the prompt or max_new_tokens")
    was_training = model.training
    model.eval()
    dec = (Decode(model, p_ids, p_mask, prompts, G, max_new_tokens, share_prefix, drop_finished)
           if use_cache else Recompute(model, p_ids, p_mask, G, max_new_tokens))  # dec.last (N, V)
    N, pad = B * G, model.pad_id
    done = torch.zeros(N, dtype=torch.bool, device=dev)
    steps = []                                     # per new token: (token, log-prob, live) (N,)
    tick("time/prefill_s")
    for _ in range(max_new_tokens):
        logp = F.log_softmax(scaled_logits(dec.last, temperature), dim=-1)  # (n, V)
        tok_n = (logp.argmax(-1) if greedy else                            # (n,) ~ softmax
                 draw(logp, top_k, G, generator, dec.rows, N, top_p))
        live = ~done                                                       # (N,)
        tok = torch.full((N,), pad, device=dev).index_put((dec.rows,), tok_n).where(live, pad)
        lp = torch.zeros(N, device=dev).index_put((dec.rows,), logp.gather(1, tok_n[:, None])[:, 0])
        steps.append((tok, torch.where(live, lp, 0.0), live))
        done = done | (tok == model.eos_id)
        tick("time/decode_sample_s")
        if bool(done.all()):
            break
        dec.advance(tok, live, done)
        tick("time/decode_cache_s")
        dec.forward()                                                      # dec.last (n, V)
        tick("time/decode_forward_s")
    model.train(was_training)
    toks, lps, live = (torch.stack(x, 1).cpu() for x in zip(*steps))      # (N, Tc) each
    out = Rollout(p_ids.repeat_interleave(G, 0).cpu(), p_mask.repeat_interleave(G, 0).cpu(),
                  toks, live, lps, torch.arange(B).repeat_interleave(G), done.cpu())
    tick("time/decode_cache_s")
    return out


def now() -> float:
    """``time.perf_counter()`` after the GPU (if one is in use) has finished its queued work,
    so a phase's time is its own and not the launch time of its kernels."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def add_time(clock: dict, key: str, seconds: float) -> None:
    clock[key] = clock.get(key, 0.0) + seconds


class Ticker:
    """``tick(key)`` adds the seconds since the previous tick to ``clock[key]``."""

    def __init__(self, clock: dict):
        self.clock, self.t = clock, time.perf_counter()

    def __call__(self, key: str) -> None:
        t0, self.t = self.t, time.perf_counter()
        add_time(self.clock, key, self.t - t0)


CLOCK_KEYS = ("time/prefill_s", "time/decode_forward_s", "time/decode_sample_s",
              "time/decode_cache_s")


def prompt_noise(noise, N: int, G: int, generator) -> torch.Tensor:
    """``noise(rows, generator)`` for the N rows: from one generator, or row block
    [i*G, (i+1)*G) from the i-th generator of a list (one per prompt)."""
    if not isinstance(generator, (list, tuple)):
        return noise(N, generator)                                         # (N, ...)
    return torch.cat([noise(G, g) for g in generator])                     # (N, ...)


def top_k_filter(logp: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """-inf outside the top_k largest of each row (ties at the k-th kept)."""
    if top_k is not None and not (isinstance(top_k, numbers.Integral) and top_k >= 1):
        raise ValueError(f"top_k must be an int >= 1 or None, got {top_k!r}")
    if top_k is None or top_k >= logp.shape[-1]:
        return logp
    kth = logp.topk(top_k, dim=-1).values[:, -1:]                          # (n, 1)
    return logp.masked_fill(logp < kth, float("-inf"))


def top_p_filter(logp: torch.Tensor, p: float) -> torch.Tensor:
    """Log-probs (n, V) -> the same with every token outside the nucleus set to -inf: the
    most likely tokens, in order, up to and including the one whose cumulative probability
    reaches p (at least one token is kept). Renormalising is left to the draw."""
    if not 0 < p <= 1:                   # p <= 0 drops every token, NaN none: both refused
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {p}")
    probs = logp.softmax(-1)                                               # (n, V), renormalised
    sorted_p, order = probs.sort(-1, descending=True)                      # (n, V)
    before = sorted_p.cumsum(-1) - sorted_p                                # (n, V) mass above
    drop_sorted = before >= p                                              # (n, V) first kept
    drop = drop_sorted.scatter(-1, order, drop_sorted)                     # (n, V) vocab order
    return logp.masked_fill(drop, float("-inf"))


def nucleus(logp: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """Top-k, then top-p (p = 1: none) of the log-probs (n, V): -inf outside."""
    logp = top_k_filter(logp, top_k)
    return logp if top_p == 1 else top_p_filter(logp, top_p)


def race_draw(logp, top_k, G, generator, rows, N, top_p: float = 1.0) -> torch.Tensor:
    """The exponential race over the (top-k, top-p filtered) log-probs (n, V) -> tokens (n,);
    ``rows`` (n,): the decode batch's rows among the N, whose noise they take."""
    if top_k is not None or top_p != 1:        # != 1, not < 1: NaN and > 1 meet the refusal
        logp = nucleus(logp, top_k, top_p)
    exp1 = lambda n, g: torch.empty(n, logp.shape[1]).exponential_(generator=g)  # noqa: E731
    E = prompt_noise(exp1, N, G, generator).to(logp.device)[rows]          # (n, V) Exp(1)
    return (logp - E.clamp_min(1e-30).log()).argmax(-1)                    # (n,)


def inverse_cdf_draw(logp, top_k, G, generator, rows, N, top_p: float = 1.0) -> torch.Tensor:
    """One uniform per row against the cumulative probabilities (n, V) -> tokens (n,).

    The first v with cdf_v > u * cdf_V: a token of probability 0 is never picked (its cdf
    equals the one before). With top_k only the k largest are sorted and summed."""
    unif = lambda n, g: torch.rand(n, dtype=torch.float64, generator=g)    # noqa: E731
    u = prompt_noise(unif, N, G, generator).to(logp.device)[rows]          # (n,) U[0, 1)
    if top_p != 1:                             # != 1, not < 1: NaN and > 1 meet the refusal
        logp = nucleus(logp, top_k, top_p)
    idx = None
    if top_k is not None and top_k < logp.shape[-1]:
        logp, idx = logp.topk(top_k, dim=-1)                               # (n, k) each
    cdf = logp.exp().cumsum(-1, dtype=torch.float64)                       # (n, V|k)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)  # (n, 1)
    pick = pick.clamp_max(cdf.shape[1] - 1)
    return (pick if idx is None else idx.gather(1, pick)).squeeze(1)       # (n,)


DRAWS = {"race": race_draw, "inverse_cdf": inverse_cdf_draw}


def completion_logprobs(model, r: Rollout, temperature: float = 1.0,
                        return_entropy: bool = False, forward: Callable = prompt_once_logits,
                        entropy_grad: bool = False):
    """Per-token log-probs (N, Tc) of the completion under ``model``, 0 on padding, by the
    update forward ``forward`` (one of ``UPDATE_FORWARDS``: equal up to float rounding); with
    ``return_entropy`` and the policy's entropy at each token (N, Tc), without an autograd graph
    (``chosen_logprobs``) unless ``entropy_grad`` (an entropy bonus in the loss: autograd's
    log_softmax -> gather and -(p * log p).sum)."""
    logits, rows = forward(model, r)                       # (N, Tc, V) or (R, V) and (N, Tc)
    ids, mask = r.completion_ids.to(logits.device), r.completion_mask.to(logits.device)
    if entropy_grad and torch.is_grad_enabled():
        if rows is not None:
            logits = logits[rows]                                          # (N, Tc, V)
        logp = F.log_softmax(scaled_logits(logits, temperature), -1)       # (N, Tc, V)
        tok_logp = logp.gather(2, ids[..., None]).squeeze(2)               # (N, Tc)
        entropy = -(logp.exp() * logp).sum(-1)                             # (N, Tc)
    else:
        tok_logp, entropy = chosen_logprobs(logits, ids, temperature, return_entropy, rows)
    tok_logp = tok_logp.masked_fill(~mask, 0.0)                            # (N, Tc)
    return (tok_logp, entropy.masked_fill(~mask, 0.0)) if return_entropy else tok_logp


# ---- scoring: the sampled completions decoded and rewarded


class Scored(NamedTuple):
    """Completions sampled and scored: B prompts, N = B*G rows (row i from prompt
    ``rollout.prompt_index[i]``)."""
    examples: list                # (B,) Example
    rollout: Rollout              # N rows
    rewards: torch.Tensor         # (N,) weighted reward
    parts: dict                   # reward function name -> (N,)
    texts: list                   # (N,) decoded completions


@torch.no_grad()
def sample_and_score(policy, examples, G: int, max_new: int, rewards: dict,
                     temperature: float = 1.0, top_k: int | None = None, greedy: bool = False,
                     generator=None, clock: dict | None = None, by=sample, **sampler) -> Scored:
    """sample -> decode -> score (module docstring). ``rewards``: rewards.resolve_rewards'
    ``{name: (function, weight)}``. ``by``: the sampler, with ``sample``'s
    signature (vllm_rollout passes vLLM's); ``sampler``: its other options (draw, ...).
    ``clock``: add the seconds to "time/sample_s" (all of the sampler, which adds its own parts
    too) and "time/score_s" (decoding the tokens and the reward functions)."""
    t0 = now()
    r = by(policy, [policy.encode(e.prompt) for e in examples], G, max_new, temperature,
           top_k, greedy=greedy, generator=generator, clock=clock, **sampler)
    t1 = now()
    texts = [policy.decode(c) for c in r.completion_ids.tolist()]
    rows = [examples[i] for i in r.prompt_index.tolist()]                  # (N,)
    total, parts = weighted_reward(texts, rows, rewards, r.stopped.tolist())
    if clock is not None:
        add_time(clock, "time/sample_s", t1 - t0)
        add_time(clock, "time/score_s", now() - t1)
    return Scored(list(examples), r, total, parts, texts)


def take_scored(s: Scored, rows: torch.Tensor) -> Scored:
    """Keep the rows (N,) bool; the kept prompts renumbered 0..B'-1 in order."""
    r = s.rollout
    kept, new_index = torch.unique(r.prompt_index[rows], return_inverse=True)  # (B',), (N',)
    sub = Rollout(r.prompt_ids[rows], r.prompt_mask[rows], r.completion_ids[rows],
                  r.completion_mask[rows], r.logprobs[rows], new_index, r.stopped[rows],
                  None if r.loss_mask is None else r.loss_mask[rows])
    return Scored([s.examples[i] for i in kept.tolist()], sub, s.rewards[rows],
                  {k: v[rows] for k, v in s.parts.items()},
                  [s.texts[i] for i in rows.nonzero().flatten().tolist()])


def cat_scored(ss: list[Scored]) -> Scored:
    """Stack: prompts left-padded to one Tp, completions right-padded to one Tc, prompt
    indices shifted past the batches before."""
    rs = [s.rollout for s in ss]
    Tp, Tc = (max(getattr(r, k).shape[1] for r in rs) for k in ("prompt_ids", "completion_ids"))
    left = lambda x, v: F.pad(x, (Tp - x.shape[1], 0), value=v)          # noqa: E731
    right = lambda x, v: F.pad(x, (0, Tc - x.shape[1]), value=v)         # noqa: E731
    offsets = [sum(len(s.examples) for s in ss[:i]) for i in range(len(ss))]
    out = Rollout(
        prompt_ids=torch.cat([left(r.prompt_ids, PAD) for r in rs]),            # (N, Tp)
        prompt_mask=torch.cat([left(r.prompt_mask, False) for r in rs]),        # (N, Tp)
        completion_ids=torch.cat([right(r.completion_ids, PAD) for r in rs]),   # (N, Tc)
        completion_mask=torch.cat([right(r.completion_mask, False) for r in rs]),
        logprobs=torch.cat([right(r.logprobs, 0.0) for r in rs]),               # (N, Tc)
        prompt_index=torch.cat([r.prompt_index + o for r, o in zip(rs, offsets)]),  # (N,)
        stopped=torch.cat([r.stopped for r in rs]),                             # (N,)
        loss_mask=None if all(r.loss_mask is None for r in rs) else
        torch.cat([right(r.policy_mask, False) for r in rs]))                   # (N, Tc)
    return Scored([e for s in ss for e in s.examples], out, torch.cat([s.rewards for s in ss]),
                  {k: torch.cat([s.parts[k] for s in ss]) for k in ss[0].parts},
                  [t for s in ss for t in s.texts])


# ---- who samples the training rollout: TrainConfig.rollout names one (vllm_rollout.py adds
# "vllm"; a kind's check says which settings it cannot run with, at the config's checks)

@dataclass
class Sampler:
    """The ``sampler`` block (``--sampler.draw``): read by rollout kinds that name it (grpo_lab)."""
    draw: str = "race"
    """How a token is drawn (DRAWS): "race" (exponential race, V noise draws per token and
    row) or "inverse_cdf" (one uniform per row; same distribution, other tokens for the same
    seed). Both keep one generator per prompt."""
    drop_finished: bool = True
    """Take completions that emitted <eos> out of the decode batch (same tokens, less work)."""

    def check(self, cfg):
        lookup(DRAWS, self.draw, "sampler.draw")
        if self != Sampler() and "sampler" not in lookup(ROLLOUTS, cfg.rollout, "rollout").settings:
            raise ValueError(f"the sampler block is grpo_lab's sampler's; rollout={cfg.rollout!r} "
                             f"does not read it: leave it at its defaults")


register_settings("sampler", Sampler)


@dataclass(frozen=True)
class RolloutKind:
    """A rollout ``TrainConfig.rollout`` can name, with what the step and config.py call."""
    name: str
    scorer: Callable              # (policy, cfg, ctx) -> sample_and_score's signature
    check: Callable               # (cfg) -> None: raise on settings it cannot run
    description: str = ""
    settings: tuple = ()          # the settings blocks it reads ("sampler")


ROLLOUTS: dict[str, RolloutKind] = {}


def register_rollout(name: str, scorer: Callable, check: Callable = lambda cfg: None,
                     description: str = "", settings: tuple = ()) -> RolloutKind:
    """Add a rollout kind ``scorer(policy, cfg, ctx) -> sample_and_score's signature``;
    ``settings``: the names of the blocks it reads (``cfg.sampler``)."""
    check_new(ROLLOUTS, "rollout", name, scorer, lambda k: k.scorer)
    ROLLOUTS[name] = RolloutKind(name, scorer, check, description, tuple(settings))
    return ROLLOUTS[name]


def _own_sampler(policy, cfg, ctx):
    return sample_and_score


register_rollout("grpo_lab", _own_sampler, description="rollout.sample: the KV cache shared by "
                                                        "a prompt's G completions",
                 settings=("sampler",))


def rollout_scorer(policy, cfg, ctx) -> Callable:
    """The sample-and-score function of ``cfg.rollout`` (vLLM's engine built on first call)."""
    return lookup(ROLLOUTS, cfg.rollout, "rollout").scorer(policy, cfg, ctx)
