"""A learner on native Windows (issue 34): no POSIX-only module on the paths a learner takes.

One subprocess runs as Windows would have it: ``fcntl``, ``resource``, ``termios``, ``pwd``,
``grp``, ``pty`` and ``tty`` cannot be imported, ``signal`` has none of the POSIX-only
signals (SIGKILL, SIGALRM, SIGHUP, SIGUSR1, ...) and ``os`` no ``getloadavg`` (a
``sitecustomize.py`` on PYTHONPATH removes them before anything else imports). In it: a few steps of the trainer, ``grpo-lab train``
through the CLI (a second start into the same folder is refused, ``--overwrite`` replaces the
run), ``grpo-lab preflight`` (a verdict, not a traceback) and notebook 00's code cells up to
its training cell (its imports, the config, the base policy's sampled groups).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

from scripts import load_script

ROOT = Path(__file__).resolve().parent.parent

BLOCKED = ("fcntl", "resource", "termios", "pwd", "grp", "pty", "tty")
POSIX_SIGNALS = ("SIGALRM", "SIGHUP", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGPIPE",
                 "SIGCHLD", "setitimer", "getitimer", "ITIMER_REAL", "alarm", "pause",
                 "pthread_kill", "siginterrupt")

SHIM = f"""import signal, sys
for name in {BLOCKED!r}:
    sys.modules[name] = None            # `import fcntl` -> ModuleNotFoundError, as on Windows
for name in {POSIX_SIGNALS!r}:
    if hasattr(signal, name):
        delattr(signal, name)
import os
del os.getloadavg                        # Windows has no load average either
"""

LEARNER = r"""
import contextlib, importlib, io, json, os, signal, sys, tempfile
import nbformat

blocked = []
for name in sys.argv[1].split(","):
    try:
        importlib.import_module(name)
    except ImportError:
        blocked.append(name)
out = {"blocked": blocked, "sigkill": hasattr(signal, "SIGKILL"),
       "loadavg": hasattr(os, "getloadavg")}

from grpo_lab.training.config import preset
from grpo_lab.training.trainer import train
d = tempfile.mkdtemp()
history = train(preset("tiny_cpu", out_dir=f"{d}/trainer", steps=3, time_budget_s=0,
                       eval_every=0, eval_size=10, threads=1), progress=False)
out["trainer_steps"] = sum("time/step_s" in h for h in history)

from grpo_lab.cli import main
argv = ["train", "--preset", "tiny_cpu", "--steps", "2", "--time_budget_s", "0", "--eval_every",
        "0", "--eval_size", "10", "--out_dir", f"{d}/cli"]     # threads=0: the free cores
out["cli"] = main(argv)
err = io.StringIO()
with contextlib.redirect_stderr(err):
    out["cli_again"] = main(argv)
out["cli_again_err"] = err.getvalue()
out["cli_overwrite"] = main(argv + ["--overwrite"])
out["cli_files"] = sorted(os.listdir(f"{d}/cli"))

text = io.StringIO()
with contextlib.redirect_stdout(text):
    out["preflight"] = main(["preflight", "--steps", "2"])
out["preflight_text"] = text.getvalue()

nb = nbformat.read(os.path.join(sys.argv[2], "00_quickstart.ipynb"), as_version=4)
code = [c.source for c in nb.cells if c.cell_type == "code"]
first_train = next(i for i, src in enumerate(code) if "train(cfg)" in src)
os.chdir(sys.argv[2])
ns = {}
from IPython.core.inputtransformer2 import TransformerManager   # %pip etc., as the kernel reads them
for i, src in enumerate(code[:first_train]):
    src = TransformerManager().transform_cell(src)
    exec(compile(src, f"00_quickstart.ipynb code cell {i}", "exec"), ns)
out["nb00_cells"] = first_train
out["nb00"] = [ns["cfg"].steps, ns["sampled_acc_before"], ns["groups_before"].shape]
print("RESULT " + json.dumps(out))
"""


def test_trainer_cli_preflight_and_notebook_00_run_without_posix_modules(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SHIM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "GRPO_LAB_QUICK": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", LEARNER, ",".join(BLOCKED),
                           str(ROOT / "notebooks")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.loads(line[-1][len("RESULT "):])
    assert out["blocked"] == list(BLOCKED) and out["sigkill"] is out["loadavg"] is False  # shim
    assert out["trainer_steps"] == 3
    assert out["cli"] == 0
    assert out["cli_again"] == 2 and "already holds a run" in out["cli_again_err"], out
    assert out["cli_overwrite"] == 0
    assert {"checkpoint.safetensors", "metrics.jsonl"} <= set(out["cli_files"])
    assert not {".lock", ".lock.held"} & set(out["cli_files"])      # a finished run: no lock
    verdict = out["preflight_text"].strip().splitlines()[-1]
    assert out["preflight"] in (0, 1), out["preflight_text"]
    assert verdict.startswith("OK: ready" if out["preflight"] == 0 else "NOT READY"), verdict
    assert "GRPO steps" in out["preflight_text"]                   # it ran the timed steps
    assert out["nb00_cells"] == 4              # parameters, install-if-missing, imports/config, groups
    steps, acc, shape = out["nb00"]
    assert steps == 300 and 0.0 <= acc <= 1.0 and shape == [4, 8]  # 4 prompts x G=8


def test_torchrun_is_asked_to_handle_only_signals_this_platform_has(monkeypatch):
    """Windows' signal module has SIGINT but no SIGHUP or SIGQUIT: the launcher names only
    the signals that exist (torchrun looks each name up in ``signal``)."""
    import signal

    from torch.distributed import run as torchrun

    from grpo_lab.cli import launch_torchrun
    calls = []
    monkeypatch.setattr(torchrun, "main", lambda argv: calls.append(argv))
    assert launch_torchrun(2, ["train", "--nproc", "2", "--steps", "5"]) == 0
    monkeypatch.delattr(signal, "SIGHUP")
    monkeypatch.delattr(signal, "SIGQUIT")
    assert launch_torchrun(2, ["train", "--nproc=2", "--steps", "5"]) == 0
    handled = [[a for a in argv if a.startswith("--signals_to_handle")] for argv in calls]
    assert handled == [["--signals_to_handle=SIGINT,SIGHUP,SIGQUIT"],
                       ["--signals_to_handle=SIGINT"]]
    assert calls[1][-4:] == ["grpo_lab.cli", "train", "--steps", "5"]


def test_bench_peak_memory_is_nan_without_the_resource_module(monkeypatch):
    import math
    bench = load_script("bench/bench_hf_speed.py")
    here = bench.peak_rss_mb()
    assert 10 < here < 1e6                       # this process holds torch: tens of MB at least
    monkeypatch.setitem(sys.modules, "resource", None)
    assert math.isnan(bench.peak_rss_mb())


def test_threads_0_on_a_machine_without_proc_or_a_load_average(monkeypatch):
    """``threads=0`` (the presets' default) counts free cores from /proc/loadavg, else the load
    average; Windows has neither, and then torch's own default is the answer, not a crash."""
    import torch

    from grpo_lab import machine

    def no_proc(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "/proc/loadavg")
    monkeypatch.setattr(machine, "busy_cores", no_proc)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 1.0, 1.0))          # macOS
    assert machine.free_cores() == max(1, min(torch.get_num_threads(), (os.cpu_count() or 1) - 1))
    monkeypatch.delattr(os, "getloadavg")                                  # Windows
    assert machine.free_cores() == torch.get_num_threads()
