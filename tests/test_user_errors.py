"""Errors from the user's code and data are named, in one line, with exit 2 (issue 20):
held-out files checked against their task with the line number, an exception in a plugin's
reward or estimator named by file, function and step (also under --nproc), values that are
finite but absurd (lr, weight decay, rewards) refused below a documented ceiling, a
non-finite estimator blamed on the estimator, eval's --eval_size checked as train's, and a
learner's infinite loop failing an exercise check instead of hanging it."""
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hangs import assert_ended_in_time

from grpo_lab.teaching import exercises
from grpo_lab.algorithm.advantages import ADVANTAGES, grpo_advantages, register_advantage
from grpo_lab.cli import main
from grpo_lab.training.config import CEILINGS, preset
from grpo_lab.tasks.rewards import REWARD_CEILING, REWARDS, resolve_rewards, weighted_reward
from grpo_lab.tasks import TASKS, Example, register_task
from grpo_lab.tasks.task_data import load_eval
from grpo_lab.training.trainer import train

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["--preset", "quick", "--eval_size", "10", "--threads", "1"]


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [x for x in err.splitlines() if x.startswith("grpo-lab: error")]


# ---- held-out files, checked on registration and on load, with the line

def _triple(rng: random.Random) -> Example:
    a = rng.randrange(10, 100)
    return Example(f"tri:{a}=", str(3 * a), "tri")


GOOD = {"prompt": "tri:12=", "answer": "36", "task": "tri"}


@pytest.mark.parametrize("bad, match", [
    ('[1, 2, 3]', r"rows.jsonl:2: expected an object with prompt, answer and task, got a JSON list"),
    ('{"prompt": "tri:5=", "answer": 15, "task": "tri"}',
     r"rows.jsonl:2: field 'answer' must be a string, got 15 \(int\)"),
    ('{"prompt": "tri:5=", "task": "tri"}', r"rows.jsonl:2: field 'answer' must be a string, got no such field"),
    ('{"prompt": "tri:5=", "answer": "15000", "task": "tri"}',
     r"rows.jsonl:2: answer '15000' has 5 characters; task 'tri' has max_answer_len=3"),
    ('{"prompt": "Tri:5=", "answer": "15", "task": "tri"}',
     r"rows.jsonl:2: prompt 'Tri:5=' has characters \['T'\] outside the task's alphabet"),
    ('{"prompt": "tri:5=", "answer": "15", "task": "double"}',
     r"rows.jsonl:2: held-out example of task 'double' in the set of task 'tri'"),
    ('{"prompt": "tri:5", "answer": "15", "task": "tri"}', r"rows.jsonl:2: prompt 'tri:5' must end with '='"),
    ('{"prompt": "tri:5=", "answer": "15", "task": "tri"', r"rows.jsonl:2: not JSON"),
])
def test_held_out_rows_are_checked_on_registration_with_the_line(tmp_path, monkeypatch, bad, match):
    monkeypatch.delitem(TASKS, "tri", raising=False)
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps(GOOD) + "\n" + bad + "\n")
    with pytest.raises(ValueError, match=match):
        register_task("tri", _triple, "0123456789", 3, eval_file=str(f))
    assert "tri" not in TASKS


def test_held_out_rows_are_checked_again_on_load(tmp_path, monkeypatch):
    monkeypatch.delitem(TASKS, "tri", raising=False)
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps(GOOD) + "\n")
    register_task("tri", _triple, "0123456789", 3, eval_file=str(f))
    assert load_eval("tri") == [Example("tri:12=", "36", "tri")]
    f.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "answer": "3600"}) + "\n")  # edited
    with pytest.raises(ValueError, match=r"rows.jsonl:2: answer '3600' has 4 characters"):
        load_eval("tri")
    monkeypatch.setitem(TASKS, "tri", TASKS["tri"].__class__(
        "tri", _triple, "0123456789", 3, eval_fn=lambda: [Example("tri:1=", "3", "tri"), ("x",)]))
    with pytest.raises(ValueError, match=r"eval_fn\(\) item 1 is \('x',\), not an Example"):
        load_eval("tri")


