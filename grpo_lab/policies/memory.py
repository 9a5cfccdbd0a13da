"""Memory, measured: what a forward + backward actually allocates, and what it keeps.

Two measures, both counted tensor by tensor (deterministic, so tests can compare them):

  ``saved_bytes(fn)``   bytes of the distinct tensor storages autograd saves for backward
                        while ``fn`` runs (``torch.autograd.graph.saved_tensors_hooks``),
                        parameters left out: the activations a graph holds between its forward
                        and its backward. Activation checkpointing shrinks it: a checkpointed
                        block saves only its input (torch saves it through the same hook).
  ``PeakMemory``        a dispatch mode that sees every tensor an operator creates (forward and
                        backward) and a weak reference that sees each storage freed: ``peak``
                        is the most bytes alive at once above what was alive before, ``now`` what
                        is left (the gradients, typically). This includes what ``saved_bytes``
                        cannot: temporaries, the recomputation inside a checkpointed backward,
                        the gradients.

Byte arithmetic for one toy GPT block (width C, float32, 4 B a float): per token autograd
keeps what each LayerNorm, Linear, attention and GELU needs in backward: ln1 in, qkv in, q k v
(3C), attention out, ln2 in, fc in, fc out (4C), GELU out (4C): about 16 C floats, plus the
attention weights (nh x T floats). Measured at C = 80, T = 24 (tests/test_memory.py): about
4,830 B a token in all, 15 C. A checkpointed block keeps its input only, C floats (1/15 of that), and
recomputes the rest in backward: one more forward of the block, about a third of its
forward + backward.

Both count tensors, not the allocator: process memory (RSS) adds the allocator's caching,
Python and the libraries; ``rss_bytes`` reads it (Linux) for the benchmark's fresh processes.
"""
from __future__ import annotations

import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary


def saved_bytes(fn, params=()) -> int:
    """Run ``fn()`` -> bytes of the distinct storages saved for backward meanwhile (the
    storages of ``params`` excluded: they are held anyway)."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


class PeakMemory(TorchDispatchMode):
    """``with PeakMemory() as m: ...`` -> ``m.peak``: most bytes of tensor storage alive at
    once among those created inside the block; ``m.now``: those still alive."""

    def __init__(self):
        super().__init__()
        self.now = self.peak = 0
        self._live = WeakIdKeyDictionary()          # storage -> its bytes (counted once)

    def _freed(self, nbytes: int) -> None:
        self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {st.data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) for st in storages(t)}
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                for st in storages(t):
                    if st.data_ptr() in inputs or st in self._live:  # a view, in place, seen
                        continue
                    n = st.nbytes()
                    if n:
                        self._live[st] = n
                        self.now += n
                        weakref.finalize(st, self._freed, n)
        self.peak = max(self.peak, self.now)
        return out


def storages(t: torch.Tensor) -> list:
    """The storages holding ``t``'s bytes: its own, or for a wrapper subclass (FSDP2's
    DTensor) its inner tensors' (this rank's shard)."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        inner = [getattr(t, n) for n in names]
        return [st for i in inner if isinstance(i, torch.Tensor) for st in storages(i)]
    return [t.untyped_storage()]


def peak_bytes(fn) -> tuple[int, int]:
    """Run ``fn()`` under ``PeakMemory`` -> (peak bytes, bytes still alive at the end)."""
    with PeakMemory() as m:
        fn()
    return m.peak, m.now


def rss_bytes(peak: bool = False) -> int:
    """This process's resident set size now (VmRSS), or its peak since the start or the last
    ``reset_peak_rss`` (VmHWM), from Linux's /proc/self/status."""
    key = "VmHWM:" if peak else "VmRSS:"
    line = next(x for x in Path("/proc/self/status").read_text().splitlines()
                if x.startswith(key))
    return int(line.split()[1]) * 1024                                    # kB -> bytes


def reset_peak_rss() -> None:
    """Set the peak RSS to the current RSS (Linux: write 5 to /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages among ``tensors`` (tied weights counted once)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors}.values())
