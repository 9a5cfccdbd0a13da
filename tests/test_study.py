"""Studies: the paired t-test's power worked by hand; a study keeps its runs' folders,
evaluates the shared base once, runs the same under spawn as here, resumes after a SIGKILL to
the same results as a study never killed, flags mixed plugin versions, refuses unpaired arms,
forecasts its cost and power; the CLI's arm syntax."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_lab.cli import main
from grpo_lab.training.experiments import Results, run_experiment
from grpo_lab.training.power import detectable_difference, paired_power, seeds_needed
from grpo_lab.cli import study_arms as arms

TINY = {"steps": 3, "prompts_per_step": 4, "group_size": 4, "eval_every": 2, "eval_size": 10,
        "ckpt_every": 10}
STRATEGIES = {"by_prompt": {}, "random": {"grouping": "random", "group": {"k": 2}}}
ROOT = Path(__file__).resolve().parents[1]


def no_time(history):
    return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]


def test_paired_t_power_by_hand():
    # Guenther's normal approximation with the t correction, delta = sd, 80%, alpha 0.05:
    # (1.959964 + 0.841621)^2 + 1.959964^2 / 2 = 7.849 + 1.921 = 9.770 -> 10 seeds
    assert seeds_needed(1.0, 1.0) == 10
    assert paired_power(1.0, 1.0, 10) == pytest.approx(0.8031, abs=2e-4)   # G*Power's table
    assert paired_power(1.0, 1.0, 9) < 0.8                                  # 9 is not enough
    d = detectable_difference(1.0, 10)
    assert d < 1.0 and paired_power(d, 1.0, 10) == pytest.approx(0.8, abs=1e-9)
    # 3 seeds: t(0.975, 2) = 4.303, so far more than the normal approximation's
    # 2.802 / sqrt(3 - 1.921) = 2.697 standard deviations
    d3 = detectable_difference(1.0, 3)
    assert 2.697 < d3 == pytest.approx(3.2640, abs=1e-3)
    assert detectable_difference(0.04, 3) == pytest.approx(0.04 * d3, rel=1e-6)  # scales with sd
    assert seeds_needed(d3 + 1e-3, 1.0) == 3 and seeds_needed(d3 - 1e-3, 1.0) == 4
    with pytest.raises(ValueError, match="must be a positive number, got 0"):
        detectable_difference(0, 3)
    with pytest.raises(ValueError, match="at least 2 seeds, got n=1"):
        paired_power(0.1, 1.0, 1)
    with pytest.raises(ValueError, match="non-zero number, got 0"):
        seeds_needed(0, 1.0)


def test_spawn_runs_equal_in_process_runs_and_each_run_keeps_its_folder(tmp_path):
    # one thread each way (a sequential run would get 2 on 2 cores, and sum in another order)
    kw = dict(seeds=(0, 1), base={**TINY, "threads": 1}, progress=False)
    spawned = run_experiment(STRATEGIES, processes=2, start_method="spawn",
                             out_dir=str(tmp_path / "spawn"), keep="final", **kw)
    here = run_experiment(STRATEGIES, processes=1, **kw)
    for a, b in zip(spawned.runs, here.runs):
        assert (a["strategy"], a["seed"]) == (b["strategy"], b["seed"])
        assert no_time(a["history"]) == no_time(b["history"])
    run = tmp_path / "spawn" / "runs" / "random" / "seed1"
    for f in ("metrics.jsonl", "samples.jsonl", "report.md", "checkpoint.safetensors",
              "result.json"):
        assert (run / f).exists(), f
    base = json.loads((tmp_path / "spawn" / "base.json").read_text())
    assert len(base) == 1                          # one setting: evaluated once, not 4 times
    row = next(iter(base.values()))
    assert all({k: r["history"][0][k] for k in row} == row for r in spawned.runs)
    assert spawned.grid == [0, 2, 3]                # the base, step 2, the last step
    assert here.out_dir is None and spawned.runs[0]["out_dir"].endswith("by_prompt/seed0")
    # read back from the folder alone: the same runs, the same grid; an unfinished run named
    read = Results.from_folder(tmp_path / "spawn")
    assert [no_time(r["history"]) for r in read.runs] == [no_time(r["history"])
                                                          for r in spawned.runs]
    assert read.grid == [0, 2, 3] and read.notes == []
    (run / "result.json").unlink()
    assert Results.from_folder(tmp_path / "spawn").notes == ["not finished: random seed 1"]


def test_a_killed_study_resumes_to_the_results_of_one_never_killed(tmp_path):
    out = tmp_path / "study"
    argv = ["study", "--base", "quick", "--arm", "by_prompt", "--arm", "random",
            "grouping=random", "group.k=2", "--set", "prompts_per_step=4", "group_size=4",
            "eval_every=2", "eval_size=10", "--steps", "3", "--seeds", "2",
            "--processes", "1", "--pilot_steps", "0", "--out_dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "grpo_lab.cli", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = lambda: sorted(out.glob("runs/*/seed*/result.json"))   # noqa: E731
    deadline = time.monotonic() + 300
    while not results() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)                  # mid-way: after its first finished run
    proc.wait()
    assert 1 <= len(results()) < 4, results()
    assert main(argv) == 2                           # a study is there: --resume, or elsewhere
    assert main(argv + ["--resume"]) == 0
    resumed = run_experiment({"by_prompt": {}, "random": {"grouping": "random", "group": {"k": 2}}},
                             seeds=(0, 1), base_preset="quick", out_dir=str(out), resume=True,
                             progress=False,
                             base={"prompts_per_step": 4, "group_size": 4, "eval_every": 2,
                                   "eval_size": 10, "steps": 3})    # all finished: read back
    never = run_experiment({"by_prompt": {}, "random": {"grouping": "random", "group": {"k": 2}}},
                           seeds=(0, 1), base_preset="quick", processes=1, progress=False,
                           base={"prompts_per_step": 4, "group_size": 4, "eval_every": 2,
                                 "eval_size": 10, "steps": 3})
    assert resumed.per_run() == never.per_run()
    for a, b in zip(resumed.runs, never.runs):
        assert no_time(a["history"]) == no_time(b["history"])
    assert "random - by_prompt on eval/accuracy" in (out / "results.md").read_text()
    with pytest.raises(ValueError, match="cannot resume the study .*seeds: saved \\[0, 1\\], "
                                         "given \\[1\\]"):
        run_experiment({"by_prompt": {}, "random": {"grouping": "random", "group": {"k": 2}}},
                       seeds=(1,), base_preset="quick", out_dir=str(out), resume=True,
                       progress=False, base={"prompts_per_step": 4, "group_size": 4,
                                             "eval_every": 2, "eval_size": 10, "steps": 3})
    # a study grows by seeds: the finished runs are read back as they are, the new seed runs
    first = {f: f.stat().st_mtime_ns for f in results()}
    grown = run_experiment({"by_prompt": {}, "random": {"grouping": "random", "group": {"k": 2}}},
                           seeds=(0, 1, 2), base_preset="quick", out_dir=str(out), resume=True,
                           progress=False, processes=1,
                           base={"prompts_per_step": 4, "group_size": 4, "eval_every": 2,
                                 "eval_size": 10, "steps": 3})
    assert {f: f.stat().st_mtime_ns for f in first} == first and len(results()) == 6
    assert grown.per_run()[:2] == resumed.per_run()[:2] and len(grown.runs) == 6


def test_mixed_plugin_versions_in_one_study_are_flagged(tmp_path):
    plugin = tmp_path / "my_reward.py"
    code = ("from grpo_lab.tasks.rewards import register_reward\n"
            "@register_reward('tiny_bonus')\n"
            "def tiny_bonus(completions, examples, stopped):\n"
            "    return [{v} for _ in completions]\n")
    plugin.write_text(code.format(v=0.0))
    kw = dict(seeds=(0, 1), processes=1, progress=False, out_dir=str(tmp_path / "s"),
              base={**TINY, "plugins": str(plugin),
                    "reward_weights": {"accuracy": 1.0, "tiny_bonus": 1.0}})
    first = run_experiment({"a": {}}, **kw)
    assert first.notes == []
    plugin.write_text(code.format(v=0.5))             # edited between runs of one study
    (tmp_path / "s" / "runs" / "a" / "seed1" / "result.json").unlink()
    with pytest.warns(RuntimeWarning, match="mixed plugin versions in one study"):
        again = run_experiment({"a": {}}, resume=True, **kw)
    assert "a seed 0" in again.notes[0] and "a seed 1" in again.notes[0]


def test_unpaired_arms_are_refused_and_the_pilot_forecasts(tmp_path, capsys):
    with pytest.raises(ValueError, match="strategy 'coarse' has eval_every=3 where 'by_prompt' "
                                         "has 2"):
        run_experiment({"by_prompt": {}, "coarse": {"eval_every": 3}}, base=TINY,
                       progress=False)
    with pytest.raises(ValueError, match="target_accuracy=0.5.*pass target="):
        run_experiment({"a": {"target_accuracy": 0.5}}, base=TINY, progress=False)
    with pytest.raises(ValueError, match="resume=True continues the study in out_dir"):
        run_experiment({"a": {}}, base=TINY, resume=True, progress=False)
    res = run_experiment({"a": {}, "b": {"grouping": "random", "group": {"k": 2}}}, seeds=(0, 1),
                         base=TINY, processes=1, pilot_steps=1, sd=0.04, effect=0.05)
    plan = res.plan
    assert plan["seconds_per_step"] > 0 and plan["total_s"] > 0
    assert "detectable" not in plan                     # 2 seeds: no verdict, said so
    assert plan["seeds_for_effect"] == seeds_needed(0.05, 0.04) == 8
    said = capsys.readouterr()
    text = said.out + said.err
    assert "cost here:" in text and "seeds needed to see a difference of 0.05" in text
    assert "can detect: nothing with 2 seed(s)" in text
    assert "[a seed 0] [a seed 0]" not in text                 # progress is not a finding
    assert "[a seed 0] step 2/3: eval/accuracy" in text          # a line per evaluation


def test_a_study_out_dir_that_is_a_file_is_refused_as_train_refuses_it(tmp_path, capsys):
    """`grpo-lab study --out_dir FILE` ended in a bare FileExistsError: one line naming it."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert main(["study", "--base", "quick", "--arm", "a", "--seeds", "1", "--steps", "1",
                 "--pilot_steps", "0", "--out_dir", str(blocker)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"out_dir {str(blocker)!r} is not a writable folder" in err, err


