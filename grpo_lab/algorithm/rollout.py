"""Group sampling: G completions per prompt, the prompt's KV cache computed once.

GRPO (DeepSeekMath sec. 4.1) samples a group of G outputs {o_1..o_G} for each question q
from the old policy. Here the B prompts are left-padded into one batch and run through
the policy once; the resulting KV cache is repeated G times (``repeat_interleave``), so
the G completions of a prompt share its prompt computation. Completions then grow one
token per step against the cache; a completion that emitted <eos> is finished and gets
padding (mask False) from then on. Sampling stops when all are finished.

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

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpo_lab.registry import lookup
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

    @property
    def group_size(self) -> int:
        return int((self.prompt_index == 0).sum())


def take_rows(r: Rollout, rows: torch.Tensor) -> tuple[Rollout, torch.Tensor]:
    """Keep the rows (N,) bool -> (rollout with the kept prompts renumbered 0..B'-1 in order,
    the kept prompts' old indices (B',))."""
    kept_prompts, new_index = torch.unique(r.prompt_index[rows], return_inverse=True)
    return Rollout(r.prompt_ids[rows], r.prompt_mask[rows], r.completion_ids[rows],
                   r.completion_mask[rows], r.logprobs[rows], new_index, r.stopped[rows]), kept_prompts


def cat_rollouts(rs: list[Rollout], n_prompts: list[int]) -> Rollout:
    """Stack batches of ``n_prompts`` prompts each: prompts left-padded to one Tp, completions
    right-padded to one Tc, prompt indices shifted past the batches before."""
    Tp = max(r.prompt_ids.shape[1] for r in rs)
    Tc = max(r.completion_ids.shape[1] for r in rs)
    left = lambda x, v: F.pad(x, (Tp - x.shape[1], 0), value=v)          # noqa: E731
    right = lambda x, v: F.pad(x, (0, Tc - x.shape[1]), value=v)         # noqa: E731
    offsets = [sum(n_prompts[:i]) for i in range(len(rs))]
    return Rollout(
        prompt_ids=torch.cat([left(r.prompt_ids, PAD) for r in rs]),            # (N, Tp)
        prompt_mask=torch.cat([left(r.prompt_mask, False) for r in rs]),        # (N, Tp)
        completion_ids=torch.cat([right(r.completion_ids, PAD) for r in rs]),   # (N, Tc)
        completion_mask=torch.cat([right(r.completion_mask, False) for r in rs]),
        logprobs=torch.cat([right(r.logprobs, 0.0) for r in rs]),               # (N, Tc)
        prompt_index=torch.cat([r.prompt_index + o for r, o in zip(rs, offsets)]),  # (N,)
        stopped=torch.cat([r.stopped for r in rs]))                             # (N,)


def left_pad(prompts: list[list[int]], pad: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> ids (B, Tp) left-padded with ``pad``, mask (B, Tp) bool.

    The mask comes from the lengths, not from ``ids != pad``: an HF tokenizer's pad may be
    its <eos>, which a demonstration ends with."""
    if not prompts:
        raise ValueError("no prompts to sample from (empty prompt list)")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
    Tp = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), Tp), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), Tp), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, Tp - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, Tp - len(p):] = True
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids (B, T) counting real tokens only; padding gets 0."""
    return (mask.long().cumsum(1) - 1).clamp(min=0)


SHARED_PREFIX_MIN = 16
"""The fewest tokens every prompt of a batch must start with before ``sample`` prefills them
once (a chat template's system turn: SmolLM2's is 24 tokens). The toy's prompts never share
that many, so its runs never take this path."""


def shared_prefix(prompts: list[list[int]], minimum: int = SHARED_PREFIX_MIN) -> int:
    """The number of leading tokens all ``prompts`` have in common, each keeping at least one
    token after them; 0 when that is fewer than ``minimum`` or there is one prompt."""
    if len(prompts) < 2:
        return 0
    first, most = prompts[0], min(len(p) for p in prompts) - 1
    c = 0
    while c < most and all(p[c] == first[c] for p in prompts):
        c += 1
    return c if c >= minimum else 0


def prefill_shared(model, prompts: list[list[int]], c: int, pad: int, dev):
    """The prompts' first logits and cache with their common first ``c`` tokens run once:
    the prefix as one row, its cache repeated to the B rows, then the rest of each prompt,
    left-padded, against it. -> (logits (B, 1, V), cache, ids (B, c + Ts), key mask
    (B, c + Ts)): the decode's layout is [prefix | padding | rest of the prompt], the
    positions are the prompts' own (padding is masked and takes no position), so the
    arithmetic is the left-padded prompt's, up to float rounding."""
    B = len(prompts)
    prefix = torch.tensor([prompts[0][:c]], dtype=torch.long, device=dev)  # (1, c)
    seen = torch.ones(1, c, dtype=torch.bool, device=dev)                  # (1, c)
    _, cache = model(prefix, positions(seen), seen, logits_to_keep=1)
    cache = model.repeat_cache(cache, B)                                   # (B, ...) c columns
    s_ids, s_mask = (t.to(dev) for t in left_pad([p[c:] for p in prompts], pad))  # (B, Ts)
    key_mask = torch.cat([seen.expand(B, c), s_mask], 1)                   # (B, c + Ts)
    logits, cache = model(s_ids, c + positions(s_mask), key_mask, cache, logits_to_keep=1)
    return logits, cache, torch.cat([prefix.expand(B, c), s_ids], 1), key_mask


