"""A study stops and resumes cleanly: kill -9 or SIGINT of `grpo-lab study` leaves no worker
running, a SIGINT stops at once without a traceback, each stopped run resumes from its own
last checkpoint to exactly the run never stopped (metrics, samples and final weights), --keep
decides which checkpoints stay, --plan stops after the pilot, a pilot whose seeds agree has a
fallback, a corrupt study file is named, and samples.jsonl holds every reward part."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_lab.checkpoint import read_tensors
from grpo_lab.cli import main
from grpo_lab.training.experiments import run_experiment

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"by_prompt": {}, "random": {"grouping": "random", "group": {"k": 2}}}
# one thread everywhere: a run resumed with another thread count sums in another order
BASE = {"prompts_per_step": 4, "group_size": 4, "eval_every": 4, "eval_size": 10,
        "ckpt_every": 3, "steps": 10, "threads": 1}
ARGV = ["study", "--base", "quick", "--arm", "by_prompt", "--arm", "random", "grouping=random",
        "group.k=2", "--set", "prompts_per_step=4", "group_size=4", "eval_every=4",
        "eval_size=10", "ckpt_every=3", "threads=1", "--steps", "10", "--seeds", "2",
        "--processes", "2", "--pilot_steps", "0", "--keep", "final"]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads the process table from /proc")


def no_time(history):
    return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat[stat.rindex(")") + 2:].split()          # after "(comm)": state ppid
        if fields[1] == str(pid) and fields[0] != "Z":
            out.append(int(d.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def start_study(out: Path, *extra) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "grpo_lab.cli", *ARGV, "--out_dir",
                             str(out), *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_a_checkpoint_mid_run(proc, out: Path) -> list[int]:
    """Wait until some run holds a checkpoint and has no result yet -> the workers' pids."""
    deadline = time.monotonic() + 600          # a guard against a hang, not a speed check
    while time.monotonic() < deadline and proc.poll() is None:
        mid = [c for c in out.glob("runs/*/seed*/checkpoint.safetensors")
               if not (c.parent / "result.json").exists()]
        kids = children(proc.pid)
        if mid and len(kids) == 2:
            return kids
        time.sleep(0.02)
    raise AssertionError(f"no run was caught mid-way: {proc.communicate()}")


def never_stopped(out: Path):
    return run_experiment(ARMS, seeds=(0, 1), base_preset="quick", base=BASE, processes=1,
                          progress=False, out_dir=str(out), keep="final")


def assert_same_as_never_stopped(out: Path, never):
    resumed = run_experiment(ARMS, seeds=(0, 1), base_preset="quick", base=BASE,
                             out_dir=str(out), resume=True, progress=False)   # read back
    for a, b in zip(resumed.runs, never.runs):
        assert (a["strategy"], a["seed"]) == (b["strategy"], b["seed"])
        assert no_time(a["history"]) == no_time(b["history"])


@linux_only
def test_kill_9_of_a_study_leaves_no_worker_and_each_run_resumes_from_its_checkpoint(tmp_path):
    out = tmp_path / "study"
    proc = start_study(out)
    workers = wait_for_a_checkpoint_mid_run(proc, out)
    proc.kill()                                               # SIGKILL: the study cannot act
    proc.wait()
    deadline = time.monotonic() + 60
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in workers), workers        # no worker left training
    stopped = [c.parent for c in out.glob("runs/*/seed*/checkpoint.safetensors")
               if not (c.parent / "result.json").exists()]
    assert stopped
    assert main(ARGV + ["--out_dir", str(out), "--resume", "--processes", "1"]) == 0
    for folder in stopped:                      # resumed from its own checkpoint, not step 0
        found = json.loads((folder / "result.json").read_text())["findings"]
        assert found[0].startswith("resumed from its checkpoint: steps "), found
        assert not found[0].startswith("resumed from its checkpoint: steps 0-")
    again = tmp_path / "again"
    assert_same_as_never_stopped(out, never_stopped(again))
    # bit-identical to a study never stopped: samples and the final weights too
    for folder in out.glob("runs/*/seed*"):
        twin = again / folder.relative_to(out)
        assert (folder / "samples.jsonl").read_text() == (twin / "samples.jsonl").read_text()
        (a, _), (b, _) = (read_tensors(folder / "checkpoint.safetensors"),
                          read_tensors(twin / "checkpoint.safetensors"))
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