def test_families_in_words_are_checked_for_what_applies_to_them(monkeypatch):
    import grpo_lab.tasks.instruct  # noqa: F401  (registers countdown and word_problems)
    assert len(load_eval("word_problems")) == 200                  # capitals, no '=': fine
    t = TASKS["word_problems"]
    rows = [Example("Ann has 2 cats. How many?", "2", "word_problems"),
            Example("Ann has 20000 cats. How many?", "20000", "word_problems")]
    monkeypatch.setitem(TASKS, "word_problems", t.__class__(
        t.name, t.make, t.answer_chars, t.max_answer_len, eval_fn=lambda: rows, alphabet=None))
    with pytest.raises(ValueError, match=r"eval_fn\(\) item 1: answer '20000' has 5 characters; "
                                         r"task 'word_problems' has max_answer_len=4"):
        load_eval("word_problems")


# ---- one line and exit 2 for an error in the user's code, naming it and the step

PLUGIN = """
from grpo_lab.tasks.rewards import register_reward

@register_reward("lookup")
def lookup(completions, examples, stopped):
    table = {}
    return [table[c] for c in completions]          # KeyError: the user's bug
"""


def test_an_error_in_a_plugin_is_one_line_naming_file_function_and_step(tmp_path, capsys):
    f = tmp_path / "buggy_plugin.py"
    f.write_text(PLUGIN)
    args = ["train", *QUICK, "--steps", "2", "--plugin", str(f), "--reward_weights",
            "accuracy=1,lookup=1", "--out_dir", str(tmp_path / "run")]
    code = main(args)
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1, err
    assert "KeyError" in lines[0] and "buggy_plugin.py:7 in lookup()" in lines[0]
    assert "before the first step (setup or the first evaluation)" in lines[0]   # step -1's eval
    assert "--debug" in lines[0]
    code = main(args[:-2] + ["--eval_size", "0", "--out_dir", str(tmp_path / "run2")])
    lines = error_lines(capsys.readouterr().err)
    assert code == 2 and "buggy_plugin.py:7 in lookup()" in lines[0] and "at step 0" in lines[0]
    with pytest.raises(KeyError):                                     # --debug: the traceback
        main(args + ["--debug", "--overwrite"])