@torch.no_grad()
def sample(model, prompts: list[list[int]], G: int, max_new_tokens: int,
           temperature: float = 1.0, top_k: int | None = None, greedy: bool = False,
           generator: torch.Generator | list[torch.Generator] | None = None,
           use_cache: bool = True, draw: str = "race", drop_finished: bool = False,
           clock: dict | None = None, top_p: float = 1.0, share_prefix: bool = True) -> Rollout:
    """Sample G completions for each of B prompts -> Rollout with N = B*G rows.

    ``draw`` names how a token is drawn from the temperature-scaled policy (``DRAWS``): the
    exponential race (token = argmax_v log p_v - log E_v, E_v ~ Exp(1): N x V draws per
    token) or the inverse CDF (one uniform per row: the first token whose cumulative
    probability passes it). Both sample softmax exactly; they map the noise to tokens
    differently, so the same seed gives other tokens. ``generator`` is one torch.Generator
    for the whole batch, or a list of B, one per prompt: then a prompt's G completions depend
    only on its own generator, not on which other prompts share the batch, which is what
    makes a data-parallel run sample the same tokens on 1 or N processes. Every step draws
    noise for all G rows of a prompt, finished or not, so the streams do not depend on when
    rows stop. ``drop_finished`` takes rows that emitted <eos> out of the decode batch (their
    cache rows too: the policy's ``select_cache``); the tokens are the same.
    ``use_cache=False`` recomputes the whole sequence every step (for benchmarks and
    equivalence tests; the result is the same). ``model`` is any policy.Policy: its
    ``pad_id`` fills rows after their <eos> (``eos_id``), ``repeat_cache`` shares the cache.
    ``clock``: a dict that gets the seconds spent per phase added (``CLOCK_KEYS``).
    ``share_prefix``: when every prompt starts with the same ``SHARED_PREFIX_MIN`` or more
    tokens (a chat template's system turn), that prefix is prefilled once for the batch
    (``prefill_shared``; with the KV cache only): the same numbers up to float rounding.
    """
    if G < 1:
        raise ValueError(f"group size G must be >= 1, got {G}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    lookup(DRAWS, draw, "draw")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p}")
    drop_finished = drop_finished and use_cache and hasattr(model, "select_cache")
    clock = {} if clock is None else clock
    tick = Ticker(clock)
    dev = next(model.parameters()).device       # computed where the model is, returned on the CPU
    pad, eos = model.pad_id, model.eos_id                                  # the policy's
    p_ids, p_mask = (t.to(dev) for t in left_pad(prompts, pad))            # (B, Tp)
    B, Tp = p_ids.shape
    if isinstance(generator, (list, tuple)) and len(generator) != B:
        raise ValueError(f"{len(generator)} generators for {B} prompts: give one per prompt")
    if Tp + max_new_tokens > model.cfg.block_size:
        raise ValueError(f"prompt length {Tp} + max_new_tokens {max_new_tokens} exceeds "
                         f"the model's block_size {model.cfg.block_size} (its longest "
                         f"context); shorten the prompt or max_new_tokens")
    was_training = model.training
    model.eval()
    p_pos = positions(p_mask)                                              # (B, Tp)
    c = shared_prefix(prompts) if share_prefix and use_cache else 0
    if c:                                             # the common prefix once, then the rest
        logits, cache, d_ids, d_mask = prefill_shared(model, prompts, c, pad, dev)
    else:
        logits, cache = model(p_ids, p_pos, p_mask, logits_to_keep=1)      # prompt once
        d_ids, d_mask = p_ids, p_mask                                      # the decode's layout
    N = B * G
    ids = d_ids.repeat_interleave(G, 0)                                    # (N, Tp)
    key_mask = d_mask.repeat_interleave(G, 0)                              # (N, Tp)
    next_pos = p_pos[:, -1].repeat_interleave(G, 0) + 1                    # (N,)
    start = getattr(model, "start_decode", None)  # a policy's own decode cache (hf.py), or
    cache = (start(cache, G, max_new_tokens) if start is not None
             else model.repeat_cache(cache, G))                            # (N, ...) per layer
    last = logits[:, -1].repeat_interleave(G, 0)                           # (N, V)
    done = torch.zeros(N, dtype=torch.bool, device=dev)
    rows = torch.arange(N, device=dev)          # rows in the decode batch (n,): all, or the live
    toks, lps, masks = [], [], []
    tick("time/prefill_s")
    for _ in range(max_new_tokens):
        logp = F.log_softmax(scaled_logits(last, temperature), dim=-1)     # (n, V)
        if greedy:
            tok_n = logp.argmax(-1)                                        # (n,)
        else:
            nucleus = logp if top_p == 1 else top_p_filter(top_k_filter(logp, top_k), top_p)
            tok_n = DRAWS[draw](nucleus, top_k, G, generator, rows, N)     # (n,) ~ softmax
        live = ~done                                                       # (N,)
        tok = torch.full((N,), pad, dtype=torch.long, device=dev)
        lp = torch.zeros(N, device=dev)
        tok[rows] = tok_n
        lp[rows] = logp.gather(1, tok_n[:, None]).squeeze(1)
        tok = torch.where(live, tok, torch.full_like(tok, pad))            # (N,)
        toks.append(tok)
        lps.append(torch.where(live, lp, 0.0))
        masks.append(live)
        done = done | (tok == eos)
        tick("time/decode_sample_s")
        if bool(done.all()):
            break
        if drop_finished and bool(done[rows].any()):
            keep = (~done[rows]).nonzero().squeeze(1)                      # (n',) into rows
            rows, ids, key_mask, next_pos = rows[keep], ids[keep], key_mask[keep], next_pos[keep]
            cache = model.select_cache(cache, keep)
        ids = torch.cat([ids, tok[rows][:, None]], 1)                      # (n, T+1)
        key_mask = torch.cat([key_mask, live[rows][:, None]], 1)           # (n, T+1)
        tick("time/decode_cache_s")
        if use_cache:
            logits, cache = model(tok[rows][:, None], next_pos[:, None], key_mask, cache)
        else:
            logits, _ = model(ids, positions(key_mask), key_mask, logits_to_keep=1)
        last = logits[:, -1]                                               # (n, V)
        next_pos = next_pos + 1
        tick("time/decode_forward_s")
    if was_training:
        model.train()
    out = Rollout(
        prompt_ids=p_ids.repeat_interleave(G, 0).cpu(), prompt_mask=p_mask.repeat_interleave(G, 0).cpu(),
        completion_ids=torch.stack(toks, 1).cpu(), completion_mask=torch.stack(masks, 1).cpu(),
        logprobs=torch.stack(lps, 1).cpu(),
        prompt_index=torch.arange(B).repeat_interleave(G), stopped=done.cpu())
    tick("time/decode_cache_s")
    return out


