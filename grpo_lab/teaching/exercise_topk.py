"""The compression exercise: ``check_topk_error_feedback(fn)``, your top-k with error
feedback (Seide et al. 2014; Stich et al. 2018) against ``distributed.compression.sparsify``:
the k largest |residual + grad| are sent, the rest stays in the residual; then 10 chained
steps check that nothing is lost (sent + residual == the sum of the gradients)."""
from __future__ import annotations

from typing import Callable

import torch

from grpo_lab.distributed.compression import sparsify
from grpo_lab.teaching.exercise_harness import Failure, as_tensor, call, close, fmt, report, require_function


def _unpack_topk(out, n: int, k: int):
    """-> (indices sorted (k,), values in that order (k,), residual (n,)) or a hint."""
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        return "return three things: (indices, values, new_residual)"
    idx, val, res = (as_tensor(x) for x in out)
    if idx is None or val is None or res is None:
        return "indices, values and new_residual must be tensors (or arrays)"
    if idx.shape != (k,) or val.shape != (k,):
        return f"send exactly k = {k} entries: indices and values of shape ({k},), got " \
               f"{tuple(idx.shape)} and {tuple(val.shape)}"
    if res.shape != (n,):
        return f"the new residual has one entry per gradient element: shape ({n},), got " \
               f"{tuple(res.shape)}"
    order = idx.argsort()
    return idx[order].long(), val[order], res


def _topk_hint(grad, residual, k, idx, val, res) -> str:
    acc = residual + grad                                                  # (n,)
    by_mag = lambda x: set(torch.topk(x.abs(), k).indices.tolist())
    chosen = set(idx.tolist())
    if chosen == by_mag(grad) and chosen != by_mag(acc):
        return ("add the residual to the gradient before choosing the top-k (acc = residual + "
                "grad): that is the error feedback")
    if chosen == set(torch.topk(acc, k).indices.tolist()) and chosen != by_mag(acc):
        return "choose the k largest |acc| (magnitude): a large negative entry matters as much"
    if chosen != by_mag(acc):
        return "send the positions of the k largest |residual + grad|"
    if close(val, grad[idx]) and not close(val, acc[idx]):
        return "send acc[idx] = residual + grad at the chosen positions, not the gradient alone"
    if not close(val, acc[idx]):
        return "the values sent are acc[idx], acc = residual + grad"
    if close(res, acc):
        return ("zero the residual where you sent: those entries are delivered (else they are "
                "sent again next step)")
    dropped_old = grad.clone()
    dropped_old[idx] = 0
    if close(res, dropped_old):
        return ("the new residual is the whole accumulator (old residual + grad) with the sent "
                "entries zeroed: you dropped the old residual")
    if close(res, torch.zeros_like(res)):
        return "keep what you did not send in the new residual: error feedback sends it later"
    return "new_residual = acc with acc[idx] set to 0"


def check_topk_error_feedback(fn: Callable) -> bool:
    """Your ``fn(grad (n,), residual (n,), k) -> (indices, values, new_residual)`` against
    ``compression.sparsify``; then 10 chained steps: sent + residual == sum of gradients."""
    require_function("check_topk_error_feedback", fn)
    t = lambda *v: torch.tensor(v, dtype=torch.float32)
    cases = [("'no residual yet; a big negative entry'", t(0.1, -3, 0.5, 2, -0.2), torch.zeros(5), 2),
             ("'the residual tips the choice'", t(1, 0.9, 0.1, 0), t(0, 0, 1.5, 0), 1),
             ("'residual and gradient cancel'", t(0.5, -2, 1, 0.3, 0), t(0.1, 2, 0, -0.1, 0.7), 2)]
    gen = torch.Generator().manual_seed(0)
    for i in range(3):
        n = 20 + 10 * i
        cases.append((f"random #{i + 1} (n={n})", torch.randn(n, generator=gen),
                      torch.randn(n, generator=gen) * 0.5, 3 + i))
    failure = None
    for name, grad, residual, k in cases:
        e_idx, e_val, e_res, _ = sparsify(grad, residual, None, k)
        out, err = call(fn, grad.clone(), residual.clone(), k)
        parts = err or _unpack_topk(out, len(grad), k)
        if isinstance(parts, str):
            hint, got = parts, "an error" if err else fmt(out)
        else:
            idx, val, res = parts
            if idx.tolist() == e_idx.tolist() and close(val, e_val) and close(res, e_res):
                continue
            hint = _topk_hint(grad.double(), residual.double(), k, idx, val, res)
            got = f"indices {fmt(idx)}, values {fmt(val)}, residual {fmt(res)}"
        failure = Failure(f"{name}: grad {fmt(grad)}, residual {fmt(residual)}, k={k}",
                          f"indices {fmt(e_idx)}, values {fmt(e_val)}, residual {fmt(e_res)}",
                          got, hint)
        break
    if failure is None:                                   # every gradient entry is sent eventually
        n, k, steps = 40, 4, 10
        residual, sent, total = torch.zeros(n), torch.zeros(n, dtype=torch.float64), \
            torch.zeros(n, dtype=torch.float64)
        for _ in range(steps):
            grad = torch.randn(n, generator=gen)
            total += grad.double()
            idx, val, residual = _unpack_topk(fn(grad, residual, k), n, k)
            sent[idx] += val
            residual = residual.float()
        if not close(sent + residual.double(), total):
            failure = Failure(f"'{steps} chained steps' (n={n}, k={k})", "sent + residual == sum "
                              "of the gradients", f"off by {float((sent + residual - total).abs().max()):.3g}",
                              "nothing may be lost: whatever is not sent stays in the residual")
    return report("check_topk_error_feedback", failure, len(cases) + 1,
                   "grpo_lab.distributed.compression.sparsify")