def test_the_same_exit_code_under_nproc(tmp_path):
    f = tmp_path / "buggy_plugin.py"
    f.write_text(PLUGIN)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    r = subprocess.run([sys.executable, "-m", "grpo_lab.cli", "train", *QUICK, "--steps", "2",
                        "--nproc", "2", "--eval_size", "0", "--plugin", str(f), "--reward_weights",
                        "accuracy=1,lookup=1", "--out_dir", str(tmp_path / "run")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "buggy_plugin.py:7 in lookup()" in r.stderr and "at step 0" in r.stderr


KILLED = """
import os, signal
from grpo_lab.tasks.rewards import register_reward

CALLS = [0]

@register_reward("killed")
def killed(completions, examples, stopped):
    CALLS[0] += 1
    if CALLS[0] == 3 and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)          # the OOM killer, a kill -9
    return [0.0] * len(completions)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL and /proc: Linux")
def test_a_rank_killed_under_nproc_is_named_with_its_signal(tmp_path):
    """A rank killed by a signal prints nothing; its peer's only line is a lost connection in
    grpo_lab's own gather. The launcher's line names the rank and the signal."""
    from grpo_lab.checkpoint import read_training_checkpoint
    f = tmp_path / "killed_plugin.py"
    f.write_text(KILLED)
    mark = f"grpo_lab_test_{os.getpid()}_{time.time_ns()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "GRPO_LAB_TEST_MARK": mark}
    r = subprocess.run([sys.executable, "-m", "grpo_lab.cli", "train", *QUICK, "--steps", "5",
                        "--nproc", "2", "--eval_size", "0", "--ckpt_every", "1",
                        "--dynamic.sampling", "false", "--plugin", str(f),
                        "--reward_weights", "accuracy=1,killed=1",
                        "--out_dir", str(tmp_path / "run")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    assert ("grpo-lab: error: rank 1 of 2 failed first, with exit code -9 (killed by SIGKILL)"
            in r.stderr), r.stderr[-3000:]
    assert read_training_checkpoint(tmp_path / "run" / "checkpoint.safetensors")["step"] == 1
    left = []                                         # no rank outlives the launcher
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if mark.encode() in environ.read_bytes():
                left.append(environ.parent.name)
    assert not left, left


# ---- finite but absurd values

@pytest.mark.parametrize("field", sorted(CEILINGS))
def test_values_above_their_ceiling_are_refused(field, capsys):
    extra = ["--objective", "ppo"] if field == "ppo.vf_lr" else []
    code = main(["train", *QUICK, *extra, f"--{field}", "1e30", "--out_dir", "runs/unused"])
    err = capsys.readouterr().err
    assert code == 2 and f"{field}=1e+30 is above its ceiling 1.0" in err, err
    at = ({"objective": "ppo", "ppo": {"vf_lr": CEILINGS[field]}} if extra
          else {field: CEILINGS[field]})
    assert preset("quick", **at)


def test_huge_rewards_are_refused_naming_the_function(monkeypatch):
    monkeypatch.setitem(REWARDS, "huge",
                        lambda c, e, s: [3e38] * len(c))
    ex = [Example("1+1=", "2", "addition")] * 2
    with pytest.raises(ValueError, match=r"reward function 'huge' returned 3e\+38 for sample 0 "
                                         r".*beyond the ceiling \|reward\| <= 1e\+06"):
        weighted_reward(["2", "3"], ex, resolve_rewards({"huge": 1.0}))
    ok, _ = weighted_reward(["2", "3"], ex, resolve_rewards({"accuracy": REWARD_CEILING}))
    assert ok.tolist() == [REWARD_CEILING, 0.0]
    with pytest.raises(ValueError, match=r"weighted reward of sample 0 is 2e\+06"):
        weighted_reward(["2", "3"], ex, resolve_rewards({"accuracy": 2 * REWARD_CEILING}))


def test_a_non_finite_estimator_is_named(tmp_path, monkeypatch):
    def nan_estimator(rewards, group_ids):
        return grpo_advantages(rewards, group_ids) * float("nan")
    monkeypatch.delitem(ADVANTAGES, "nan_estimator", raising=False)
    register_advantage("nan_estimator", nan_estimator)
    try:
        with pytest.raises(FloatingPointError, match=r"advantage estimator 'nan_estimator' "
                                                     r"\(combine 'cluster'\) returned nan for "
                                                     r"sample 0 .*from finite rewards") as e:
            train(preset("quick", advantage="nan_estimator", steps=2, eval_size=0, threads=1,
                         out_dir=str(tmp_path)), progress=False)
        assert "at step 0" in e.value.__notes__
    finally:
        ADVANTAGES.pop("nan_estimator", None)


def test_eval_size_is_checked_as_train_checks_it(capsys):
    code = main(["eval", "--eval_size", "100000"])
    err = capsys.readouterr().err
    assert code == 2 and "--eval_size 100000 but the held-out set of 'addition' has 200 " \
                         "examples; use at most 200" in err


# ---- an exercise check with a time limit

def test_an_infinite_loop_fails_the_check_instead_of_hanging(monkeypatch, capsys):
    monkeypatch.setattr(exercises, "TIME_LIMIT_S", 0.3)

    def forever(rewards, group_ids):
        while True:
            pass
    assert exercises.check_advantages(forever) is False
    out = capsys.readouterr().out
    assert "did not return within 0.3 s" in out and "infinite loop" in out
    assert exercises.check_advantages(grpo_advantages) is True         # the limit is per call



def test_a_stop_with_an_endless_grace_keeps_the_watchdog_alive():
    """A notebook's grace is inf: after a stop the watchdog waits for the next arming with no
    timeout (a timeout of inf overflowed the lock's wait and killed its thread)."""
    from grpo_lab import timelimit
    with pytest.raises(timelimit.UserCodeTimeout, match="'spin' did not return within 0.2 s"):
        with timelimit.user_code("'spin'", limit_s=0.2, grace_s=math.inf):
            while True:
                pass
    time.sleep(0.2)                                  # the watchdog's next wait has begun
    assert timelimit._WATCHDOG.thread.is_alive()
    with pytest.raises(timelimit.UserCodeTimeout):   # and it still stops the next call
        with timelimit.user_code("'spin again'", limit_s=0.2, grace_s=math.inf):
            while True:
                pass


FREEZE = """
import os, time
from pathlib import Path
from grpo_lab.tasks.rewards import register_reward

@register_reward("freeze")
def freeze(completions, examples, stopped):
    if os.environ.get("RANK") == "1":              # rank 1 hangs in the user's code
        Path(__file__).with_suffix(".frozen").write_text(str(time.time()))
        while True:
            time.sleep(0.05)
    return [0.0] * len(completions)
"""


def test_a_frozen_rank_is_stopped_within_the_timeout(tmp_path):
    """torchrun SIGTERMs the survivors when rank 0's collective times out: the frozen rank must
    die then (SIGTERM keeps its default action on several processes), not 30 s later."""
    # rank 0 reaches its collective, waits timeout_s, fails; torchrun then SIGTERMs rank 1 and
    # tears down (a few seconds on a loaded machine). Before, rank 1 survived SIGTERM and
    # torchrun waited 30 s more before SIGKILL: the bound tells the two apart
    _rank_1_stuck_ends_the_run(tmp_path, FREEZE, "freeze", ".frozen")


def _rank_1_stuck_ends_the_run(tmp_path, plugin: str, reward: str, marker: str,
                               timeout_s: int = 8) -> None:
    """A 2-process run whose plugin reward ``reward`` gets rank 1 stuck (it writes the time to
    the plugin's ``marker`` file first): exit 2 with the collective's timeout at step 0, within
    ``timeout_s`` + 5 s + half the run's start-up of rank 1 getting stuck (hangs.py)."""
    f = tmp_path / f"{reward}_plugin.py"
    f.write_text(plugin)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    started = time.time()
    r = subprocess.run([sys.executable, "-m", "grpo_lab.cli", "train", *QUICK, "--steps", "5",
                        "--nproc", "2", "--eval_size", "0", "--plugin", str(f),
                        "--exchange.timeout_s", str(timeout_s), "--reward_weights",
                        f"accuracy=1,{reward}=1", "--out_dir", str(tmp_path / "run")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    ended = time.time()
    stuck_at = float(f.with_suffix(marker).read_text())
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Timed out" in r.stderr and "at step 0" in r.stderr
    # the calibration: this run's own start-up (torchrun, 2 ranks importing torch, the first
    # rollout), timed here; tearing down is about half that work. Idle (AMD EPYC, 2 cores):
    # start-up 6-15 s, stuck -> end timeout_s + 5 s; torchrun's 30 s before SIGKILL, the
    # failure this guards against, is past the bound while start-up is under 30 s
    assert_ended_in_time(stuck_at, ended, timeout_s, 5.0, stuck_at - started, k=0.5)


# ---- a time limit on each call of user code during training (timelimit.py)

HANG = """
import os, time
from grpo_lab.tasks.rewards import register_reward

CALLS = [0]

@register_reward("hangs")
def hangs(completions, examples, stopped):
    CALLS[0] += 1
    if CALLS[0] > 4 and os.environ.get("RANK", "0") == "0":
        open(__file__ + ".at", "w").write(repr(time.time()))
    while CALLS[0] > 4:              # the fifth call never returns
        pass
    return [0.0] * len(completions)
"""


def test_a_looping_call_is_stopped_where_it_loops_and_named():
    from grpo_lab.errors import one_line
    from grpo_lab.timelimit import UserCodeTimeout, user_code

    def forever():
        while True:
            try:
                while True:
                    pass
            except Exception:        # a broad except in user code cannot swallow the stop
                pass
    t0 = time.monotonic()
    with pytest.raises(UserCodeTimeout) as e:
        with user_code("reward function 'forever'", 0.3):
            forever()
    assert time.monotonic() - t0 < 0.3 + 2.0
    line = one_line(e.value)
    assert "reward function 'forever' did not return within 0.3 s" in line
    assert "test_user_errors.py:" in line and "in forever()" in line
    for _ in range(3):               # disarmed: later calls run to the end, however long
        with user_code("reward function 'quick'", 0.3):
            time.sleep(0.01)
    time.sleep(0.5)                  # nothing lands after the block


AFTER_STOPS = r"""
import sys, time
from grpo_lab.timelimit import UserCodeTimeout, user_code
stopped = 0
for i in range(80):                  # stops landing in the loop, and just as the block ends
    try:
        with user_code("reward function 'edge'", 0.02):
            end = time.monotonic() + 0.02 + 0.004 * (i % 4 - 1)
            while time.monotonic() < end:
                pass
    except UserCodeTimeout:
        stopped += 1
def f():
    return 1
sys.settrace(lambda *a: None)        # a debugger, coverage: the next call must return
assert f() == 1
sys.settrace(None)
print("stopped", stopped)
"""


def test_after_a_stop_a_traced_call_still_returns():
    """The watchdog never takes a stop back with PyThreadState_SetAsyncExc(id, NULL): on
    CPython 3.11 that left the eval breaker set, and the next call under sys.settrace looped
    forever (the in-process step trace after this file's tests: over 30 minutes)."""
    r = subprocess.run([sys.executable, "-c", AFTER_STOPS], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.split()[-1]) >= 20, r.stdout        # the stops did happen


def test_a_call_blocked_outside_python_ends_the_process_after_the_grace():
    """From the start: the limit, the grace, and twice the same interpreter's start-up and
    imports timed here (the calibration); a call left running sleeps 60 s."""
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import grpo_lab.timelimit"], cwd=ROOT, check=True)
    start_up = time.time() - t0
    code = ("import time; from grpo_lab.timelimit import user_code\n"
            "with user_code(\"reward function 'sleeps'\", 0.3, grace_s=0.5):\n"
            "    time.sleep(60)\n")
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert_ended_in_time(t0, time.time(), 0.3, 0.5, start_up, k=2)
    assert "reward function 'sleeps' did not return within 0.3 s" in r.stderr
    assert "did not stop within 0.5 s more" in r.stderr


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_plugin_that_loops_forever_stops_every_rank_and_keeps_the_checkpoint(tmp_path, nproc):
    from grpo_lab.checkpoint import read_training_checkpoint
    f = tmp_path / "hang_plugin.py"
    f.write_text(HANG)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    limit = 3
    started = time.time()
    r = subprocess.run([sys.executable, "-m", "grpo_lab.cli", "train", *QUICK, "--steps", "8",
                        "--nproc", str(nproc), "--eval_size", "0", "--ckpt_every", "1",
                        "--dynamic.sampling", "false", "--plugin", str(f), "--reward_weights",
                        "accuracy=1,hangs=1", "--user_code_timeout_s", str(limit),
                        "--out_dir", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    ended, stuck_at = time.time(), float(Path(f"{f}.at").read_text())
    assert r.returncode == 2, r.stderr[-3000:]
    assert "reward function 'hangs' on" in r.stderr
    assert f"did not return within {limit} s" in r.stderr
    assert "hang_plugin.py:12 in hangs()" in r.stderr and "at step 4" in r.stderr, r.stderr[-3000:]
    # the checkpoint of the last finished step (3) is whole and loads
    assert read_training_checkpoint(out / "checkpoint.safetensors")["step"] == 3
    # the loop is stopped at the limit: from its start, the limit, the watchdog's grace and
    # half the run's own start-up and 4 steps (timed here) at most; a loop left running
    # would last until subprocess's 300 s
    from grpo_lab.timelimit import GRACE_S
    assert_ended_in_time(stuck_at, ended, limit, GRACE_S, stuck_at - started, k=0.5)


# ---- flags that used to be accepted and silently ignored

@pytest.mark.parametrize("flags, msg", [
    (["--hf.dtype", "bfloat16"], "hf.dtype='bfloat16' configures a transformers model, but "
                                 "policy='toy' does not read it"),
    (["--system_prompt", "You add."], "system_prompt='You add.'... is a system turn of a chat "
                                      "template: it needs policy='hf' with hf.chat_template=True"),
    (["--policy", "hf", "--base_checkpoint", "data/hf_tiny", "--hf.lora_alpha", "16"],
     "hf.lora_alpha=16 scales LoRA adapters, but hf.lora_r is 0"),
    (["--preset", "smollm_cpu", "--hf.chat_template", "false"],
     "a preset's own prompt is dropped with system_prompt=''"),
])
def test_a_flag_the_run_would_ignore_is_an_error(flags, msg, capsys):
    code = main(["train", *QUICK, *flags, "--out_dir", "runs/unused"])
    err = capsys.readouterr().err
    assert code == 2 and msg in err, err


def test_a_reward_returning_none_and_a_short_estimator_are_named(monkeypatch):
    monkeypatch.setitem(REWARDS, "nothing", lambda c, e, s: None)
    ex = [Example("1+1=", "2", "addition")] * 2
    with pytest.raises(ValueError, match=r"reward function 'nothing' returned None, not a list "
                                         r"of 2 numbers"):
        weighted_reward(["2", "3"], ex, resolve_rewards({"nothing": 1.0}))
    from grpo_lab.algorithm.advantages import grouped_advantages
    monkeypatch.setitem(ADVANTAGES, "first_only", lambda r, g: r[:1])
    with pytest.raises(ValueError, match=r"advantage estimator 'first_only' \(combine 'cluster'\) "
                                         r"returned \(1,\) for \(4,\) rewards"):
        grouped_advantages([0, 1], torch.tensor([0, 0, 1, 1]), torch.tensor([1., 0, 1, 0]),
                           "cluster", "first_only")


STOPPED = """
import os, signal, time
from pathlib import Path
from grpo_lab.tasks.rewards import register_reward

@register_reward("stops")
def stops(completions, examples, stopped):
    if os.environ.get("RANK") == "1":              # rank 1 is stopped (Ctrl-Z, a debugger)
        Path(__file__).with_suffix(".stopped").write_text(str(time.time()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return [0.0] * len(completions)
"""


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGSTOP"), reason="POSIX signals")
def test_a_stopped_rank_ends_with_the_run_not_30_s_later(tmp_path):
    """A SIGSTOPped rank cannot act on torchrun's SIGTERM, and torchrun waited 30 s before its
    SIGKILL (63.6 s at timeout 30); the failing rank now resumes its local peers first."""
    _rank_1_stuck_ends_the_run(tmp_path, STOPPED, "stops", ".stopped")


def test_only_user_code_is_guarded(monkeypatch):
    # the package's own rewards, groupers, estimators and tasks run without the watchdog; a
    # function defined outside grpo_lab (here, in a test) is guarded
    from grpo_lab import timelimit
    from grpo_lab.algorithm.advantages import ADVANTAGES
    from grpo_lab.tasks.rewards import REWARDS
    armed = []
    monkeypatch.setattr(timelimit, "user_code", lambda what: armed.append(what) or
                        contextlib.nullcontext())
    with timelimit.guarded("builtins", REWARDS["accuracy"], ADVANTAGES["grpo"]):
        pass
    assert armed == []

    def mine(completions, examples, stopped):
        return [0.0] * len(completions)
    with timelimit.guarded("reward function 'mine'", REWARDS["accuracy"], mine):
        pass
    assert armed == ["reward function 'mine'"]


def test_a_reward_that_edits_its_inputs_changes_no_other_reward(monkeypatch):
    def strips(completions, examples, stopped):      # a learner's normalising, in place
        completions[:] = [c + "!" for c in completions]
        stopped[:] = [False] * len(stopped)
        examples.clear()
        return [0.0] * len(completions)
    monkeypatch.setitem(REWARDS, "strips", strips)
    ex = [Example("1+1=", "2", "addition"), Example("1+2=", "3", "addition")]
    completions = ["2", "4"]
    total, parts = weighted_reward(completions, ex, resolve_rewards({"strips": 1.0,
                                                                      "accuracy": 1.0}))
    assert parts["accuracy"].tolist() == [1.0, 0.0] and total.tolist() == [1.0, 0.0]
    assert completions == ["2", "4"] and len(ex) == 2            # the caller's lists as given


def test_a_reward_returning_a_dict_or_strings_is_named(monkeypatch):
    ex = [Example("1+1=", "2", "addition"), Example("1+2=", "3", "addition")]
    monkeypatch.setitem(REWARDS, "as_dict", lambda c, e, s: {i: 0.5 for i in range(len(c))})
    with pytest.raises(ValueError, match=r"reward function 'as_dict' returned \{0: 0.5, 1: 0.5\}, "
                                         r"not a list of 2 numbers"):    # its keys read 0, 1
        weighted_reward(["2", "4"], ex, resolve_rewards({"as_dict": 1.0}))
    monkeypatch.setitem(REWARDS, "as_set", lambda c, e, s: {0.0, 1.0})
    with pytest.raises(ValueError, match=r"reward function 'as_set' returned \{0.0, 1.0\}, not a"):
        weighted_reward(["2", "4"], ex, resolve_rewards({"as_set": 1.0}))
    monkeypatch.setitem(REWARDS, "echo", lambda c, e, s: c)      # the completions, not scores
    with pytest.raises(ValueError, match=r"reward function 'echo' returned '2' for sample 0 "
                                         r"\(completion '2'\), not a number"):
        weighted_reward(["2", "4"], ex, resolve_rewards({"echo": 1.0}))
    monkeypatch.setitem(REWARDS, "values", lambda c, e, s: {"a": 1.0, "b": 0.0}.values())
    assert weighted_reward(["2", "4"], ex, resolve_rewards({"values": 1.0}))[0].tolist() == \
        [1.0, 0.0]                                                   # ordered values still read


def test_an_estimator_of_integers_is_named_and_one_centring_in_place_keeps_the_rewards(
        monkeypatch):
    from grpo_lab.algorithm.advantages import grouped_advantages
    rewards = torch.tensor([1., 0, 1, 1])
    monkeypatch.setitem(ADVANTAGES, "signs", lambda r, g: (r > 0.5).long() * 2 - 1)
    with pytest.raises(ValueError, match=r"advantage estimator 'signs' \(combine 'cluster'\) "
                                         r"returned a torch.int64 tensor: advantages must be "
                                         r"floating point"):
        grouped_advantages([0, 1], torch.tensor([0, 0, 1, 1]), rewards, "cluster", "signs")

    def centres(r, g):                               # a learner's in-place centring
        r -= r.mean()
        return r
    monkeypatch.setitem(ADVANTAGES, "centres", centres)
    adv = grouped_advantages([0, 1], torch.tensor([0, 0, 1, 1]), rewards, "cluster", "centres")
    assert adv.tolist() == [0.25, -0.75, 0.25, 0.25] and rewards.tolist() == [1., 0, 1, 1]
