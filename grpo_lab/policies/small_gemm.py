"""y = x W^T for a few rows of x: the decode step's GEMM at 8 rows, numba-compiled.

A decode step multiplies every weight of the model by one token per row: at 8 rows
(B=2 prompts x G=4) each weight element is used 8 times, so the work is a stream over the
weights. MKL's sgemm at M=8 runs SmolLM2's 211 linear layers (body 106 M weights + head
28 M) in 84 ms on one core of this machine, 6.4 GB/s of weights: it packs and blocks for
large M. ``linear_rows8`` streams each weight row once and updates 8 accumulators (one per
row of x) from it, so one load of W feeds 8 fused multiply-adds: 52 ms for the same layers
(10.3 GB/s; bench/bench_hf_speed.py decode). At 16 rows it ties with MKL and at 32 MKL
is faster (its register blocking re-uses x too), so ``decoder.py`` uses this only for up to
8 rows (fewer rows are padded with zeros to 8) and only at one torch thread.

The sums run in another order than MKL's (fastmath "reassoc" lets the compiler split each
dot product into vector lanes), so the result equals ``F.linear`` within float32 rounding of
K products, not bit for bit; NaN and infinity propagate as in any sum (no "nnan"/"ninf").
``AVAILABLE`` is False without numba (the ``fast`` extra, pyproject.toml): then nothing here is
called.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

try:
    from numba import njit
    AVAILABLE = True
except ImportError:                                     # decoder.py falls back to F.linear
    AVAILABLE = False

    def njit(*args, **kwargs):
        return (lambda f: f) if not args or not callable(args[0]) else args[0]

ROWS = 8
"""Rows of x per call: x is padded to this many."""
FLAGS = {"reassoc", "contract", "nsz"}
"""fastmath flags: reorder sums (vector lanes) and fuse multiply-adds; NaN/inf kept."""


@njit(fastmath=FLAGS, cache=True, nogil=True)
def _rows8(x, w, out):
    """out (8, N) = x (8, K) @ w (N, K)^T, float32, C-contiguous."""
    K = x.shape[1]
    x0, x1, x2, x3 = x[0], x[1], x[2], x[3]
    x4, x5, x6, x7 = x[4], x[5], x[6], x[7]
    for j in range(w.shape[0]):
        wj = w[j]
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
        for k in range(K):
            v = wj[k]
            a0 += x0[k] * v
            a1 += x1[k] * v
            a2 += x2[k] * v
            a3 += x3[k] * v
            a4 += x4[k] * v
            a5 += x5[k] * v
            a6 += x6[k] * v
            a7 += x7[k] * v
        out[0, j] = a0
        out[1, j] = a1
        out[2, j] = a2
        out[3, j] = a3
        out[4, j] = a4
        out[5, j] = a5
        out[6, j] = a6
        out[7, j] = a7


def applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    """``linear_rows8`` computes x W^T here: numba present, one torch thread, CPU float32,
    at most ROWS rows, W contiguous (N, K) and K the width of x."""
    return (AVAILABLE and x.dim() == 2 and x.shape[0] <= ROWS and x.device.type == "cpu"
            and x.dtype == torch.float32 and w.dtype == torch.float32 and w.is_contiguous()
            and w.dim() == 2 and w.shape[1] == x.shape[1] and torch.get_num_threads() == 1
            and not torch.is_grad_enabled())


def linear_rows8(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (n, K) with n <= 8, w (N, K) -> x w^T (n, N); the caller checked ``applies``."""
    n, K = x.shape
    if n == ROWS and x.is_contiguous():
        xp = x                                                              # (8, K)
    else:
        xp = torch.zeros(ROWS, K, dtype=torch.float32)                      # (8, K)
        xp[:n] = x
    out = torch.empty(ROWS, w.shape[0], dtype=torch.float32)                # (8, N)
    _rows8(xp.numpy(), _borrowed(w), out.numpy())
    return out[:n]


def _borrowed(w: torch.Tensor) -> np.ndarray:
    """w's memory (contiguous float32 on the CPU) as a numpy array, through its address:
    ``Tensor.numpy()`` would mark w's storage as never resizable, and FSDP2 frees weights it
    gathered by resizing their storage to 0 (distributed/fsdp.py). w outlives the call."""
    ptr = ctypes.cast(w.data_ptr(), ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(ptr, shape=tuple(w.shape))
