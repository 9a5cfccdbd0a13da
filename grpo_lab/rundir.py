"""A run folder (``out_dir``) that no mistake empties: claim, lock, interrupt, clean up.

What can lose a run, and what this module does about it:

  * A new run started into a folder that holds one (``--resume`` forgotten after a crash):
    ``claim`` refuses, naming ``--resume`` (continue it) and ``--overwrite`` (replace it).
    Overwriting deletes the old run's files (``RUN_FILES``) before any work, so a folder
    never mixes two runs' checkpoint and metrics.
  * Two runs into one folder at once: ``claim`` takes an exclusive OS lock on
    ``out_dir/.lock.held`` (the ``filelock`` package: ``flock`` on Linux and macOS,
    ``LockFileEx`` on Windows) and writes who holds it (pid, host, time) to ``out_dir/.lock``,
    a plain text file any process can read (Windows forbids reading a locked byte range,
    hence two files; both are deleted when the run ends, so a finished run's folder holds no
    lock file). The OS drops the lock when the process dies however it dies, so a lock
    left by a dead process (SIGKILL, power loss) is simply taken over (and said so: its
    ``.lock`` still names it); a live holder is named by its pid and host. (The lock is local:
    a folder shared over NFS between machines is not protected.)
  * Ctrl-C (SIGINT) or SIGTERM mid-run: ``StopSignals`` turns the first signal into a flag
    the trainer reads at the step boundary; it then writes a checkpoint and raises
    ``Interrupted``, which the CLI reports with the exact resume command and exit code
    130 (SIGINT) or 143 (SIGTERM: 128 + 15, the shell's convention). A second signal stops
    at once (the last checkpoint is intact: files are replaced atomically). On several
    processes only SIGINT is caught: torchrun sends SIGTERM to the surviving ranks when one
    fails, and a rank stuck in user code must then die at once (the default action), not
    wait for a step boundary it never reaches (torchrun would wait 30 s more, then SIGKILL).
    A SIGTERM to the launcher is forwarded to the ranks as SIGINT (cli.launch_torchrun).
  * A kill during a checkpoint write leaves ``<name>.<random>.tmp`` beside the target
    (checkpoint.py writes there, then renames): ``claim`` deletes such files on the next
    start, once it holds the lock (no live writer can own them then).
  * metrics.jsonl rewritten on resume: ``write_lines_atomic`` writes a temporary file and
    renames it over the old one, so a kill leaves the old file or the new one, not an empty one.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import filelock

SHARDS_DIR = "checkpoint.dcp"
"""The folder of a sharded checkpoint's shard folders (distributed/dcp.py)."""
RUN_FILES = ("checkpoint.safetensors", "metrics.jsonl", "report.md", "report.png",
             "samples.jsonl", "config.json", SHARDS_DIR)
"""The files (and the one folder) of one run; ``--overwrite`` deletes these (and nothing else)
from out_dir."""
LOCK_NAME = ".lock"
"""Who holds the folder: ``pid N on HOST since TIME``, emptied on release (text left there
means the holder died)."""
HELD_NAME = ".lock.held"
"""The file the OS lock is taken on (its content means nothing)."""
LOCKED_ENV = "GRPO_LAB_CLAIMED_OUT_DIR"
"""Set by ``grpo-lab train --nproc`` to the folder it claimed for the ranks it launches."""


class RunFolderError(ValueError):
    """out_dir holds another run, is in use, or is not a writable folder."""


class Interrupted(KeyboardInterrupt):
    """The run stopped on SIGINT/SIGTERM at a step boundary; ``checkpoint_step`` is the step
    whose checkpoint was written (None: none was), ``exit_code`` 130 or 143."""

    def __init__(self, signum: int, out_dir: str, checkpoint_step: int | None):
        name = signal.Signals(signum).name
        super().__init__(f"{name} received" + (
            f": checkpoint of step {checkpoint_step} written to {out_dir}"
            if checkpoint_step is not None else ": no step had finished, nothing to resume"))
        self.signum, self.out_dir, self.checkpoint_step = signum, out_dir, checkpoint_step
        self.exit_code = 128 + signum


