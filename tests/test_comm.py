"""Compressed exchange over a real 2-process gloo group, and the DDP comm hook."""
import dataclasses
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_lab.distributed import comm
from grpo_lab.distributed.compression import CompressionConfig, Compressor, decode_message

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
        decoded = [decode_message(s.encode(local_grads(r, step))) for r, s in enumerate(sims)]
        for name in out:
            expect = (decoded[0][name] + decoded[1][name]) / WORLD
            torch.testing.assert_close(out[name], expect, rtol=0, atol=0)
    assert live.stats == sims[rank].stats

    # the fast path (sampled threshold, fp8 values, torch Rice) over the wire equals the
    # readable path of the same config simulated locally, bit for bit
    fast = dataclasses.replace(EXACT, topk="sampled", topk_format="e4m3", fast=True)
    live = Compressor(fast, seed=rank)
    sims = [Compressor(dataclasses.replace(fast, fast=False), seed=r) for r in range(WORLD)]
    for step in range(3):
        out = comm.compressed_all_reduce(local_grads(rank, step), live)
        decoded = [decode_message(s.encode(local_grads(r, step))) for r, s in enumerate(sims)]
        for name in out:
            assert torch.equal(out[name], (decoded[0][name] + decoded[1][name]) / WORLD), name


def _worker(rank: int, port: int):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        assert comm.comm_device() == torch.device("cpu")                  # gloo: host tensors
        check_exchange(rank)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_over_gloo():
    mp.spawn(_worker, args=(_free_port(),), nprocs=WORLD, join=True)