class Ticker:
    """``tick(key)`` adds the seconds since the previous tick to ``clock[key]``."""

    def __init__(self, clock: dict):
        self.clock, self.t = clock, time.perf_counter()

    def __call__(self, key: str) -> None:
        t = time.perf_counter()
        self.clock[key] = self.clock.get(key, 0.0) + t - self.t
        self.t = t


CLOCK_KEYS = ("time/prefill_s", "time/decode_forward_s", "time/decode_sample_s",
              "time/decode_cache_s")


def exponential_noise(shape, G: int, generator) -> torch.Tensor:
    """Exp(1) noise (N, V) for the exponential race: from one generator, or row block
    [i*G, (i+1)*G) from the i-th generator of a list (one per prompt)."""
    if not isinstance(generator, (list, tuple)):
        return torch.empty(shape).exponential_(generator=generator)       # (N, V)
    return torch.cat([torch.empty(G, shape[1]).exponential_(generator=g) for g in generator])


def uniform_noise(N: int, G: int, generator) -> torch.Tensor:
    """U[0, 1) noise (N,) float64, one per row: from one generator, or rows [i*G, (i+1)*G)
    from the i-th generator of a list."""
    if not isinstance(generator, (list, tuple)):
        return torch.rand(N, dtype=torch.float64, generator=generator)    # (N,)
    return torch.cat([torch.rand(G, dtype=torch.float64, generator=g) for g in generator])


