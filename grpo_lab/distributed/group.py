"""The few collectives the training loop needs, the same on 1 and N processes.

``Group.current()`` is the default process group when one is initialised (``torchrun`` or
``launch.spawn``), else a group of one whose collectives are the identity, so the trainer
reads the same on a laptop and under ``torchrun``:

    gather(obj)      every rank's small Python object, in rank order   (all_gather_object)
    sum_(tensor)     element-wise sum over ranks, in place             (all_reduce)
    agree(flag)      True if any rank says True (stop, out of time)   (all_reduce MAX)
    barrier()

Only metadata travels here (rewards, counts, flags: a few hundred bytes per step); gradients
travel through ``exchanges.py``. ``gather`` pickles, so it stays off the hot path of tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Group:
    rank: int = 0
    world: int = 1

    @staticmethod
    def current() -> "Group":
        if dist.is_available() and dist.is_initialized():
            return Group(dist.get_rank(), dist.get_world_size())
        return Group()

    @property
    def device(self) -> torch.device:
        """Where collective tensors (and the trainer's policy) live: the rank's GPU under
        NCCL, also for a group of one (``torchrun --nproc_per_node=1``: one GPU), else the CPU."""
        if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def gather(self, obj) -> list:
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            buf = t.to(self.device)
            dist.all_reduce(buf)
            t.copy_(buf)
        return t

    def agree(self, flag: bool) -> bool:
        if self.world == 1:
            return bool(flag)
        t = torch.tensor([int(bool(flag))], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def slice(self, n: int) -> range:
        """This rank's contiguous share of n items: sizes differ by at most one, rank order."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (self.rank < extra))