@linux_only
def test_sigint_stops_the_study_at_once_without_a_traceback(tmp_path):
    out = tmp_path / "study"
    proc = start_study(out, "--keep", "none")
    workers = wait_for_a_checkpoint_mid_run(proc, out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "Traceback" not in err, err
    assert "study stopped (SIGINT received)" in err and err.rstrip().endswith("--resume"), err
    assert not any(alive(p) for p in workers)                 # killed before the study left
    assert not list(out.glob("runs/*/seed*/result.json.*")), "a half-written result"
    assert main(ARGV + ["--out_dir", str(out), "--resume", "--processes", "1",
                        "--keep", "none"]) == 0
    assert not list(out.glob("runs/*/seed*/checkpoint.safetensors"))   # --keep none
    assert_same_as_never_stopped(out, never_stopped(tmp_path / "again"))


def test_keep_decides_which_checkpoints_stay_and_plan_stops_after_the_pilot(tmp_path, capsys):
    small = {**BASE, "steps": 2, "eval_every": 2}
    sizes = {}
    for keep in ("none", "final", "all"):
        res = run_experiment({"a": {}}, seeds=(0, 1), base_preset="quick", base=small,
                             out_dir=str(tmp_path / keep), keep=keep, pilot_steps=1,
                             progress=False)
        runs = sorted((tmp_path / keep).glob("runs/a/seed*/checkpoint.safetensors"))
        pilots = sorted((tmp_path / keep).glob("pilot/seed*/checkpoint.safetensors"))
        assert (len(runs), len(pilots)) == {"none": (0, 0), "final": (2, 0), "all": (2, 2)}[keep]
        sizes[keep] = res.disk
    assert sizes["none"]["checkpoint_bytes"] == 0 < sizes["final"]["checkpoint_bytes"]
    # a checkpoint holds the weights, Adam's state and the run's history (a few bytes more
    # for a longer run): two runs' kept, or the same plus two pilots'
    one = sizes["none"]["checkpoint_would_be"]
    assert sizes["final"]["checkpoint_bytes"] == pytest.approx(2 * one, rel=1e-3)
    assert sizes["all"]["checkpoint_bytes"] == pytest.approx(4 * one, rel=1e-2)
    with pytest.raises(ValueError, match="unknown keep 'some'"):
        run_experiment({"a": {}}, base=small, keep="some", progress=False)
    capsys.readouterr()
    plan_dir = tmp_path / "plan"
    assert main(["study", "--base", "quick", "--arm", "a", "--set", "prompts_per_step=4",
                 "group_size=4", "eval_size=10", "--steps", "5", "--seeds", "3",
                 "--pilot_steps", "1", "--processes", "1", "--plan",
                 "--out_dir", str(plan_dir)]) == 0
    said = capsys.readouterr().out
    assert "cost here:" in said and "can detect:" in said
    assert not (plan_dir / "study.json").exists() and not (plan_dir / "runs").exists()


def test_a_pilot_whose_seeds_agree_exactly_falls_back_to_a_stated_sd(tmp_path):
    # one step of the toy leaves the greedy evaluation where it was on every seed: sd 0
    res = run_experiment({"a": {}}, seeds=(0, 1, 2), base_preset="quick",
                         base={**BASE, "steps": 4}, pilot_steps=1, plan_only=True,
                         progress=False, out_dir=str(tmp_path / "s"))
    plan = res.plan
    assert plan["pilot_sd"] == 0.0
    # the fallback: a per-run binomial sd at p = 0.5 on eval_size=10 items, sqrt(2) for a
    # difference: sqrt(2 * 0.25 / 10) = 0.2236
    assert plan["sd"] == pytest.approx((2 * 0.25 / 10) ** 0.5, rel=1e-12)
    assert "agree exactly" in " ".join(plan["lines"]) and plan["detectable"] > 0


def test_corrupt_study_files_are_named_with_their_path(tmp_path, capsys):
    small = {**BASE, "steps": 2, "eval_every": 2}
    argv = ["study", "--base", "quick", "--arm", "a", "--set", "prompts_per_step=4",
            "group_size=4", "eval_every=2", "eval_size=10", "--steps", "2", "--seeds", "1",
            "--pilot_steps", "0", "--processes", "1", "--out_dir", str(tmp_path / "s")]
    assert main(argv) == 0
    result = tmp_path / "s" / "runs" / "a" / "seed0" / "result.json"
    result.write_text('{"history": [')
    capsys.readouterr()
    assert main(argv + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert f"{result} is not valid JSON" in err and "delete it and resume" in err
    spec = tmp_path / "s" / "study.json"
    spec.write_bytes(b"\xff\xfe{")
    assert main(argv + ["--resume"]) == 2
    assert f"{spec} is not valid JSON" in capsys.readouterr().err
    with pytest.raises(ValueError, match=f"{spec} is not valid JSON"):
        run_experiment({"a": {}}, seeds=(0,), base_preset="quick", base=small,
                       out_dir=str(tmp_path / "s"), resume=True, progress=False)


def test_samples_hold_every_reward_part_a_plugin_included(tmp_path):
    plugin = tmp_path / "bonus.py"
    plugin.write_text("from grpo_lab.tasks.rewards import register_reward\n"
                      "@register_reward('bonus_quarter')\n"
                      "def bonus_quarter(completions, examples, stopped):\n"
                      "    return [0.25 for _ in completions]\n")
    res = run_experiment({"a": {}}, seeds=(0,), base_preset="quick", out_dir=str(tmp_path / "s"),
                         base={**BASE, "steps": 2, "eval_every": 2, "plugins": str(plugin),
                               "reward_weights": {"accuracy": 1.0, "bonus_quarter": 2.0}},
                         progress=False)
    assert res.runs
    lines = [json.loads(x) for x in
             (tmp_path / "s" / "runs" / "a" / "seed0" / "samples.jsonl").read_text().splitlines()]
    for line in lines:
        for s in line["samples"]:
            parts = {k: v for k, v in s.items() if k.startswith("reward/")}
            assert parts == {"reward/accuracy": pytest.approx(s["accuracy"], abs=1e-4),
                             "reward/bonus_quarter": 0.25}
            assert s["reward"] == pytest.approx(s["accuracy"] + 2 * 0.25, abs=1e-6)


def test_fork_is_refused_for_a_worker_of_several_threads():
    # libgomp's thread team does not survive a fork: a 2-thread worker forked after this
    # process ran torch on 2 threads waited for ever on the team's barrier
    with pytest.raises(ValueError, match="start_method='fork' with threads=2 per worker can "
                                         "hang in OpenMP"):
        run_experiment({"a": {}}, seeds=(0,), base={**BASE, "threads": 2}, processes=1,
                       in_process=False, start_method="fork", progress=False)
