"""Process groups: a rank that raises or stalls mid-step ends the run with a clear error in the
parent, within the collective timeout, instead of a hang."""
import multiprocessing
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
from hangs import assert_ended_in_time, stamp, stamped
import torch.nn.functional as F

from grpo_lab.distributed import launch
from grpo_lab.distributed.launch import RankFailedError, init_from_env, pick_backend, spawn
from grpo_lab.distributed.sharder import ShardedOptimizer
from grpo_lab.policies.model import GPT, GPTConfig

CFG = GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8)
TIMEOUT_S = 8


def _faulty_training(rank, world, fault, clock):
    if rank == 1:
        stamp(f"{clock}/started")                                          # start-up is over
    torch.manual_seed(0)
    model = GPT(CFG)
    opt = ShardedOptimizer(model.named_parameters(), policy="size_balanced")
    x = torch.randint(0, CFG.vocab_size, (2, 9), generator=torch.Generator().manual_seed(rank))
    for step in range(3):
        logits, _ = model(x[:, :-1])
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).backward()
        if rank == 1 and step == 1:
            stamp(f"{clock}/fault")
            if fault == "raise":
                raise ValueError(f"boom in rank {rank} at step {step}")
            time.sleep(10 * TIMEOUT_S)                                     # "stall"
        opt.step()                                                         # rank 0 waits here
        opt.zero_grad()
    return step


def _ended_in_time(tmp_path, started_at, error_at):
    """From the fault to the error: the collective's timeout, spawn's 5 s grace, and once
    the processes' start-up timed in this test (a rank's exit is work of that kind: a busy
    machine stretches both). A stall that the timeout did not end lasts 10 * TIMEOUT_S."""
    start_up = stamped(tmp_path / "started") - started_at
    assert_ended_in_time(stamped(tmp_path / "fault"), error_at, TIMEOUT_S, 5.0, start_up)


def test_rank_that_raises_mid_step_names_itself_in_the_parent(tmp_path):
    t0 = time.time()
    with pytest.raises(RankFailedError) as info:
        spawn(_faulty_training, 2, args=("raise", str(tmp_path)), timeout_s=TIMEOUT_S,
              run_timeout_s=300)
    _ended_in_time(tmp_path, t0, time.time())
    assert info.value.rank == 1
    assert "rank 1 of 2 raised ValueError: boom in rank 1 at step 1" in str(info.value)


def test_stalled_rank_makes_the_others_time_out_not_hang(tmp_path):
    t0 = time.time()
    with pytest.raises(RankFailedError) as info:
        spawn(_faulty_training, 2, args=("stall", str(tmp_path)), timeout_s=TIMEOUT_S,
              run_timeout_s=300)
    _ended_in_time(tmp_path, t0, time.time())                        # long before the stall ends
    assert info.value.rank == 0                                            # the one that waited
    assert "Timed out" in str(info.value) and "ranks [1] had not failed" in str(info.value)


def _exits_early(rank, world):
    if rank == 1:
        os._exit(0)                              # user code that ends its process, "cleanly"
    dist.barrier()                               # rank 0 fails here on the closed connection
    return rank


def test_rank_that_exits_0_mid_run_is_named_not_the_peer_it_left():
    with pytest.raises(RankFailedError) as info:
        spawn(_exits_early, 2, timeout_s=TIMEOUT_S, run_timeout_s=120)
    assert info.value.rank == 1, info.value
    assert str(info.value).startswith("rank 1 of 2 exited early, before returning a result "
                                      "(exit code 0"), info.value
    assert "then rank 0: " in str(info.value)                      # its peer's error: the echo
    assert not multiprocessing.active_children()


def _rank(rank, world):
    return rank


def test_a_port_taken_since_it_was_picked_is_named_with_the_rank(monkeypatch):
    with socket.socket() as taken:                       # another program took the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(launch, "free_port", lambda: taken.getsockname()[1])
        with pytest.raises(RankFailedError) as info:
            spawn(_rank, 2, timeout_s=TIMEOUT_S, run_timeout_s=120)
    assert info.value.rank == 0, info.value
    assert str(info.value).startswith("rank 0 of 2 raised DistNetworkError"), info.value
    assert "address already in use" in str(info.value), info.value
    assert not multiprocessing.active_children()


def test_bad_arguments_and_missing_environment():
    with pytest.raises(ValueError, match="world_size must be a positive int, got 0"):
        spawn(_faulty_training, 0)
    with pytest.raises(ValueError, match="timeout_s must be positive, got -1"):
        spawn(_faulty_training, 2, timeout_s=-1)


def test_init_from_env_outside_torchrun(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        init_from_env()


def test_gloo_when_there_are_not_enough_gpus():
    assert pick_backend(10**6) == "gloo"                                   # a GPU per rank or none
