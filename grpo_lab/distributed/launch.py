"""Process groups for grpo_lab: under ``torchrun`` (env vars) or ``spawn`` (tests, notebooks).

Two ways in, one group out:

  * ``init_from_env()``: the process was started by ``torchrun --nproc_per_node=N``, which sets
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. Multi-node is torchrun's job.
  * ``spawn(fn, world_size, args)``: starts ``world_size`` fresh processes on this machine with
    ``torch.multiprocessing``, sets MASTER_ADDR=127.0.0.1 and a free port, joins the group,
    runs ``fn(rank, world_size, *args)``, destroys the group, and returns every rank's return
    value to the parent as a list (rank order).

Backend: NCCL when CUDA has a device for every local rank, gloo otherwise (CPU). Tensors then
live on ``device_for(rank)``: ``cuda:<local rank>`` under NCCL, ``cpu`` under gloo.

Faults, the part that is easy to get wrong: a collective whose peer died or never arrives
blocks until the group's ``timeout``; torch's default is 10 to 30 minutes, which in a notebook
looks like a hang. ``timeout_s`` (default 60 s) is passed to ``init_process_group``, so a
stuck collective raises in every surviving rank within about that time. In the parent,
``spawn`` watches the children: the first rank that raises or dies ends the run; the others
are terminated, and the parent raises ``RankFailedError`` whose message names the rank and
carries its traceback. An optional ``run_timeout_s`` bounds the whole run (a rank stuck in
plain Python code, not in a collective, is not covered by the collective timeout).

Threads: under gloo each spawned rank gets cpu_count // world_size torch threads (unless
OMP_NUM_THREADS is set); torch's default of all cores per process oversubscribes the CPU,
which made a 2-rank test run about 4x slower on a busy 2-core machine.

Return values travel back through files in a temporary directory written with ``torch.save``
(our own files, read once by the parent): a queue would need the parent to drain it while
the children run, and tensors sent through a torch queue live in the sender's shared memory,
which vanishes when the sender exits.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class RankFailedError(RuntimeError):
    """A spawned rank raised, died, or the run passed ``run_timeout_s``; ``.rank`` names it."""

    def __init__(self, rank: int | None, message: str):
        super().__init__(message)
        self.rank = rank


def pick_backend(world_size: int) -> str:
    """'nccl' if CUDA offers a device per rank on this machine, else 'gloo'."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def device_for(rank: int, backend: str) -> torch.device:
    """Where this rank's tensors live: its own GPU under NCCL, the CPU under gloo."""
    if backend == "nccl":
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_from_env(backend: str | None = None, timeout_s: float = 60.0):
    """Join the group torchrun described in the environment -> (rank, world_size, device)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"init_from_env: environment variables {missing} are not set; "
                           f"start with `torchrun --nproc_per_node=N script.py` or use spawn()")
    world_size = int(os.environ["WORLD_SIZE"])
    backend = backend or pick_backend(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    device = device_for(local_rank, backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    global PEERS
    PEERS = [None] * dist.get_world_size()
    dist.all_gather_object(PEERS, (socket.gethostname(), os.getpid()))
    return dist.get_rank(), dist.get_world_size(), device


PEERS: list = []
"""(host, pid) of every rank, rank order, gathered when the group was joined from torchrun."""


def wake_local_peers() -> list[int]:
    """SIGCONT to this machine's other ranks -> their pids. Called by a rank that fails (a
    collective timed out): when torchrun then stops the survivors with SIGTERM, a rank that
    was stopped (SIGSTOP, Ctrl-Z, a debugger) cannot act on it, and torchrun waits 30 s more
    before its SIGKILL. Resumed, it dies on the SIGTERM at once. Harmless to a running rank;
    nothing to do where there is no SIGCONT (Windows)."""
    import signal
    if not hasattr(signal, "SIGCONT"):
        return []
    here, woken = socket.gethostname(), []
    for host, pid in PEERS:
        if host == here and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGCONT)
                woken.append(pid)
            except OSError:                        # gone already
                pass
    return woken


def _worker(rank, fn, world_size, port, backend, timeout_s, args, out_dir):
    if backend == "gloo" and "OMP_NUM_THREADS" not in os.environ:
        # ranks share the CPU cores; torch's default (all cores each) oversubscribes them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    device = device_for(rank, backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:                        # joining is recorded too: a port taken since free_port()
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        result = fn(rank, world_size, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()              # leave together: a peer tearing down early can abort gloo
    except BaseException as e:  # record before the socket closes: the parent needs the first cause
        record = {"time": time.time(), "type": type(e).__name__, "message": str(e),
                  "traceback": traceback.format_exc()}
        from grpo_lab.rundir import write_lines_atomic  # whole or absent: the parent may
        write_lines_atomic(Path(out_dir) / f"rank{rank}.err.json",   # stop this rank
                           [json.dumps(record)])                        # mid-write (SIGTERM)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _first_failure(out_dir, world_size, backend, exc, exitcodes=()) -> RankFailedError:
    """The earliest recorded error is the cause; the others are usually its echo
    ('Connection closed by peer', 'Timed out waiting ...') in the ranks that waited on it.
    A rank that exited with a non-zero code and recorded nothing died (killed, os._exit,
    segfault): it is the cause, and the recorded errors are the echo. So is a rank that exited
    with code 0 but left neither a result nor an error (os._exit(0) in user code): its peers
    then fail on the closed connection, and blaming the first of them would hide it."""
    files = {r: Path(out_dir) / f"rank{r}.err.json" for r in range(world_size)}
    records = {r: json.loads(f.read_text()) for r, f in files.items() if f.exists()}
    echo = {r: f"rank {r}: {rec['type']}: {rec['message'][:200]}" for r, rec in records.items()}
    returned = {r for r in range(world_size) if (Path(out_dir) / f"rank{r}.pt").exists()}
    dead = [r for r, code in enumerate(exitcodes) if code is not None and r not in records
            and code != -15 and (code != 0 or r not in returned)]   # -15: terminated by us
    if dead:
        echoes = "; ".join(echo.values())
        code = exitcodes[dead[0]]
        how = "exited early, before returning a result" if code == 0 else "died"
        return RankFailedError(dead[0], f"rank {dead[0]} of {world_size} {how} (exit code "
                               f"{code}, backend {backend})"
                               + (f"; then {echoes}" if echoes else ""))
    if not records:  # died without raising (killed, segfault, bad import in the child)
        code = getattr(exc, "exit_code", None)
        return RankFailedError(exc.error_index, f"rank {exc.error_index} of {world_size} died "
                               f"(exit code {code}, backend {backend}): {exc}")
    rank = min(records, key=lambda r: records[r]["time"])
    rec = records[rank]
    echoes = [e for r, e in echo.items() if r != rank]
    silent = [r for r in range(world_size) if r not in records]
    msg = (f"rank {rank} of {world_size} raised {rec['type']}: {rec['message']} "
           f"(backend {backend})\n{rec['traceback']}")
    if echoes:
        msg += "then: " + "; ".join(echoes) + "\n"
    if silent:
        msg += f"ranks {silent} had not failed (still running or stuck) and were terminated\n"
    return RankFailedError(rank, msg)


def spawn(fn, world_size: int, args: tuple = (), backend: str | None = None,
          timeout_s: float = 60.0, run_timeout_s: float | None = None, on_poll=None,
          progress: str | None = None) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` new processes -> results by rank.

    ``fn`` must be importable (a module-level function): processes are started with the
    'spawn' method. ``timeout_s`` bounds each collective; ``run_timeout_s`` (None: no bound)
    bounds the whole run. Raises ``RankFailedError`` naming the first rank that failed.
    ``on_poll()``, if given, is called in this process about 5 times a second while the ranks
    run (a progress bar: the children's own output does not reach a notebook). ``progress``:
    a label for a bar showing the time elapsed while the ranks run (None: no bar).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    backend = backend or pick_backend(world_size)
    with tempfile.TemporaryDirectory(prefix="grpo_lab_spawn_") as out_dir:
        ctx = mp.start_processes(_worker, nprocs=world_size, join=False, start_method="spawn",
                                 args=(fn, world_size, free_port(), backend, timeout_s,
                                       tuple(args), out_dir))
        deadline = None if run_timeout_s is None else time.monotonic() + run_timeout_s
        bar = None
        if progress is not None:
            from tqdm.auto import tqdm
            bar = tqdm(desc=f"{progress} ({world_size} processes)", bar_format="{desc}: {elapsed}")
        try:
            while not ctx.join(timeout=0.2):
                if bar is not None:
                    bar.refresh()
                if on_poll is not None:
                    on_poll()
                if deadline is not None and time.monotonic() > deadline:
                    alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                    for r in alive:
                        ctx.processes[r].terminate()
                    raise RankFailedError(alive[0] if alive else None,
                                          f"run passed run_timeout_s={run_timeout_s}; "
                                          f"ranks {alive} of {world_size} were still running")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            for p in ctx.processes:                   # let every rank settle, then read codes
                p.join(timeout=5)
            codes = [p.exitcode for p in ctx.processes]
            done = all((Path(out_dir) / f"rank{r}.pt").exists() for r in range(world_size))
            if not (done and isinstance(e, mp.ProcessExitedException)):
                raise _first_failure(out_dir, world_size, backend, e, codes) from None
            warnings.warn(f"every rank finished and saved its result, then exit codes were "
                          f"{codes} (a crash while tearing down the process group); the results "
                          f"are kept", RuntimeWarning, stacklevel=2)
        finally:
            if bar is not None:
                bar.close()
        paths = [Path(out_dir) / f"rank{r}.pt" for r in range(world_size)]
        # any object fn returned, written by this call's own children into the private
        # folder made above (mode 0700): a full unpickle, the trust of multiprocessing's own
        # pipes; checkpoints and files a user hands in are loaded with weights_only=True
        return [torch.load(p, weights_only=False) for p in paths]
