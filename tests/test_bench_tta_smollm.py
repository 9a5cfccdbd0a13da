"""bench/bench_tta_smollm.py's bookkeeping, worked out by hand: which sweep run is best, a rerun
skipping the runs its results file holds, and the paired ratio of the seed table (TRL itself is a
bench dependency, not needed here)."""
import argparse
import json
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
bench = load_script("bench/bench_tta_smollm.py")


def rec(side, lr, seed, steps_to, s_to, accs=(0.3,), steps=10, train_s=50.0, rollout_s=20.0):
    return {"side": side, "lr": lr, "seed": seed, "steps_to_target": steps_to,
            "train_s_to_target": s_to, "evals": [[2 * (i + 1), a] for i, a in enumerate(accs)],
            "steps": steps, "train_s": train_s, "rollout_s": rollout_s,
            "update_s": train_s - rollout_s, "eval_s": 4.0, "wall_s": 60.0,
            "load_start": 1.0, "load_end": 1.5}


def args(tmp_path, **kw):
    a = argparse.Namespace(preset="hf_tiny_cpu", model="data/hf_tiny", target=0.5, cap=6,
                           eval_every=2, eval_size=50, threads=1, trl_matched=False, B=4, G=4,
                           max_new=6, temperature=0.7, seeds=[0, 1, 2], sweep_seed=0,
                           results=tmp_path / "runs.jsonl", bf16=False,
                           grpo_lab_set="", versus_set=None)
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def test_best_lr_is_the_least_time_to_target_else_the_best_accuracy():
    fast_late = rec("TRL", 1e-5, 0, 30, 90.0)         # more steps, fewer seconds: chosen
    slow_early = rec("TRL", 2e-5, 0, 20, 120.0)
    missed = rec("TRL", 4e-5, 0, None, None, accs=(0.9,))
    assert bench.best_lr([slow_early, fast_late, missed]) is fast_late
    low = rec("TRL", 1e-5, 0, None, None, (0.2, 0.4))
    high = rec("TRL", 2e-5, 0, None, None, (0.45,))
    assert bench.best_lr([low, high]) is high          # none reached: highest held-out accuracy


def test_a_rerun_takes_a_finished_run_from_the_results_file(tmp_path, monkeypatch):
    a = args(tmp_path)
    stored = {**bench.run_key(a, "grpo_lab", 1e-4, 1), "steps_to_target": 4,
              "train_s_to_target": 1.5}
    a.results.write_text(json.dumps(stored) + "\n")
    ran = []
    monkeypatch.setattr(bench, "one_run", lambda a, side, lr, seed: ran.append((side, lr, seed))
                        or {**bench.run_key(a, side, lr, seed), "steps_to_target": None,
                            "train_s_to_target": None, "steps": 6, "evals": [[6, 0.4]],
                            "wall_s": 9.0})
    assert bench.get_run(a, "grpo_lab", 1e-4, 1) == stored and ran == []
    bench.get_run(a, "grpo_lab", 1e-4, 2)              # another seed: run and appended
    bench.get_run(a, "TRL", 1e-4, 1)                   # the other side: run and appended
    assert ran == [("grpo_lab", 1e-4, 2), ("TRL", 1e-4, 1)]
    lines = [json.loads(x) for x in a.results.read_text().splitlines()]
    assert [(x["side"], x["seed"]) for x in lines] == [("grpo_lab", 1), ("grpo_lab", 2), ("TRL", 1)]
    b = args(tmp_path, cap=8)                          # another cap is another run
    bench.get_run(b, "grpo_lab", 1e-4, 1)
    assert ran[-1] == ("grpo_lab", 1e-4, 1)
    n = len(ran)
    old = {k: v for k, v in stored.items() if k != "bf16"}  # a float32 record from before --bf16
    a.results.write_text(json.dumps(old) + "\n")
    assert bench.get_run(a, "grpo_lab", 1e-4, 1) == old and len(ran) == n
    bench.get_run(args(tmp_path, bf16=True), "grpo_lab", 1e-4, 1)    # bf16: another run
    assert len(ran) == n + 1
    c = args(tmp_path, grpo_lab_set='{"warmup_steps": 0}')     # grpo_lab's settings: its runs
    bench.get_run(c, "grpo_lab", 1e-4, 1)                      # again, TRL's key unchanged
    assert len(ran) == n + 2
    assert bench.run_key(c, "TRL", 1e-4, 1) == bench.run_key(a, "TRL", 1e-4, 1)


