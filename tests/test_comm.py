"""Compressed exchange over a real 2-process gloo group, and the DDP comm hook."""
import copy
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_lab.distributed import comm
from grpo_lab.distributed.compression import CompressionConfig, Compressor

WORLD = 2
EXACT = CompressionConfig(dense_fraction=0.3, density=0.1, topk="exact", index_codec="rice")


def local_grads(rank: int, step: int = 0) -> dict:
    g = torch.Generator().manual_seed(100 * rank + step)
    return {"w": torch.randn(40, 30, generator=g), "v": torch.randn(500, generator=g) * 0.01,
            "b": torch.randn(7, generator=g)}


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 + 10 * rank + step)
    return torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)


def check_exchange(rank: int):
    # lossless path (fp32) equals a plain all_reduce, bit for bit with two ranks
    grads = local_grads(rank)
    stats = comm.new_stats()
    out = comm.compressed_all_reduce(grads, Compressor("fp32"), stats=stats)
    for name, g in grads.items():
        ref = g.clone()
        dist.all_reduce(ref)
        assert torch.equal(out[name], ref / WORLD), name
    assert stats["comm/exchanges"] == 1 and stats["comm/sent_bytes"] >= stats["comm/payload_bytes"]

    # lossy path (fp8 + top-k + error feedback) over three steps equals decoding every rank's
    # message locally and averaging; each rank simulates both ranks' compressors
    live = Compressor(EXACT)
    sims = [Compressor(EXACT) for _ in range(WORLD)]
    for step in range(3):
        out = comm.compressed_all_reduce(local_grads(rank, step), live)
        decoded = [s.decode(s.encode(local_grads(r, step))) for r, s in enumerate(sims)]
        for name in out:
            expect = (decoded[0][name] + decoded[1][name]) / WORLD
            torch.testing.assert_close(out[name], expect, rtol=0, atol=0)
    assert live.stats == sims[rank].stats


def check_ddp_hook(rank: int):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    reference = copy.deepcopy(model)                                       # same initial weights
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = comm.CompressedHookState.for_model(model, Compressor(EXACT))
    ddp.register_comm_hook(state, comm.compressed_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    sims = [Compressor(EXACT) for _ in range(WORLD)]
    for step in range(3):
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        # what the compressor predicts: every rank's local gradient, encoded, decoded, averaged
        decoded = []
        for r, sim in enumerate(sims):
            reference.zero_grad()
            xr, yr = batch(r, step)
            torch.nn.functional.mse_loss(reference(xr), yr).backward()
            decoded.append(sim.decode(sim.encode({n: p.grad for n, p in reference.named_parameters()})))
        for name, p in model.named_parameters():
            expect = (decoded[0][name] + decoded[1][name]) / WORLD
            torch.testing.assert_close(p.grad, expect, rtol=0, atol=1e-7)
            next(q for n, q in reference.named_parameters() if n == name).grad = expect.clone()
        opt.step()
        ref_opt.step()
    assert state.stats["comm/exchanges"] == 3
    assert state.compressor.stats["comm/bytes"] == sims[rank].stats["comm/bytes"]


def _worker(rank: int, port: int):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        assert comm.comm_device() == torch.device("cpu")                  # gloo: host tensors
        check_exchange(rank)
        check_ddp_hook(rank)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_over_gloo():
    mp.spawn(_worker, args=(_free_port(),), nprocs=WORLD, join=True)
