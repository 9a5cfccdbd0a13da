"""Runs that are never lost (issue 20, rundir.py): a new run refuses a folder that holds one,
two runs cannot share a folder (a dead holder's lock is taken over), SIGINT/SIGTERM write a
checkpoint and say the resume command, a kill during a checkpoint write and a full disk leave
the previous checkpoint byte for byte with its .tmp removed at the next start, metrics.jsonl
is replaced atomically, files get the user's umask. Faults are injected for real: signals to
a training process, SIGKILL in the middle of a write, a 1-2 MB tmpfs (or a patched write
where mounting is not allowed)."""
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_lab import checkpoint
from grpo_lab.checkpoint import read_training_checkpoint
from grpo_lab.cli import main
from grpo_lab.training.config import preset
from grpo_lab.rundir import RunFolderError, claim, write_lines_atomic
from grpo_lab.training.trainer import train

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["--preset", "quick", "--eval_size", "10", "--threads", "1"]


def cfg(out, **kw):
    return preset("quick", **{"out_dir": str(out), "eval_size": 10, "threads": 1, **kw})


def error_lines(err: str) -> list[str]:
    """The CLI's own lines on stderr (the progress bar writes there too)."""
    assert "Traceback" not in err, err
    return [x for x in err.splitlines() if x.startswith("grpo-lab: error")]