def test_seed_table_pairs_the_seeds_where_both_reached(tmp_path):
    a = args(tmp_path)
    final = {"grpo_lab": [rec("grpo_lab", 1e-5, 0, 10, 10.0), rec("grpo_lab", 1e-5, 1, 20, 20.0),
                          rec("grpo_lab", 1e-5, 2, 5, 7.0)],
             "TRL": [rec("TRL", 2e-5, 0, 20, 40.0), rec("TRL", 2e-5, 1, 40, 80.0),
                     rec("TRL", 2e-5, 2, None, None)]}
    text = "\n".join(bench.seed_table(a, final, {"grpo_lab": 1e-5, "TRL": 2e-5}))
    # seeds 0 and 1 pair: time ratios 40/10 = 80/20 = 4 (no spread), step ratios 2 and 2
    assert "training s to 50%, paired by seed over 2 seed(s): geometric mean 4.00 [95% 4.00, " \
           "4.00], per seed 4.00, 4.00" in text
    assert "steps to 50%, paired by seed over 2 seed(s): geometric mean 2.00" in text
    assert "TRL / grpo_lab >= 3): met (the interval 4.00 to 4.00)" in text
    final["TRL"][1]["train_s_to_target"] = 40.0        # ratios 4 and 2: the interval holds 3
    text = "\n".join(bench.seed_table(a, final, {"grpo_lab": 1e-5, "TRL": 2e-5}))
    assert "per seed 4.00, 2.00" in text and "TRL / grpo_lab >= 3): undecided" in text
    final["TRL"][0]["train_s_to_target"] = 20.0        # ratios 2 and 2: the interval under 3
    text = "\n".join(bench.seed_table(a, final, {"grpo_lab": 1e-5, "TRL": 2e-5}))
    assert "TRL / grpo_lab >= 3): not met (the interval 2.00 to 2.00)" in text
    # grpo_lab: 3/3 reached, steps (10 + 20 + 5) / 3 = 11.7; TRL 2/3, steps 30.0
    assert "| grpo_lab | 3/3 | 11.7 [" in text and "| TRL | 2/3 | 30.0 [" in text
    # s/step 50 / 10 = 5.00 on every run, rollout 2.00 + update 3.00; rollout share 40%
    assert "5.00 [5.00, 5.00] (2.00 + 3.00) | 40% |" in text


@pytest.mark.parametrize("missing", ["grpo_lab", "TRL"])
def test_seed_table_without_a_pair_says_so(tmp_path, missing):
    final = {s: [rec(s, 1e-5, 0, None if s == missing else 3, None if s == missing else 2.0)]
             for s in ("grpo_lab", "TRL")}
    text = "\n".join(bench.seed_table(args(tmp_path), final, {"grpo_lab": 1e-5, "TRL": 1e-5}))
    assert text.endswith("No seed where both sides reached the target: no paired ratio.")


def test_grpo_lab_set_merges_an_hf_block_and_refuses_the_bench_s_own_fields(tmp_path):
    a = args(tmp_path, bf16=True, grpo_lab_set='{"warmup_steps": 0, "hf": {"autocast": false}}')
    assert bench.grpo_lab_overrides(a, True) == {
        "warmup_steps": 0, "hf": {"autocast": False, "chat_template": True,
                                  "sample_dtype": "bfloat16"}}
    assert bench.grpo_lab_overrides(args(tmp_path), False) == {
        "hf": {"autocast": False, "chat_template": False}}
    with pytest.raises(SystemExit, match=r"sets \['lr', 'seed'\]"):
        bench.grpo_lab_overrides(args(tmp_path, grpo_lab_set='{"seed": 1, "lr": 0.1}'), True)
    with pytest.raises(SystemExit, match="is not JSON"):
        bench.grpo_lab_overrides(args(tmp_path, grpo_lab_set='{warmup_steps: 0}'), True)
    with pytest.raises(SystemExit, match="a JSON object"):
        bench.grpo_lab_overrides(args(tmp_path, grpo_lab_set='[1]'), True)
    with pytest.raises(SystemExit, match=r"^--versus_set .*an hf block an object"):
        bench.grpo_lab_overrides(args(tmp_path, grpo_lab_set='{"hf": 1}'), True, "--versus_set")


def test_versus_set_pairs_grpo_lab_under_two_settings_by_seed(tmp_path):
    a = args(tmp_path, grpo_lab_set='{"warmup_steps": 0}', versus_set="")
    pre = args(tmp_path, grpo_lab_set="")
    stored = []                                 # seconds to target: preset 8, 6, 4; mine 2, 3, 4
    for seed, (s_pre, s_mine) in enumerate([(8.0, 2.0), (6.0, 3.0), (4.0, 4.0)]):
        stored.append({**bench.run_key(pre, "grpo_lab", 1e-4, seed), "steps_to_target": 2 * s_pre,
                       "train_s_to_target": s_pre})
        stored.append({**bench.run_key(a, "grpo_lab", 1e-4, seed), "steps_to_target": 2 * s_mine,
                       "train_s_to_target": s_mine})
    a.results.write_text("".join(json.dumps(r) + "\n" for r in stored))
    mine = [r for r in stored if r["grpo_lab_set"]]
    out = bench.versus_lines(a, mine, 1e-4)
    assert out[0].startswith("grpo_lab with the preset's settings against grpo_lab with "
                             "'{\"warmup_steps\": 0}'")
    line = next(x for x in out if x.startswith("- versus / mine, training s"))
    # ratios 4, 2, 1: geometric mean 2 (log2 mean 1)
    assert "over 3 seed(s): geometric mean 2.00" in line and "per seed 4.00, 2.00, 1.00" in line
    assert len(a.results.read_text().splitlines()) == 6            # every run taken from the file