def test_arm_syntax_names_what_is_wrong():
    assert arms([["clip_higher", "clip.eps_high=0.28", "reward_weights=accuracy=1,format=0.1"],
                 ["sym"]]) == {"clip_higher": {"clip": {"eps_high": 0.28}, "reward_weights":
                                               {"accuracy": 1.0, "format": 0.1}}, "sym": {}}
    assert arms([["lora", "hf.lora_r=8"]]) == {"lora": {"hf": {"lora_r": 8}}}
    with pytest.raises(ValueError, match="--arm a: unknown config field 'clip.eps_hgh'"):
        arms([["a", "clip.eps_hgh=0.28"]])
    with pytest.raises(ValueError, match="unknown config field 'eps_high' .*now: 'clip.eps_high'"):
        arms([["a", "eps_high=0.28"]])               # a flat name: the block's field is named
    with pytest.raises(ValueError, match="--arm a: .*'abc'"):
        arms([["a", "clip.eps_high=abc"]])
    with pytest.raises(ValueError, match="an arm starts with its name, got 'eps_high=0.2'"):
        arms([["eps_high=0.2"]])
    with pytest.raises(ValueError, match="--arm 'a' is given twice"):
        arms([["a"], ["a"]])


def test_health_findings_name_the_strategy_and_seed(capsys):
    # every completion cut at 1 token: the trainer's "truncated" finding after its window
    res = run_experiment({"cut": {"max_new_tokens": 1}}, seeds=(0,), processes=1,
                         base={**TINY, "steps": 10, "eval_every": 0})
    found = res.runs[0]["findings"]
    assert any(": truncated: " in f and "max_new_tokens=1" in f for f in found), found
    text = capsys.readouterr()
    assert "[cut seed 0] step 9: truncated: " in text.out + text.err


def test_a_grouper_that_ran_as_by_prompt_is_named_in_the_study(capsys):
    import numpy as np
    from grpo_lab.algorithm.grouping import register_grouper

    @register_grouper("each_alone", takes_k=True)
    def each_alone(batch, k, seed=0):
        return np.arange(len(batch.prompts))
    res = run_experiment({"alone": {"grouping": "each_alone", "group": {"k": 2}}}, seeds=(0,),
                         processes=1, base={**TINY, "steps": 2})
    assert any(f.startswith("warning: GroupingFallback: grouper 'each_alone' put each of the 4")
               for f in res.runs[0]["findings"]), res.runs[0]["findings"]
    text = capsys.readouterr()
    assert "[alone seed 0] warning: GroupingFallback" in text.out + text.err
