"""The multi-turn rollout: G episodes per prompt, the policy's turns sampled, each observation
appended as tokens, the KV cache kept across turns.

An episode is one token sequence: the prompt, then turns of the policy's action (sampled, up
to ``max_action_tokens``, ended by <eos>) and the environment's observation (forced into the
sequence, as nanochat's ``Engine`` forces a tool's output). ``Rollout.completion_mask`` marks
every real token after the prompt (the update forward attends to all of them);
``Rollout.loss_mask`` marks the policy's own: the step's ratio, KL, entropy, length normaliser
and completion statistics read that one (step.grpo_objective: ``Rollout.policy_mask``), so an
observation's tokens are fed to the model and never trained on (surrogate_loss replaces them
with 0 by ``torch.where``: exactly zero gradient, tests/test_agents.py).

Sampling, turn by turn for all N = B*G rows at once (nanochat batches one conversation;
TRL's environment mode runs one generate call per turn over the whole history):
  * the prompts run once, their cache repeated G times (as rollout.sample does);
  * an action grows one token a row per forward against the cache; a row that finished its
    action (or its episode) takes padding, a column whose key is masked; every turn draws
    ``max_action_tokens`` noises from each prompt's generator, used or not, so a prompt's
    episodes do not depend on the other prompts of the batch (the longest action of a turn):
    a run on N processes samples what one process does;
  * the environment steps every row whose action ended; the observations are left-padded into
    one block and prefilled onto the cache in one forward (not the whole history again);
    ``use_cache=False`` recomputes the whole history at every forward instead: the same
    tokens and log-probs up to float rounding (tests/test_agents.py).
Positions count real tokens only, so the padding columns change nothing; the rollout handed
to the step is compacted (each row's real tokens contiguous, padding at the end), the layout
every update forward of engine.UPDATE_FORWARDS reads.

Episode ends (``Episodes.end``): "done" (the environment said so), "turns" (still going after
``max_turns``), "tokens" (an action without its <eos> in ``max_action_tokens``, or no room left
in the policy's ``block_size`` for the next observation and one token). ``Rollout.stopped`` is
True for "done" only. The episode's reward is the sum of its turns' rewards.

Deviations: the first observation (``reset``'s) is the start of the completion, masked, rather
than part of the prompt (it may differ between a prompt's G episodes); an action that hits
``max_action_tokens`` ends the episode instead of being passed on unfinished.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Hashable, NamedTuple

import torch
import torch.nn.functional as F

from grpo_lab.agents.environments import (Environment, EnvironmentFailed, env_key, env_make,
                                          env_metrics, env_reset, env_step)
from grpo_lab.algorithm.rollout import Rollout, Scored, Ticker, race_draw
from grpo_lab.policies.engine import left_pad, positions, scaled_logits

ENDS = ("done", "turns", "tokens")


@dataclass(frozen=True)
class Turn:
    """One policy turn of an episode."""
    key: Hashable                 # the environment's state key before the action
    reward: float                 # the reward its step returned
    start: int                    # the action's tokens: completion columns [start, end)
    end: int


class Episodes(NamedTuple):
    """N = B*G episodes, row i from prompt i // G."""
    scored: Scored                # rollout with loss_mask; rewards (N,) = episode returns
    turns: list                   # (N,) lists of Turn
    end: list                     # (N,) one of ENDS
    obs_cut: int                  # observations cut to max_observation_tokens
    dropped_chars: int            # observation characters the policy cannot read, dropped
    info: tuple = ()              # (N,) each instance's ``metrics()`` ({} without the method)


class _Context:
    """The N rows' sequences so far: the KV cache (or every column, ``use_cache=False``), the
    key mask, each row's next position and the logits of its next token (``last``)."""

    def __init__(self, model, prompts: list[list[int]], G: int, use_cache: bool):
        dev = next(model.parameters()).device
        p_ids, p_mask = (t.to(dev) for t in left_pad(prompts, model.pad_id))   # (B, Tp)
        logits, cache = model(p_ids, positions(p_mask), p_mask, logits_to_keep=1)
        self.model, self.use_cache = model, use_cache
        self.cache = model.repeat_cache(cache, G) if use_cache else None
        self.ids = p_ids.repeat_interleave(G, 0)                           # (N, Tp) no-cache
        self.key_mask = p_mask.repeat_interleave(G, 0)                     # (N, Tk)
        self.next_pos = positions(p_mask)[:, -1].repeat_interleave(G, 0) + 1   # (N,)
        self.last = logits[:, -1].repeat_interleave(G, 0)                  # (N, V)

    def feed(self, ids: torch.Tensor, real: torch.Tensor) -> None:
        """A left-padded block ids, real (N, T) appended: ``last`` of each row with a real
        token in it becomes the logits after its last one."""
        key_mask = torch.cat([self.key_mask, real], 1)                     # (N, Tk+T)
        if self.use_cache:
            pos = torch.where(real, self.next_pos[:, None] + positions(real), 0)  # (N, T)
            logits, self.cache = self.model(ids, pos, key_mask, self.cache, logits_to_keep=1)
        else:                                      # the whole history, every time
            self.ids = torch.cat([self.ids, ids], 1)                       # (N, Tk+T)
            logits, _ = self.model(self.ids, positions(key_mask), key_mask, logits_to_keep=1)
        self.key_mask = key_mask
        self.last = torch.where(real.any(1)[:, None], logits[:, -1], self.last)   # (N, V)
        self.next_pos = self.next_pos + real.sum(1)