class RunLock:
    """An exclusive lock on ``out_dir`` for this process; ``release()`` (or process exit) frees
    it. ``stale``: what ``.lock`` said when the lock was taken (non-empty: a holder that died)."""

    def __init__(self, out: Path):
        self.path = out / LOCK_NAME
        for _ in range(3):                 # a finishing holder may unlink the file meanwhile
            self.held = filelock.FileLock(out / HELD_NAME, timeout=0, thread_local=False)
            try:
                self.held.acquire()
            except filelock.Timeout:
                holder = read_holder(self.path) or "?"
                raise RunFolderError(f"out_dir {str(out)!r} is in use by another run ({holder}); "
                                     f"wait for it, stop it, or pick another --out_dir") from None
            if _locks_the_file_on_disk(self.held):
                break
            self.held.release()            # locked a file a finished run had just unlinked
        else:
            raise RunFolderError(f"out_dir {str(out)!r}: its lock file kept changing under us; "
                                 f"is another run starting and stopping there?")
        try:
            self.stale = read_holder(self.path)
            self.path.write_text(f"pid {os.getpid()} on {socket.gethostname()} since "
                                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        except BaseException:
            self.held.release()
            raise

    def release(self) -> None:
        """Free the folder and leave no lock file in it: ``.lock`` (released cleanly: no holder
        to name) and ``.lock.held`` are deleted, the latter while still held, so a run that
        opened it meanwhile finds it unlinked (``_locks_the_file_on_disk``) and opens anew."""
        if self.held.is_locked:
            try:
                self.path.unlink(missing_ok=True)
                Path(self.held.lock_file).unlink(missing_ok=True)
            except OSError:                           # Windows: open in another process
                pass
            finally:
                self.held.release()


def _locks_the_file_on_disk(lock: filelock.BaseFileLock) -> bool:
    """Whether the file ``lock`` holds is still the one at its path (not unlinked, not
    replaced); True where the descriptor cannot be read (then nothing is ever unlinked twice
    in a row to race with)."""
    fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
    if fd is None:
        return True
    try:
        return os.path.samestat(os.fstat(fd), os.stat(lock.lock_file))
    except FileNotFoundError:
        return False


def read_holder(path: Path) -> str:
    """The holder line of a ``.lock`` file ("" when there is none)."""
    try:
        return path.read_bytes()[:200].decode(errors="replace").strip()
    except FileNotFoundError:
        return ""


def remove_stale_tmp(out: Path) -> list[str]:
    """Delete the temporary files an interrupted atomic write of a run file left in ``out``
    (``<run file>.<random>.tmp``; nothing else) -> their names."""
    gone = sorted(p for name in RUN_FILES for p in out.glob(f"{name}.*.tmp") if p.is_file())
    for p in gone:
        p.unlink()
    return [p.name for p in gone]


def writable_folder(out: Path) -> Path:
    """``out``, created (parents too) and proven writable by a file written there; a file in
    its place, a missing permission or a read-only disk is a RunFolderError naming it, before
    any work (a run's folder, claim; a study's, experiments.py)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as e:
        raise RunFolderError(f"out_dir {str(out)!r} is not a writable folder: "
                             f"{type(e).__name__}: {e.strerror or e}") from None
    return out


def claimed_by_parent(out: str | Path) -> bool:
    """True in a rank launched by ``grpo-lab train --nproc``, which claimed ``out`` already."""
    return os.environ.get(LOCKED_ENV) == str(Path(out).resolve())


def claim(out: str | Path, resume: bool, overwrite: bool) -> RunLock:
    """Make ``out`` this run's folder -> the lock (release it when the run ends).

    Creates the folder, proves it writable, takes the lock, deletes stale ``*.tmp`` files;
    then a new run (not ``resume``) into a folder holding a run is an error unless
    ``overwrite``, which deletes the old run's files first."""
    out = Path(out)
    if resume and overwrite:
        raise RunFolderError("--resume continues the run in out_dir, --overwrite replaces it: "
                             "pass one of them")
    lock = RunLock(writable_folder(out))
    try:
        if lock.stale:
            print(f"grpo-lab: note: took over the lock of a run that is no longer running "
                  f"({lock.stale})")
        gone = remove_stale_tmp(out)
        if gone:
            print(f"grpo-lab: note: removed {len(gone)} unfinished temporary file(s) of an "
                  f"interrupted write from {out}: {gone}")
        present = [n for n in RUN_FILES[:2] if (out / n).exists()]   # checkpoint, metrics: a run
        if present and not resume:
            if not overwrite:
                raise RunFolderError(
                    f"out_dir {str(out)!r} already holds a run ({', '.join(present)}): continue "
                    f"it with --resume (train(..., resume=True)), replace it with --overwrite "
                    f"(train(..., overwrite=True)), or pick another --out_dir")
            for name in RUN_FILES:
                if (out / name).is_dir():
                    shutil.rmtree(out / name)
                else:
                    (out / name).unlink(missing_ok=True)
    except BaseException:
        lock.release()
        raise
    return lock


def write_lines_atomic(path: Path, lines: list[str]) -> None:
    """Replace ``path`` with ``lines`` atomically (temporary file, fsync, rename)."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class StopSignals:
    """``with StopSignals() as stop:`` -> ``stop.signum`` is None until SIGINT or SIGTERM
    arrives, then that signal's number; a second signal (after ``GRACE_S``) raises
    KeyboardInterrupt at once.
    Outside the main thread (signal handlers cannot be set there) it never fires."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, announce: bool = True, signals=SIGNALS):
        self.signum, self.announce, self._old, self._since = None, announce, {}, 0.0
        self.signals = signals
        self.step = None
        """The step running now (the trainer sets it; error messages name it)."""

    GRACE_S = 1.0
    """A repeat within this long is the same event (a terminal's Ctrl-C reaches torchrun's
    workers directly and again through torchrun, which forwards it)."""

    def _handle(self, signum, frame):
        if self.signum is not None:
            if time.monotonic() - self._since < self.GRACE_S:
                return
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopped at once")
        self.signum, self._since = signum, time.monotonic()
        if self.announce:
            print(f"\ngrpo-lab: {signal.Signals(signum).name} received: finishing this step and "
                  f"writing a checkpoint (send it again to stop at once)", flush=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        return False