def top_k_filter(logp: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """-inf outside the top_k largest of each row (ties at the k-th kept)."""
    if top_k is None or top_k >= logp.shape[-1]:
        return logp
    kth = logp.topk(top_k, dim=-1).values[:, -1:]                          # (n, 1)
    return logp.masked_fill(logp < kth, float("-inf"))


def top_p_filter(logp: torch.Tensor, p: float) -> torch.Tensor:
    """Log-probs (n, V) -> the same with every token outside the nucleus set to -inf: the
    most likely tokens, in order, up to and including the one whose cumulative probability
    reaches p (at least one token is kept). Renormalising is left to the draw."""
    probs = logp.softmax(-1)                                               # (n, V), renormalised
    sorted_p, order = probs.sort(-1, descending=True)                      # (n, V)
    before = sorted_p.cumsum(-1) - sorted_p                                # (n, V) mass above
    drop_sorted = before >= p                                              # (n, V) first kept
    drop = drop_sorted.scatter(-1, order, drop_sorted)                     # (n, V) vocab order
    return logp.masked_fill(drop, float("-inf"))


def race_draw(logp, top_k, G, generator, rows, N) -> torch.Tensor:
    """The exponential race over the (top-k filtered) log-probs (n, V) -> tokens (n,)."""
    filt = top_k_filter(logp, top_k)
    E = exponential_noise((N, logp.shape[1]), G, generator).to(logp.device)  # (N, V)
    E = E[rows].clamp_min(1e-30)                                           # (n, V) > 0
    return (filt - E.log()).argmax(-1)                                     # (n,)


def inverse_cdf_draw(logp, top_k, G, generator, rows, N) -> torch.Tensor:
    """One uniform per row against the cumulative probabilities (n, V) -> tokens (n,).

    The first v with cdf_v > u * cdf_V: a token of probability 0 is never picked (its cdf
    equals the one before). With top_k only the k largest are sorted and summed."""
    u = uniform_noise(N, G, generator).to(logp.device)[rows]              # (n,) float64
    idx = None
    if top_k is not None and top_k < logp.shape[-1]:
        logp, idx = logp.topk(top_k, dim=-1)                               # (n, k) each
    cdf = logp.exp().cumsum(-1, dtype=torch.float64)                       # (n, V|k)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)  # (n, 1)
    pick = pick.clamp_max(cdf.shape[1] - 1)
    return (pick if idx is None else idx.gather(1, pick)).squeeze(1)       # (n,)


DRAWS = {"race": race_draw, "inverse_cdf": inverse_cdf_draw}


def full_sequence(r: Rollout, dev) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """prompt + completion on ``dev`` -> ids, positions, key mask, each (N, Tp+Tc)."""
    ids = torch.cat([r.prompt_ids, r.completion_ids], 1).to(dev)           # (N, Tp+Tc)
    mask = torch.cat([r.prompt_mask, r.completion_mask], 1).to(dev)        # (N, Tp+Tc)
    return ids, positions(mask), mask


def scaled_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 logits / temperature; at temperature 1 the logits themselves (no copy: x / 1 == x)."""
    x = logits.float()
    return x if temperature == 1.0 else x / temperature


def _token_stats(logits, ids, temperature: float, with_entropy: bool, keep_probs: bool):
    """-> (log-prob of ``ids`` (...), entropy (...) or None, probabilities (..., V) or None):
    one log-softmax over the V-wide logits, the probabilities only when the entropy or a
    backward needs them, the entropy -sum p log p as one dot product (no (..., V) product)."""
    logp = F.log_softmax(scaled_logits(logits, temperature), -1)           # (..., V)
    tok = logp.gather(-1, ids[..., None]).squeeze(-1)                      # (...)
    probs = logp.exp() if with_entropy or keep_probs else None             # (..., V)
    entropy = None
    if with_entropy:
        entropy = -(probs[..., None, :] @ logp[..., :, None])[..., 0, 0]   # (...)
    return tok, entropy, probs


class _ChosenLogprob(torch.autograd.Function):
    """log softmax(x / T) at the chosen tokens with its gradient, (onehot - softmax) g / T,
    written out: backward is one pass over the probabilities kept from forward, where
    autograd's log_softmax -> gather makes two (gather's zeros, log_softmax's backward)."""

    @staticmethod
    def forward(ctx, logits, ids, temperature: float, with_entropy: bool):
        tok, entropy, probs = _token_stats(logits, ids, temperature, with_entropy, True)
        ctx.save_for_backward(probs, ids)
        ctx.temperature, ctx.dtype = temperature, logits.dtype
        if entropy is not None:
            ctx.mark_non_differentiable(entropy)
        return tok, entropy

    @staticmethod
    def backward(ctx, g, _):
        probs, ids = ctx.saved_tensors                                     # (..., V), (...)
        g = g / ctx.temperature                                            # (...)
        grad = probs * -g[..., None]                                       # (..., V)
        grad.scatter_add_(-1, ids[..., None], g[..., None])               # + g at the token
        return grad.to(ctx.dtype), None, None, None


def chosen_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0,
                    with_entropy: bool = True):
    """Logits (..., V), chosen ids (...) -> (log softmax(logits / T) at the ids (...), with
    its gradient; the entropy of softmax(logits / T) (...) without a graph, or None). The same
    numbers as ``log_softmax(x / T).gather(ids)`` and ``-(p * log p).sum(-1)``, in fewer passes
    over the V-wide logits (tests/test_speed_levers.py)."""
    if torch.is_grad_enabled() and logits.requires_grad:
        return _ChosenLogprob.apply(logits, ids, temperature, with_entropy)
    with torch.no_grad():
        return _token_stats(logits, ids, temperature, with_entropy, False)[:2]