def _observation(model, text: str, limit: int) -> tuple[list[int], bool, int]:
    """Observation text -> (token ids, cut to ``limit``?, characters dropped as unreadable).
    Encoded as plain text (``encode_plain`` where the policy has one: an HF policy's
    ``encode`` wraps a prompt in its chat template, which an observation is not)."""
    bad = set(model.unknown_chars(text))
    kept = "".join(c for c in text if c not in bad)
    ids = getattr(model, "encode_plain", model.encode)(kept) if kept else []
    return ids[:limit], len(ids) > limit, len(text) - len(kept)


_STOPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def stop_tokens(model, stop: str, V: int, device) -> torch.Tensor | None:
    """(V,) bool on ``device``: the tokens whose text contains ``stop`` (an action ends after
    one: ``AgentSettings.stop``); None for no stop. Decoded once per policy and stop."""
    if not stop:
        return None
    seen = _STOPS.setdefault(model, {})
    if (stop, V) not in seen:
        tok = getattr(model, "tokenizer", None)
        texts = (tok.batch_decode([[i] for i in range(V)]) if tok is not None
                 else [model.decode([i]) for i in range(V)])
        seen[(stop, V)] = torch.tensor([stop in t for t in texts])
    return seen[(stop, V)].to(device)


@torch.no_grad()
def sample_episodes(model, examples, env: Environment, G: int, temperature: float = 1.0,
                    top_k: int | None = None, greedy: bool = False, generator=None,
                    seeds: list[int] | None = None, use_cache: bool = True, draw=race_draw,
                    top_p: float = 1.0, clock: dict | None = None) -> Episodes:
    """G episodes of ``env`` for each of the B ``examples`` (module docstring). ``generator``:
    one per prompt (or one); ``seeds``: the reset seed of each prompt (its G episodes start
    from the same state, as verl-agent resets a group); ``use_cache=False``: recompute."""
    s, B = env.settings, len(examples)
    N, pad, eos = B * G, model.pad_id, model.eos_id
    limit = model.cfg.block_size                   # positions 0..limit-1
    seeds = [0] * B if seeds is None else seeds
    if isinstance(generator, (list, tuple)) and len(generator) != B:
        raise ValueError(f"{len(generator)} generators for {B} prompts: give one per prompt")
    tick = Ticker({} if clock is None else clock)
    was_training = model.training
    model.eval()
    prompts = [model.encode(e.prompt) for e in examples]
    i = max(range(B), key=lambda i: len(prompts[i]), default=None)
    if i is not None and len(prompts[i]) > limit:      # else the model's position error
        raise ValueError(f"environment {env.name!r}: prompt {examples[i].prompt[:40]!r} is "
                         f"{len(prompts[i])} tokens, past the model's block_size {limit} (its "
                         f"longest context); shorten the task's prompts")
    ctx = _Context(model, prompts, G, use_cache)
    dev = ctx.last.device
    envs = [env_make(env) for _ in range(N)]
    stops = stop_tokens(model, s.stop, ctx.last.shape[-1], dev)
    seq: list[list[tuple[int, bool, float]]] = [[] for _ in range(N)]  # (token, policy's, logp)
    turns: list[list[Turn]] = [[] for _ in range(N)]
    end: list[str | None] = [None] * N
    counts = {"cut": 0, "dropped": 0}
    tick("time/prefill_s")

    def observe(texts: dict[int, str]) -> None:
        """Each row's observation text as tokens onto the sequences (one block, one forward);
        a row with no room left for it and one action token ends, truncated by tokens."""
        block = {}
        for i, text in texts.items():
            ids, cut, dropped = _observation(model, text, s.max_observation_tokens)
            counts["cut"] += cut
            counts["dropped"] += dropped
            if int(ctx.next_pos[i]) + len(ids) + 1 > limit:
                end[i] = "tokens"
            elif ids:
                block[i] = ids
                seq[i] += [(t, False, 0.0) for t in ids]
        if block:
            T = max(len(b) for b in block.values())
            ids = torch.full((N, T), pad, dtype=torch.long)
            real = torch.zeros(N, T, dtype=torch.bool)
            for i, b in block.items():
                ids[i, T - len(b):], real[i, T - len(b):] = torch.tensor(b), True   # left-padded
            ctx.feed(ids.to(dev), real.to(dev))

    observe({i: env_reset(env, envs[i], examples[i // G], seeds[i // G]) for i in range(N)})
    tick("time/env_s")
    for turn in range(s.max_turns):
        live = [i for i in range(N) if end[i] is None]
        if not live:
            break
        keys = {i: env_key(env, envs[i], turn + 1) for i in live}
        start = {i: len(seq[i]) for i in live}
        acting = torch.zeros(N, dtype=torch.bool, device=dev)
        acting[live] = True
        every = torch.arange(N, device=dev)
        for k in range(s.max_action_tokens):
            room = ctx.next_pos < limit                                    # (N,) a position left
            for i in (acting & ~room).nonzero().flatten().tolist():
                end[i] = "tokens"
            acting &= room
            logp = F.log_softmax(scaled_logits(ctx.last, temperature), -1)  # (N, V)
            if not bool(acting.any()):
                for _ in range(s.max_action_tokens - k if not greedy else 0):
                    draw(logp, top_k, G, generator, every, N, top_p)   # noise not used
                break
            tok = (logp.argmax(-1) if greedy else
                   draw(logp, top_k, G, generator, every, N, top_p))
            tok = torch.where(acting, tok, pad)                            # (N,)
            lp = logp.gather(1, tok[:, None])[:, 0]                        # (N,)
            for i in acting.nonzero().flatten().tolist():
                seq[i].append((int(tok[i]), True, float(lp[i])))
            tick("time/decode_sample_s")
            ctx.feed(tok[:, None], acting[:, None])
            tick("time/decode_forward_s")
            acting &= tok != eos
            if stops is not None:                  # AgentSettings.stop: the action ends too
                acting &= ~stops[tok]
        for i in acting.nonzero().flatten().tolist():                     # no <eos> in time
            end[i] = "tokens"
        texts = {}
        for i in live:
            if end[i] is not None:
                continue
            action = model.decode([t for t, _, _ in seq[i][start[i]:]])    # up to its <eos>
            obs, reward, done = env_step(env, envs[i], action, turn + 1)
            turns[i].append(Turn(keys[i], reward, start[i], len(seq[i])))
            if done:
                end[i] = "done"
            elif turn == s.max_turns - 1:
                end[i] = "turns"
            else:
                texts[i] = obs
        tick("time/env_s")
        observe(texts)
        tick("time/decode_forward_s")
    model.train(was_training)
    end = [e or "turns" for e in end]
    info = tuple(env_metrics(env, e) for e in envs)
    scored = _scored(model, examples, prompts, seq, turns, end, G)
    bad = (~torch.isfinite(scored.rewards)).nonzero().flatten()   # each turn's was finite
    if len(bad):                                   # but 1e300, or a sum, overflows float32
        i = int(bad[0])
        raise EnvironmentFailed(f"environment {env.name!r}: episode {i}'s turn rewards "
                                f"{[t.reward for t in turns[i]]} make a return of "
                                f"{float(scored.rewards[i])} in float32 (|x| <= "
                                f"{torch.finfo(torch.float32).max:.3g}); rescale them")
    return Episodes(scored, turns, end, counts["cut"], counts["dropped"], info)


def _scored(model, examples, prompts, seq, turns, end, G: int) -> Scored:
    """The episodes as the step's ``Scored``: prompts left-padded, each row's real tokens
    contiguous (right-padded), the policy's marked in loss_mask; texts show the observations
    in brackets."""
    N, pad = len(seq), model.pad_id
    Tc = max(1, max(len(x) for x in seq))
    ids = torch.full((N, Tc), pad, dtype=torch.long)
    mask = torch.zeros(N, Tc, dtype=torch.bool)
    own = torch.zeros(N, Tc, dtype=torch.bool)
    logp = torch.zeros(N, Tc)
    for i, row in enumerate(seq):
        if row:
            t, p, lp = zip(*row)
            ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(t), True
            own[i, :len(row)], logp[i, :len(row)] = torch.tensor(p), torch.tensor(lp)
    p_ids, p_mask = left_pad(prompts, pad)                                 # (B, Tp)
    r = Rollout(p_ids.repeat_interleave(G, 0), p_mask.repeat_interleave(G, 0), ids, mask, logp,
                torch.arange(len(prompts)).repeat_interleave(G),
                torch.tensor([e == "done" for e in end]), loss_mask=own)
    rewards = torch.tensor([sum(t.reward for t in row) for row in turns], dtype=torch.float32)
    texts = [episode_text(model, row) for row in seq]
    return Scored(list(examples), r, rewards, {"env": rewards.clone()}, texts)


def episode_text(model, row) -> str:
    """An episode's tokens [(token, policy's, logp)] as text: each observation in [brackets],
    each action's <eos> as "|"."""
    out, span = [], []
    for k, (t, own, _) in enumerate(row):
        span.append(t)
        if k + 1 == len(row) or row[k + 1][1] != own or t == model.eos_id:   # a span ends
            text = model.decode(span)
            out.append(text + ("|" if span[-1] == model.eos_id else "") if own else f"[{text}]")
            span = []
    return "".join(out)
