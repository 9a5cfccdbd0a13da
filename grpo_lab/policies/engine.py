"""The sampling engine of a policy kind: everything that makes sampling and the update's
forward fast for one kind of model, behind one interface (``Engine``) that declares every hook
the generic code calls (rollout.sample, rollout.completion_logprobs, the objectives,
evaluation, the trainer). model.GPT and hf.HFPolicy are Engines; the algorithm layer
(algorithm/rollout.py: G completions per prompt, per-prompt generators, log-probs) calls these
hooks and never asks a model what it has.

    encode(text) -> ids, decode(ids) -> text, unknown_chars(text)   the tokenizer
    pad_id, eos_id, cfg.block_size
    forward(idx (B, T), pos (B, T), key_mask (B, Tk) or (B, T, Tk), cache,
            logits_to_keep=k, use_cache=b) -> (logits (B, T|k, V), cache)
    repeat_cache(cache, G), select_cache(cache, rows)   a prompt's cache for its G rows; the
                                                          decode's live rows
    start_decode(cache, G, max_new_tokens)             the decode's cache (default: repeated;
                                                          hf: a static cache for the lean decoder)
    checkpointing                                      the training forward keeps no KV cache
    reference()                                        the frozen reference (LoRA: adapters off)

and the speed machinery written once against those hooks: the sampler's decode batch
(``Decode``: a chat template's system turn run once per batch, ``prefill_shared``; finished
rows dropped; ``Recompute``: no cache), the update forwards
(``UPDATE_FORWARDS``: prompt once per group, packed, ...) and the chosen-token log-prob with
its hand-written backward (``chosen_logprobs``). A module that is not an Engine (torch's DDP
wrapper, a test double) still runs the update forwards that need no cache.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from grpo_lab.tokenizer import PAD   # batch padding under a False mask (any valid id)


class Engine(nn.Module):
    """The interface of a policy kind (the module docstring lists the hooks); subclasses
    implement the tokenizer, forward and the cache hooks, and may override the defaults."""
    pad_id: int
    eos_id: int
    cfg: Any                      # .block_size: int, the longest sequence; vars() is JSON

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def unknown_chars(self, text: str) -> list[str]:
        raise NotImplementedError

    def repeat_cache(self, cache, G: int):
        raise NotImplementedError

    def select_cache(self, cache, rows: torch.Tensor):
        raise NotImplementedError

    def start_decode(self, cache, G: int, max_new_tokens: int):
        """The prompts' cache (B rows) -> the decode's (B*G rows): by default repeated."""
        return self.repeat_cache(cache, G)

    @property
    def checkpointing(self) -> bool:
        """The training forward recomputes activations (and keeps no KV cache)."""
        return False

    def reference(self) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} keeps no reference of its own: the "
                                  f"trainer loads a frozen copy (trainer.setup)")


def left_pad(prompts: list[list[int]], pad: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> ids (B, Tp) left-padded with ``pad``, mask (B, Tp) bool; the mask from
    the lengths, not ``ids != pad``: an HF tokenizer's pad may be its <eos>, which a
    demonstration ends with."""
    if not prompts:
        raise ValueError("no prompts to sample from (empty prompt list)")
    if not all(prompts):
        raise ValueError(f"prompt {[len(p) for p in prompts].index(0)} is empty")
    Tp = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (Tp - len(p)) + list(p) for p in prompts], dtype=torch.long)
    return ids, torch.tensor([[False] * (Tp - len(p)) + [True] * len(p) for p in prompts])


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids (B, T) counting real tokens only; padding gets 0."""
    return (mask.long().cumsum(1) - 1).clamp(min=0)


SHARED_PREFIX_MIN = 16
"""The fewest tokens every prompt of a batch must start with before ``Decode`` prefills them
once (a chat template's system turn: SmolLM2's is 24 tokens). The toy's prompts never share
that many, so its runs never take this path."""


def shared_prefix(prompts: list[list[int]], minimum: int = SHARED_PREFIX_MIN) -> int:
    """The number of leading tokens all ``prompts`` have in common, each keeping at least one
    token after them; 0 when that is fewer than ``minimum`` or there is one prompt."""
    if len(prompts) < 2:
        return 0
    c, most = 0, min(len(p) for p in prompts) - 1
    while c < most and all(p[c] == prompts[0][c] for p in prompts):
        c += 1
    return c if c >= minimum else 0


def prefill_shared(model, prompts: list[list[int]], c: int, dev):
    """The prompts' first logits and cache with their common first ``c`` tokens run once:
    the prefix as one row, its cache repeated to the B rows, then the rest of each prompt,
    left-padded, against it. -> (logits (B, 1, V), cache, key mask (B, c + Ts)): the decode's
    layout is [prefix | padding | rest of the prompt], the positions are the prompts' own
    (padding is masked and takes no position), so the arithmetic is the left-padded prompt's,
    up to float rounding."""
    B = len(prompts)
    prefix = torch.tensor([prompts[0][:c]], dtype=torch.long, device=dev)  # (1, c)
    seen = torch.ones(1, c, dtype=torch.bool, device=dev)                  # (1, c)
    _, cache = model(prefix, positions(seen), seen, logits_to_keep=1)
    cache = model.repeat_cache(cache, B)                                   # (B, ...) c columns
    s_ids, s_mask = (t.to(dev) for t in left_pad([p[c:] for p in prompts], model.pad_id))  # (B, Ts)
    key_mask = torch.cat([seen.expand(B, c), s_mask], 1)                   # (B, c + Ts)
    logits, cache = model(s_ids, c + positions(s_mask), key_mask, cache, logits_to_keep=1)
    return logits, cache, key_mask


class Decode:
    """The decode batch of ``rollout.sample``, written once against the hooks: the B prompts
    (left-padded ids and mask (B, Tp)) run once, their cache made the decode's N = B*G rows
    (``start_decode``), then one token a row per ``forward``. ``last`` (n, V): the logits of
    each row's next token; ``rows`` (n,): the decode batch's rows among the N. Speed levers,
    the same tokens: ``share_prefix`` runs a prefix all prompts start with once for the batch
    (``prefill_shared``, from ``SHARED_PREFIX_MIN`` tokens: a chat template's system turn);
    ``drop_finished`` takes rows that emitted <eos> out, their cache rows too (``select_cache``)."""

    def __init__(self, model, p_ids, p_mask, prompts, G: int, max_new_tokens: int,
                 share_prefix: bool = True, drop_finished: bool = False):
        self.model, self.drop = model, drop_finished
        c = shared_prefix(prompts) if share_prefix else 0
        if c:                                          # the common prefix once, then the rest
            logits, cache, key_mask = prefill_shared(model, prompts, c, p_ids.device)
        else:                                          # each prompt whole
            logits, cache = model(p_ids, positions(p_mask), p_mask, logits_to_keep=1)
            key_mask = p_mask
        self.key_mask = key_mask.repeat_interleave(G, 0)                   # (N, Tk)
        self.next_pos = positions(p_mask)[:, -1].repeat_interleave(G, 0) + 1   # (N,)
        self.cache = model.start_decode(cache, G, max_new_tokens)         # (N, ...) per layer
        self.last = logits[:, -1].repeat_interleave(G, 0)                  # (N, V)
        self.rows = torch.arange(len(self.last), device=p_ids.device)     # (n,) all, or the live

    def advance(self, tok: torch.Tensor, live: torch.Tensor, done: torch.Tensor) -> None:
        """This step's tokens, live before it and done after it, each (N,): finished rows out
        (``drop_finished``), the key mask one column longer."""
        if self.drop and bool(done[self.rows].any()):
            keep = (~done[self.rows]).nonzero().squeeze(1)                 # (n',) into rows
            self.rows, self.key_mask = self.rows[keep], self.key_mask[keep]
            self.next_pos = self.next_pos[keep]
            self.cache = self.model.select_cache(self.cache, keep)
        self.tok = tok[self.rows]                                          # (n,)
        self.key_mask = torch.cat([self.key_mask, live[self.rows][:, None]], 1)  # (n, Tk+1)

    def forward(self) -> None:
        """The new tokens against the cache -> ``last`` (n, V)."""
        logits, self.cache = self.model(self.tok[:, None], self.next_pos[:, None],
                                        self.key_mask, self.cache)         # (n, 1, V)
        self.last, self.next_pos = logits[:, -1], self.next_pos + 1


class Recompute(Decode):
    """``Decode`` without a cache (``sample(use_cache=False)``, for benchmarks and equivalence
    tests): every step runs the whole sequence so far, all N rows. The same tokens."""

    def __init__(self, model, p_ids, p_mask, G: int, max_new_tokens: int):
        super().__init__(model, p_ids, p_mask, [], G, max_new_tokens, share_prefix=False)
        self.ids = p_ids.repeat_interleave(G, 0)                           # (N, Tp)

    def advance(self, tok, live, done) -> None:
        super().advance(tok, live, done)
        self.ids = torch.cat([self.ids, self.tok[:, None]], 1)            # (N, T+1)

    def forward(self) -> None:
        logits, _ = self.model(self.ids, positions(self.key_mask), self.key_mask,
                               logits_to_keep=1)                           # (N, 1, V)
        self.last = logits[:, -1]


def full_sequence(r, dev) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A rollout.Rollout's prompt + completion on ``dev`` -> ids, positions, key mask, each
    (N, Tp+Tc)."""
    ids = torch.cat([r.prompt_ids, r.completion_ids], 1).to(dev)           # (N, Tp+Tc)
    mask = torch.cat([r.prompt_mask, r.completion_mask], 1).to(dev)        # (N, Tp+Tc)
    return ids, positions(mask), mask


def scaled_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 logits / temperature; at temperature 1 the logits themselves (no copy: x / 1 == x)."""
    x = logits.float()
    return x if temperature == 1.0 else x / temperature


CHUNK_ELEMENTS = 1 << 22
"""Logits per slice of ``_ChosenLogprob``'s passes (85 rows of a 49,152-token vocabulary): a
slice's float32 copy, log-softmax and probabilities stay in the CPU's caches. Each row's
numbers are the whole tensor's, bit for bit (the passes run row by row); SmolLM2's bf16
logits of a step (1,024 x 49,152) took 228 ms forward + backward in slices of 64 rows against
370 ms whole (2 threads, an AMX Xeon; BENCHMARKS section 33)."""


class _ChosenLogprob(torch.autograd.Function):
    """log softmax(x / T) at the chosen tokens with its gradient, (onehot - softmax) g / T,
    written out, slice by slice of ``CHUNK_ELEMENTS`` logits: backward recomputes a slice's
    probabilities from the logits kept (not the float32 probabilities of the whole batch) and
    makes one pass over them, where autograd's log_softmax -> gather makes two (gather's
    zeros, log_softmax's backward). Position m reads logits row ``rows[m]``: rows may be
    shared (the packed forward's prompt row predicts the first token of its G completions),
    whose gradient is then the sum of theirs, formed in the slice's one pass."""

    @staticmethod
    def forward(ctx, x, rows, ids, temperature: float, with_entropy: bool, keep_logits: bool):
        order = torch.argsort(rows, stable=True)                           # (M,) by row
        chosen = torch.empty(ids.shape, dtype=torch.float32, device=x.device)    # (M,)
        row_entropy = torch.empty(x.shape[0], device=x.device) if with_entropy else None
        for (s, e), pos in _slices_and_positions(*x.shape, rows, order):  # x (R, V)
            logp = F.log_softmax(scaled_logits(x[s:e], temperature), -1)   # (r, V)
            chosen[pos] = logp[rows[pos] - s, ids[pos]]
            if with_entropy:                   # -sum p log p as one dot product, no graph
                row_entropy[s:e] = -(logp.exp()[:, None, :] @ logp[:, :, None])[:, 0, 0]
        ctx.save_for_backward(x if keep_logits else None, rows, ids, order)
        ctx.temperature = temperature
        entropy = row_entropy[rows] if with_entropy else None              # (M,)
        if with_entropy:
            ctx.mark_non_differentiable(entropy)
        return chosen, entropy

    @staticmethod
    def backward(ctx, g, _):
        x, rows, ids, order = ctx.saved_tensors                            # (R, V), (M,) x 3
        g = g / ctx.temperature                                            # (M,)
        per_row = torch.zeros(x.shape[0], device=x.device).index_add_(0, rows, g)   # (R,)
        grad = torch.empty_like(x)                                         # (R, V)
        for (s, e), pos in _slices_and_positions(*x.shape, rows, order):
            probs = F.log_softmax(scaled_logits(x[s:e], ctx.temperature), -1).exp_()  # (r, V)
            probs.mul_(-per_row[s:e, None])                                # - sum g p
            probs.index_put_((rows[pos] - s, ids[pos]), g[pos], accumulate=True)  # + g at a token
            grad[s:e] = probs                                              # in logits' dtype
        return grad, None, None, None, None, None


def _slices_and_positions(R: int, V: int, rows: torch.Tensor, order: torch.Tensor):
    """Each slice (start, end) of ``CHUNK_ELEMENTS`` logits (at least one row) of (R, V), with
    the positions (of ``rows``) that read it."""
    step = max(1, CHUNK_ELEMENTS // V)
    ends = torch.searchsorted(rows[order], torch.arange(step, R + step, step,
                                                        device=rows.device)).tolist()
    return (((s, s + step), order[a:b]) for s, a, b in zip(range(0, R, step), [0, *ends], ends))


def chosen_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0,
                    with_entropy: bool = True, rows: torch.Tensor | None = None):
    """Logits (..., V), chosen ids (...) -> (log softmax(logits / T) at the ids (...), with
    its gradient; the entropy of softmax(logits / T) (...) without a graph, or None). The same
    numbers as ``log_softmax(x / T).gather(ids)`` and ``-(p * log p).sum(-1)``, in fewer passes
    over the V-wide logits (tests/test_speed_levers.py); the logits are kept for a backward
    only. With ``rows`` (shaped as ``ids``), logits are (R, V) and position m's prediction is
    row ``rows[m]`` (the packed forward: no (..., V) copy of a shared row)."""
    x = logits.reshape(-1, logits.shape[-1])                               # (R, V)
    if rows is None:
        rows = torch.arange(ids.numel(), device=x.device)                  # (M,)
    elif rows.numel() and int(rows.max()) >= x.shape[0]:
        raise ValueError(f"rows reach row {int(rows.max())} of {x.shape[0]} logits rows")
    rows = rows.reshape(-1).to(x.device)                                   # (M,)
    backward = torch.is_grad_enabled() and logits.requires_grad
    chosen, entropy = _ChosenLogprob.apply(x, rows, ids.reshape(-1).to(x.device), temperature,
                                           with_entropy, backward)
    return chosen.view(ids.shape), None if entropy is None else entropy.view(ids.shape)


# ---- the update's forward: logits that predict the completion tokens, four ways: each
# returns (logits, rows): logits (N, Tc, V) and rows None, or logits (R, V) and rows (N, Tc),
# the row that predicts each completion token (chosen_logprobs' ``rows``)

Forward = tuple[torch.Tensor, torch.Tensor | None]
"""An update forward's (logits, rows), as above."""


def all_positions_logits(model, r) -> Forward:
    """One forward over prompt + completion, logits at every position, the completion's kept."""
    Tp = r.prompt_ids.shape[1]
    logits, _ = model(*full_sequence(r, next(model.parameters()).device))  # (N, Tp+Tc, V)
    return logits[:, Tp - 1:-1], None                                      # (N, Tc, V)


def completion_logits(model, r) -> Forward:
    """One forward over prompt + completion, the head run on the Tc positions that predict
    a completion token only (TRL's ``logits_to_keep``): the same numbers, less head work."""
    Tc = r.completion_ids.shape[1]
    logits, _ = model(*full_sequence(r, next(model.parameters()).device),
                      logits_to_keep=Tc + 1)                               # (N, Tc+1, V)
    return logits[:, :-1], None                                            # (N, Tc, V)


def shared_prompt_rows(r) -> int:
    """G if the rows are B blocks of G completions of one prompt each (rows i*G..i*G+G-1 of
    prompt i, the sampler's layout), else 0."""
    N, G = len(r.prompt_index), int((r.prompt_index == 0).sum())          # G: prompt 0's rows
    blocks = G and N % G == 0 and torch.equal(r.prompt_index,
                                              torch.arange(N // G).repeat_interleave(G))
    return G if blocks else 0


def prompt_once_logits(model, r) -> Forward:
    """The prompt run once per group (B rows), its KV cache repeated G times, then the
    completions against it (N rows): the sampler's sharing, in the differentiable forward.
    The gradient through the prompt's keys and values is the sum over its G completions
    (``repeat_interleave``'s backward), as in the full forward. Falls back to
    ``completion_logits`` when the rows are not G-blocks or the policy checkpoints activations
    (no cache in a checkpointed forward), or the module is not an Engine
    (DistributedDataParallel, torch's DDP hook exchanges: one forward per backward)."""
    G = shared_prompt_rows(r)
    if not G or not isinstance(model, Engine) or model.checkpointing:
        return completion_logits(model, r)
    dev = next(model.parameters()).device
    p_ids, p_mask = r.prompt_ids[::G].to(dev), r.prompt_mask[::G].to(dev)  # (B, Tp)
    p_pos = positions(p_mask)                                              # (B, Tp)
    first, cache = model(p_ids, p_pos, p_mask, logits_to_keep=1, use_cache=True)  # (B, 1, V)
    first = first.repeat_interleave(G, 0)                                  # (N, 1, V)
    Tc = r.completion_ids.shape[1]
    if Tc == 1:
        return first, None
    c_pos = p_pos[:, -1:].repeat_interleave(G, 0) + 1 + torch.arange(Tc - 1, device=dev)  # (N, Tc-1)
    key_mask = torch.cat([r.prompt_mask, r.completion_mask[:, :-1]], 1).to(dev)  # (N, Tp+Tc-1)
    rest, _ = model(r.completion_ids[:, :-1].to(dev), c_pos, key_mask,
                    model.repeat_cache(cache, G))                          # (N, Tc-1, V)
    return torch.cat([first, rest], 1), None                               # (N, Tc, V)


def packed_logits(model, r) -> Forward:
    """Each prompt once with its G completions after it in one row, (B, Tp + G (Tc-1)), and an
    attention mask that lets completion g see the prompt and its own earlier tokens only: the
    prompt's work done once as in ``prompt_once``, but in one forward, so each weight meets one
    matrix of all the step's tokens. ``prompt_once``'s two passes (prompt, then completions
    against its cache) give every weight two gradient GEMMs that autograd then adds, the
    embedding two dense gradients, the head a second GEMM for one position; and it needs no KV
    cache (so it also runs under activation checkpointing or DDP). Positions as the sampler's.
    Logits at the prompt's last position (shared by its G completions) and the completions',
    (B (1 + G (Tc-1)), V), with the row of each completion token: the shared row is not
    copied G times (nor its gradient summed from G copies). Falls back to
    ``completion_logits`` when the rows are not G-blocks of one prompt."""
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
    rest = 1 + torch.arange(n_c, device=dev).view(G, Tc - 1)               # (G, Tc-1)
    rows = torch.cat([torch.zeros(G, 1, dtype=torch.long, device=dev), rest], 1)  # (G, Tc)
    rows = (torch.arange(B, device=dev)[:, None, None] * (1 + n_c) + rows).reshape(B * G, Tc)
    return logits.reshape(-1, logits.shape[-1]), rows                      # (R, V), (N, Tc)


UPDATE_FORWARDS = {"all_positions": all_positions_logits, "completion": completion_logits,
                   "prompt_once": prompt_once_logits, "packed": packed_logits}