def completion_token_stats(logits: torch.Tensor, r: Rollout, temperature: float = 1.0,
                           entropy_grad: bool = False, with_entropy: bool = True):
    """Logits predicting each completion token (N, Tc, V) -> (log-prob of each completion
    token (N, Tc), the policy's entropy at each (N, Tc), or None without ``with_entropy``),
    0 on padding. The entropy is computed outside the autograd graph (it is logged, by
    ``chosen_logprobs``) unless ``entropy_grad`` (an entropy bonus in the loss: autograd's
    path, log_softmax -> gather and -(p * log p).sum with their graphs)."""
    c_ids = r.completion_ids.to(logits.device)
    c_mask = r.completion_mask.to(logits.device)
    if entropy_grad and torch.is_grad_enabled():
        logp = F.log_softmax(scaled_logits(logits, temperature), -1)       # (N, Tc, V)
        tok_logp = logp.gather(2, c_ids[..., None]).squeeze(2)             # (N, Tc)
        entropy = -(logp.exp() * logp).sum(-1)                             # (N, Tc)
    else:
        tok_logp, entropy = chosen_logprobs(logits, c_ids, temperature, with_entropy)
    if entropy is not None:
        entropy = entropy.masked_fill(~c_mask, 0.0)                        # (N, Tc)
    return tok_logp.masked_fill(~c_mask, 0.0), entropy