def steps_of(out) -> list[int]:
    return [json.loads(x)["step"] for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def start(args, **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def wait_for_steps(out: Path, n: int, proc: subprocess.Popen, limit_s: float = 240) -> None:
    """Until metrics.jsonl holds ``n`` training steps (the process must still be running).
    A hang is ``limit_s`` without a new step (progress, not the total: a busy machine is
    slow, not red)."""
    deadline, done = time.monotonic() + limit_s, -1
    while time.monotonic() < deadline:
        f = out / "metrics.jsonl"
        steps = len([s for s in steps_of(out) if s >= 0]) if f.exists() else 0
        if steps >= n:
            return
        if steps > done:                               # a new step: the run is advancing
            deadline, done = time.monotonic() + limit_s, steps
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no new step in {limit_s} s ({done} of {n})")


# ---- a new run into a folder holding one

def test_a_new_run_into_a_used_folder_is_refused_by_the_cli(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", *QUICK, "--steps", "2", "--out_dir", out]) == 0
    before = (Path(out) / "checkpoint.safetensors").read_bytes()
    code = main(["train", *QUICK, "--steps", "3", "--out_dir", out])
    err = capsys.readouterr().err
    assert code == 2 and "already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert (Path(out) / "checkpoint.safetensors").read_bytes() == before      # untouched
    assert steps_of(out) == [-1, 0, 1]
    assert main(["train", *QUICK, "--steps", "3", "--out_dir", out, "--overwrite"]) == 0
    assert steps_of(out) == [-1, 0, 1, 2]
    assert read_training_checkpoint(Path(out) / "checkpoint.safetensors")["step"] == 2
    code = main(["train", "--out_dir", out, "--resume", "--overwrite"])
    assert code == 2 and "pass one of them" in capsys.readouterr().err


def test_python_train_replaces_by_default_and_refuses_on_request(tmp_path):
    train(cfg(tmp_path, steps=2), progress=False)
    with pytest.raises(RunFolderError, match="already holds a run .*--resume.*--overwrite"):
        train(cfg(tmp_path, steps=2), progress=False, overwrite=False)
    train(cfg(tmp_path, steps=3), progress=False)                     # a re-run notebook cell
    assert steps_of(tmp_path) == [-1, 0, 1, 2]


def test_resume_of_a_run_killed_before_its_first_checkpoint_says_so(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": -1}\n')
    code = main(["train", "--out_dir", str(tmp_path), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "no checkpoint" in err and "start it again with --overwrite" in err


# ---- the lock: two runs into one folder at once

def test_two_runs_into_one_folder_at_once(tmp_path):
    out = tmp_path / "shared"
    args = ["-m", "grpo_lab.cli", "train", *QUICK, "--steps", "400", "--ckpt_every", "400",
            "--eval_every", "0", "--time_budget_s", "0", "--out_dir", str(out)]
    first = start(args)
    wait_for_steps(out, 1, first)
    second = start(args + ["--overwrite"])                  # even --overwrite cannot take it
    _, err = second.communicate(timeout=240)
    assert second.returncode == 2, err
    assert "is in use by another run" in err and f"pid {first.pid}" in err
    with pytest.raises(RunFolderError, match=f"in use by another run \\(pid {first.pid}"):
        claim(out, resume=False, overwrite=True)
    first.kill()                                            # SIGKILL: its lock file stays
    first.communicate()
    assert f"pid {first.pid}" in (out / ".lock").read_text()
    lock = claim(out, resume=False, overwrite=True)          # a dead holder's lock: taken over
    assert str(os.getpid()) in (out / ".lock").read_text()
    lock.release()


def test_a_lock_on_a_file_unlinked_meanwhile_is_taken_again(tmp_path, monkeypatch):
    """A run that opened .lock.held just before the finishing holder unlinked it would lock a
    file no longer on disk while a third run locks the new one: the claim sees it and retries."""
    from grpo_lab import rundir
    seen = []
    real = rundir._locks_the_file_on_disk
    monkeypatch.setattr(rundir, "_locks_the_file_on_disk",
                        lambda lock: seen.append(1) or (len(seen) > 1 and real(lock)))
    lock = claim(tmp_path, resume=False, overwrite=False)
    assert len(seen) == 2 and lock.held.is_locked
    lock.release()
    held = rundir.filelock.FileLock(tmp_path / ".lock.held", timeout=0, thread_local=False)
    held.acquire()
    assert real(held)
    (tmp_path / ".lock.held").unlink()
    assert not real(held)                                      # unlinked under the lock
    (tmp_path / ".lock.held").write_text("")
    assert not real(held)                                      # replaced by another file
    held.release()
    monkeypatch.setattr(rundir, "_locks_the_file_on_disk", lambda lock: False)
    with pytest.raises(RunFolderError, match="its lock file kept changing"):
        claim(tmp_path, resume=False, overwrite=True)


def test_stale_lock_note(tmp_path, capsys):
    (tmp_path / ".lock").write_text("pid 999999 on elsewhere since 2020-01-01 00:00:00\n")
    lock = claim(tmp_path, resume=False, overwrite=False)
    lock.release()
    assert "took over the lock of a run that is no longer running (pid 999999" in \
        capsys.readouterr().out


# ---- Ctrl-C and SIGTERM: a checkpoint at the step boundary, the resume command, 130 / 143

@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_writes_a_checkpoint_and_says_how_to_resume(tmp_path, sig, code):
    out = tmp_path / "run"
    proc = start(["-m", "grpo_lab.cli", "train", *QUICK, "--steps", "3000", "--ckpt_every",
                  "1000", "--eval_every", "0", "--time_budget_s", "0", "--out_dir", str(out)])
    wait_for_steps(out, 2, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == code, err
    saved = read_training_checkpoint(out / "checkpoint.safetensors")
    logged = [s for s in steps_of(out) if s >= 0]
    assert saved["step"] == logged[-1] >= 1                  # every logged step is kept
    assert f"checkpoint of step {saved['step']} written" in err
    assert f"continue with: grpo-lab train --out_dir {out} --resume" in err
    # the exact command continues it (time_budget_s is a runtime field: stop after a moment)
    assert main(["train", "--out_dir", str(out), "--resume", "--time_budget_s", "1"]) == 0
    steps = [s for s in steps_of(out) if s >= 0]
    assert steps == list(range(len(steps))) and len(steps) > len(logged)


# ---- a kill in the middle of a checkpoint write; the stale .tmp goes at the next start

KILL_IN_WRITE = """
import os, signal, sys
from pathlib import Path
import safetensors.torch
from grpo_lab import checkpoint
from grpo_lab.training.config import preset
from grpo_lab.training.trainer import train
calls = []
def dying_save(tensors, path, metadata):
    calls.append(path)
    if len(calls) == 2:                      # the second checkpoint: half written, then killed
        safetensors.torch.save_file(tensors, path, metadata)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    safetensors.torch.save_file(tensors, path, metadata)
checkpoint.save_file = dying_save
train(preset("quick", out_dir=sys.argv[1], steps=4, ckpt_every=2, eval_size=10, threads=1),
      progress=False)
"""


def test_kill_during_a_checkpoint_write_keeps_the_previous_one(tmp_path, capsys):
    out = tmp_path / "run"
    proc = start(["-c", KILL_IN_WRITE, str(out)])
    proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL
    tmps = list(out.glob("*.tmp"))
    assert len(tmps) == 1 and tmps[0].name.startswith("checkpoint.safetensors.")
    good = (out / "checkpoint.safetensors").read_bytes()
    assert read_training_checkpoint(out / "checkpoint.safetensors")["step"] == 1
    assert main(["train", "--out_dir", str(out), "--resume"]) == 0
    assert f"removed 1 unfinished temporary file(s) of an interrupted write from {out}: " \
           f"['{tmps[0].name}']" in capsys.readouterr().out
    assert not list(out.glob("*.tmp"))
    assert read_training_checkpoint(out / "checkpoint.safetensors")["step"] == 3
    assert good != (out / "checkpoint.safetensors").read_bytes()


# ---- a full disk during a checkpoint write

def _checkpoint_bytes(tmp_path) -> int:
    train(cfg(tmp_path / "size", steps=1), progress=False)
    return (tmp_path / "size" / "checkpoint.safetensors").stat().st_size


def test_disk_full_on_a_small_tmpfs(tmp_path, capsys):
    """A real ENOSPC: a tmpfs with room for one checkpoint, not two (the new one is written
    beside the old before the rename)."""
    size = _checkpoint_bytes(tmp_path)
    mnt = tmp_path / "small"
    mnt.mkdir()
    kib = (size * 3 // 2 + 64 * 1024) // 1024
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); "
                    f"test_disk_full_simulated covers ENOSPC with a patched write")
    try:
        out = mnt / "run"
        code = main(["train", *QUICK, "--steps", "4", "--ckpt_every", "2", "--eval_size", "0",
                     "--out_dir", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and len(error_lines(err)) == 1, err                 # one line
        assert "No space left on device" in err or "Errno 28" in err, err
        assert "the previous file is left as it was" in err and "at step 3" in err
        assert read_training_checkpoint(out / "checkpoint.safetensors")["step"] == 1  # whole
        assert not list(out.glob("*.tmp"))
    finally:
        gc.collect()                   # read tensors map the file: the mount is busy until freed
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full_simulated(tmp_path, capsys, monkeypatch):
    """ENOSPC from a patched write (what a full disk raises), where no tmpfs can be mounted."""
    out = tmp_path / "run"
    real, calls = checkpoint.save_file, []

    def full_disk(tensors, path, metadata):
        calls.append(path)
        if len(calls) == 2:
            with open(path, "wb") as f:
                f.write(b"\0" * 1000)
            raise OSError(28, "No space left on device")
        real(tensors, path, metadata)
    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    code = main(["train", *QUICK, "--steps", "4", "--ckpt_every", "2", "--out_dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(error_lines(err)) == 1 and "No space left on device" in err, err
    assert "previous file is left as it was" in err and "at step 3" in err
    assert read_training_checkpoint(out / "checkpoint.safetensors")["step"] == 1
    assert not list(out.glob("*.tmp"))


# ---- metrics.jsonl replaced atomically; the user's umask

def test_metrics_rewrite_is_atomic(tmp_path, monkeypatch):
    f = tmp_path / "metrics.jsonl"
    f.write_text('{"step": -1}\n{"step": 0}\n')

    class Boom:                                   # the write dies half way (a kill, a full disk)
        def __str__(self):
            raise OSError(28, "No space left on device")
    with pytest.raises(TypeError):
        write_lines_atomic(f, ['{"step": -1}\n', Boom()])
    assert f.read_text() == '{"step": -1}\n{"step": 0}\n' and not list(tmp_path.glob("*.tmp"))
    write_lines_atomic(f, ['{"step": 5}\n'])
    assert f.read_text() == '{"step": 5}\n'


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_files_follow_the_users_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        train(cfg(tmp_path, steps=2, eval_size=0), progress=False)
    finally:
        os.umask(old)
    for name in ("checkpoint.safetensors", "metrics.jsonl"):
        assert (tmp_path / name).stat().st_mode & 0o777 == mode, name


@pytest.mark.parametrize("how, code", [("ctrl-c", 130), ("sigterm", 143)])
def test_ctrl_c_or_sigterm_under_nproc_checkpoints_and_exits(tmp_path, how, code):
    """A terminal's Ctrl-C reaches every process of the foreground group: torchrun's agent and
    both ranks (which then also get it forwarded by torchrun, within GRACE_S). A scheduler's
    SIGTERM reaches the launcher alone; the ranks must still finish the step and checkpoint."""
    out = tmp_path / "run"
    proc = start(["-m", "grpo_lab.cli", "train", *QUICK, "--nproc", "2", "--steps", "3000",
                  "--ckpt_every", "1000", "--eval_every", "0", "--time_budget_s", "0",
                  "--out_dir", str(out)], start_new_session=True)
    wait_for_steps(out, 2, proc)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == code, err[-3000:]
    saved = read_training_checkpoint(out / "checkpoint.safetensors")
    assert saved["step"] == [s for s in steps_of(out) if s >= 0][-1] >= 1
    assert f"continue with: grpo-lab train --out_dir {out} --resume --nproc 2" in err


def test_only_the_run_files_temporaries_are_removed(tmp_path):
    from grpo_lab.rundir import remove_stale_tmp
    for name in ("checkpoint.safetensors.k3j2.tmp", "metrics.jsonl.x9.tmp", "notes.tmp",
                 "checkpoint.safetensors"):
        (tmp_path / name).write_text("x")
    assert remove_stale_tmp(tmp_path) == ["checkpoint.safetensors.k3j2.tmp", "metrics.jsonl.x9.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.safetensors", "notes.tmp"]


def test_a_second_claim_names_the_holder_and_a_clean_release_leaves_no_note(tmp_path, capsys):
    import re
    import socket
    lock = claim(tmp_path, resume=False, overwrite=False)
    text = (tmp_path / ".lock").read_text()
    me = f"pid {os.getpid()} on {socket.gethostname()}"
    assert text.startswith(f"{me} since ")
    with pytest.raises(RunFolderError, match=re.escape(f"is in use by another run ({me} since")):
        claim(tmp_path, resume=False, overwrite=True)       # --overwrite cannot take it either
    assert (tmp_path / ".lock").read_text() == text          # the refused claim changed nothing
    lock.release()
    lock.release()                                           # a second release does nothing
    assert not (tmp_path / ".lock").exists()                 # released cleanly: nobody to name
    assert not (tmp_path / ".lock.held").exists()            # and no lock file left
    claim(tmp_path, resume=False, overwrite=False).release()
    assert "took over" not in capsys.readouterr().out
