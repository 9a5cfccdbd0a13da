"""What the machine says about itself, read from the OS: bytes this process has written
(``wchar``, the measured side of the byte accounting) and the cores other processes keep busy
(``busy_cores``, ``free_cores``: how many torch threads a run should take on a shared machine)
and whether a process lives (``pid_alive``). Linux's /proc;
elsewhere the fallbacks named in each function.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch


def wchar() -> int | None:
    """Bytes this process has handed to write()/send() so far (Linux /proc/self/io), or None."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def busy_cores(samples: int = 5, interval_s: float = 0.05) -> float:
    """Cores other processes keep busy now: the median over ``samples`` readings of the
    runnable-task count in /proc/loadavg (4th field, "running/total"), this process excluded.
    Instantaneous on purpose: the 1-minute load average still counts a job that just ended
    (the pip install before a first ``make demo``), and would cost the demo its second thread."""
    counts = []
    for i in range(samples):
        with open("/proc/loadavg") as f:
            counts.append(int(f.read().split()[3].split("/")[0]))
        if i + 1 < samples:
            time.sleep(interval_s)
    return max(0, sorted(counts)[len(counts) // 2] - 1)


def free_cores() -> int:
    """torch threads for ``threads=0``: the cores other processes leave free (CPU count minus
    ``busy_cores``; the 1-minute load average where /proc/loadavg is missing; torch's default
    where that is missing too, as on Windows), at least 1, at most torch's default. On a busy
    2-core machine a second thread fights the other process for a core: steps took up to 2 s
    instead of 0.05 s (BENCHMARKS.md section 13)."""
    try:
        busy = busy_cores()
    except (OSError, ValueError, IndexError):                    # not Linux
        try:
            busy = os.getloadavg()[0]                            # macOS, the BSDs
        except (OSError, AttributeError):                        # Windows has neither
            return torch.get_num_threads()
    return max(1, min(torch.get_num_threads(), round((os.cpu_count() or 1) - busy)))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine. POSIX: signal 0 (nothing is sent);
    Windows, where ``os.kill`` would terminate it: OpenProcess and its exit code."""
    if os.name == "nt":
        import ctypes
        k32 = ctypes.windll.kernel32
        handle = k32.OpenProcess(0x1000, False, pid)      # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return False
        code = ctypes.c_ulong()
        k32.GetExitCodeProcess(handle, ctypes.byref(code))
        k32.CloseHandle(handle)
        return code.value == 259                          # STILL_ACTIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:                               # alive, someone else's
        return True
    return True