# ---- the update's forward: logits that predict the completion tokens, (N, Tc, V), three ways

def all_positions_logits(model, r: Rollout) -> torch.Tensor:
    """One forward over prompt + completion, logits at every position, the completion's kept."""
    Tp = r.prompt_ids.shape[1]
    logits, _ = model(*full_sequence(r, next(model.parameters()).device))  # (N, Tp+Tc, V)
    return logits[:, Tp - 1:-1]                                            # (N, Tc, V)


def completion_logits(model, r: Rollout) -> torch.Tensor:
    """One forward over prompt + completion, the head run on the Tc positions that predict
    a completion token only (TRL's ``logits_to_keep``): the same numbers, less head work."""
    Tc = r.completion_ids.shape[1]
    logits, _ = model(*full_sequence(r, next(model.parameters()).device),
                      logits_to_keep=Tc + 1)                               # (N, Tc+1, V)
    return logits[:, :-1]                                                  # (N, Tc, V)


def shared_prompt_rows(r: Rollout) -> int:
    """G if the rows are B blocks of G completions of one prompt each (rows i*G..i*G+G-1 of
    prompt i, the sampler's layout), else 0."""
    N = len(r.prompt_index)
    G = r.group_size if N else 0
    ok = G > 0 and N % G == 0 and torch.equal(r.prompt_index,
                                              torch.arange(N // G).repeat_interleave(G))
    return G if ok else 0


def prompt_once_logits(model, r: Rollout) -> torch.Tensor:
    """The prompt run once per group (B rows), its KV cache repeated G times, then the
    completions against it (N rows): the sampler's sharing, in the differentiable forward.
    The gradient through the prompt's keys and values is the sum over its G completions
    (``repeat_interleave``'s backward), as in the full forward. Logits at the prompt's last
    position and the completion's positions only. Falls back to ``completion_logits`` when
    the rows are not G-blocks or the policy checkpoints activations (no cache in a
    checkpointed forward), or the policy is wrapped (DistributedDataParallel, torch's DDP
    hook exchanges: no repeat_cache, and one forward per backward)."""
    G = shared_prompt_rows(r)
    if not G or getattr(model, "checkpointing", False) or not hasattr(model, "repeat_cache"):
        return completion_logits(model, r)
    dev = next(model.parameters()).device
    p_ids, p_mask = r.prompt_ids[::G].to(dev), r.prompt_mask[::G].to(dev)  # (B, Tp)
    p_pos = positions(p_mask)                                              # (B, Tp)
    first, cache = model(p_ids, p_pos, p_mask, logits_to_keep=1, use_cache=True)  # (B, 1, V)
    first = first.repeat_interleave(G, 0)                                  # (N, 1, V)
    Tc = r.completion_ids.shape[1]
    if Tc == 1:
        return first
    cache = model.repeat_cache(cache, G)                                   # (N, ...) per layer
    c_ids = r.completion_ids[:, :-1].to(dev)                               # (N, Tc-1)
    c_pos = p_pos[:, -1:].repeat_interleave(G, 0) + 1 + torch.arange(Tc - 1, device=dev)  # (N, Tc-1)
    key_mask = torch.cat([r.prompt_mask, r.completion_mask[:, :-1]], 1).to(dev)  # (N, Tp+Tc-1)
    rest, _ = model(c_ids, c_pos, key_mask, cache)                         # (N, Tc-1, V)
    return torch.cat([first, rest], 1)                                     # (N, Tc, V)


def packed_logits(model, r: Rollout) -> torch.Tensor:
    """Each prompt once with its G completions after it in one row, (B, Tp + G (Tc-1)), and an
    attention mask that lets completion g see the prompt and its own earlier tokens only: the
    prompt's work done once as in ``prompt_once``, but in one forward, so each weight meets one
    matrix of all the step's tokens. ``prompt_once``'s two passes (prompt, then completions
    against its cache) give every weight two gradient GEMMs that autograd then adds, the
    embedding two dense gradients, the head a second GEMM for one position; and it needs no KV
    cache (so it also runs under activation checkpointing or DDP). Positions as the sampler's.
    Logits at the prompt's last position (shared by its G completions) and the completions'.
    Falls back to ``completion_logits`` when the rows are not G-blocks of one prompt."""
    G = shared_prompt_rows(r)
    if not G:
        return completion_logits(model, r)
    dev = next(model.parameters()).device
    p_ids, p_mask = r.prompt_ids[::G].to(dev), r.prompt_mask[::G].to(dev)  # (B, Tp)
    (B, Tp), Tc = p_ids.shape, r.completion_ids.shape[1]
    n_c = G * (Tc - 1)                                   # completion inputs per row: G segments
    p_pos = positions(p_mask)                                              # (B, Tp)
    c_pos = p_pos[:, -1:] + 1 + torch.arange(Tc - 1, device=dev).repeat(G)  # (B, n_c)
    ids = torch.cat([p_ids, r.completion_ids[:, :-1].to(dev).reshape(B, n_c)], 1)  # (B, L)
    real = torch.cat([p_mask, r.completion_mask[:, :-1].to(dev).reshape(B, n_c)], 1)  # (B, L)
    seg = torch.cat([torch.full((Tp,), -1, device=dev),                    # (L,) -1: prompt,
                     torch.arange(G, device=dev).repeat_interleave(Tc - 1)])  # g: completion g
    i = torch.arange(Tp + n_c, device=dev)
    causal = (seg[:, None] == seg[None, :]) & (i[None, :] <= i[:, None])   # (L, L) own segment
    prompt = (seg[None, :] == -1) & (seg[:, None] >= 0)                    # (L, L) -> the prompt
    see = (causal | prompt)[None] & real[:, None, :] | (i[:, None] == i[None, :])  # (B, L, L)
    logits, _ = model(ids, torch.cat([p_pos, c_pos], 1), see,
                      logits_to_keep=n_c + 1)                              # (B, 1 + n_c, V)
    V = logits.shape[-1]
    first = logits[:, :1, None].expand(B, G, 1, V)                         # (B, G, 1, V)
    rest = logits[:, 1:].reshape(B, G, Tc - 1, V)                          # (B, G, Tc-1, V)
    return torch.cat([first, rest], 2).reshape(B * G, Tc, V)               # (N, Tc, V)


UPDATE_FORWARDS = {"all_positions": all_positions_logits, "completion": completion_logits,
                   "prompt_once": prompt_once_logits, "packed": packed_logits}


def completion_logprobs(model, r: Rollout, temperature: float = 1.0,
                        return_entropy: bool = False, forward: str = "prompt_once",
                        entropy_grad: bool = False):
    """Per-token log-probs (N, Tc) of the completion under ``model``, by the update forward
    ``forward`` (``UPDATE_FORWARDS``: equal up to float rounding).

    With ``return_entropy`` also returns the per-token entropy (N, Tc) of the policy
    (``completion_token_stats``; ``entropy_grad``: with its autograd graph).
    """
    logits = lookup(UPDATE_FORWARDS, forward, "update forward")(model, r)  # (N, Tc, V)
    tok_logp, entropy = completion_token_stats(logits, r, temperature, entropy_grad,
                                               with_entropy=return_entropy)
    return (tok_logp, entropy) if return_entropy else tok_logp
