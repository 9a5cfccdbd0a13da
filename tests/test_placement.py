"""A study's runs placed one per GPU (placement.py), checked on the CPU with a faked GPU count:
the devices a setting names, the slots, and a study of 7 runs on 3 fake GPUs whose trainer is
replaced by one that records where and when it ran (no run touches CUDA). A CPU study still
trains on the CPU and records it."""
import dataclasses
import json
import time
from pathlib import Path

import pytest
import torch

from grpo_lab.training import experiments as ex
from grpo_lab.training.config import preset
from grpo_lab.training.placement import Slots, study_devices


@pytest.fixture
def three_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)


def test_the_devices_a_setting_names(three_gpus):
    assert study_devices("auto") == ["cuda:0", "cuda:1", "cuda:2"]
    assert study_devices(None) == study_devices("auto")
    assert study_devices("cpu") == []
    assert study_devices("0,2") == ["cuda:0", "cuda:2"]
    assert study_devices("cuda:1") == ["cuda:1"]
    assert study_devices(["cuda:2", "0"]) == ["cuda:2", "cuda:0"]
    assert study_devices(2) == ["cuda:0", "cuda:1"]
    with pytest.raises(ValueError, match="cuda:3 is not here: torch sees 3"):
        study_devices("0,3")
    with pytest.raises(ValueError, match="asks for 4 GPU"):
        study_devices(4)
    with pytest.raises(ValueError, match="'gpu' is not a GPU"):
        study_devices("gpu")
    with pytest.raises(ValueError, match="cuda:1 is given twice"):
        study_devices("1,cuda:1")


def test_no_gpu_means_the_cpu(monkeypatch, tmp_path, capsys):
    from grpo_lab.cli import main
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert study_devices("auto") == []
    with pytest.raises(ValueError, match="torch sees 0"):
        study_devices("0")
    assert main(["study", "--base", "quick", "--arm", "a", "--steps", "1", "--seeds", "1",
                 "--devices", "0", "--out_dir", str(tmp_path / "s")]) == 2   # before any run
    assert "cuda:0 is not here: torch sees 0 GPU(s)" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_slots_give_the_lowest_free_device():
    s = Slots(["cuda:0", "cuda:1", "cuda:2"])
    assert [s.take(), s.take(), s.take()] == ["cuda:0", "cuda:1", "cuda:2"]
    with pytest.raises(RuntimeError, match="holds a run"):
        s.take()
    s.give("cuda:2")
    s.give("cuda:0")
    assert s.take() == "cuda:0" and s.take() == "cuda:2"
    with pytest.raises(RuntimeError, match="not a device in use"):
        s.give("cuda:5")
    s.give("cuda:1")
    with pytest.raises(RuntimeError, match="not a device in use"):
        s.give("cuda:1")                                   # freed twice


def fake_train(cfg, resume=False, progress=False, on_step=None, base_eval=None):
    """Records the device it was given and when it ran; sleeps a time set by the seed."""
    t0 = time.time()
    time.sleep(0.15 + 0.1 * (cfg.seed % 3))
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    (Path(cfg.out_dir) / "ran.json").write_text(json.dumps(
        {"device": cfg.speed.device, "t0": t0, "t1": time.time()}))
    return [{"step": 0, "reward/mean": 0.5, "time/step_s": 0.1}]


def test_seven_runs_on_three_gpus_never_share_one(three_gpus, monkeypatch, tmp_path):
    monkeypatch.setattr(ex, "train", fake_train)
    monkeypatch.setattr(ex, "write_report", lambda *a, **k: None)
    cfg = preset("quick", eval_size=0, steps=1)
    jobs = [ex.Job("a", s, dataclasses.replace(cfg, seed=s, out_dir=str(tmp_path / f"seed{s}")),
                   None, {}) for s in range(7)]
    # fork: the workers keep the fake trainer (the study itself spawns on GPUs)
    ex._run_all(jobs, 3, "fork", progress=False, in_process=False, devices=study_devices())
    ran = {s: json.loads((tmp_path / f"seed{s}" / "ran.json").read_text()) for s in range(7)}
    for s in range(7):                                     # the device recorded is the one used
        result = json.loads((tmp_path / f"seed{s}" / ex.RESULT_FILE).read_text())
        assert result["device"] == ran[s]["device"]
    assert {r["device"] for r in ran.values()} == {"cuda:0", "cuda:1", "cuda:2"}
    for d in ("cuda:0", "cuda:1", "cuda:2"):               # one device: one run at a time
        spans = sorted((r["t0"], r["t1"]) for r in ran.values() if r["device"] == d)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), (d, spans)
    # the first three start at once, one per device
    first = sorted(ran.values(), key=lambda r: r["t0"])[:3]
    assert sorted(r["device"] for r in first) == ["cuda:0", "cuda:1", "cuda:2"]


def test_a_study_on_fake_gpus_records_its_devices(three_gpus, monkeypatch, tmp_path):
    monkeypatch.setattr(ex, "train", fake_train)
    monkeypatch.setattr(ex, "write_report", lambda *a, **k: None)
    base = {"eval_size": 0, "steps": 1, "threads": 1}
    res = ex.run_experiment({"a": {}, "b": {"lr": 2e-4}}, seeds=(0, 1), base=base,
                            base_preset="quick", out_dir=str(tmp_path / "s"), progress=False,
                            devices="1,2", processes=1)       # one at a time, here: cuda:1
    assert [r["device"] for r in res.runs] == ["cuda:1"] * 4
    spec = json.loads((tmp_path / "s" / ex.STUDY_FILE).read_text())
    assert spec["devices"] == ["cuda:1", "cuda:2"]
    res.save(tmp_path / "saved.json")
    assert [r["device"] for r in ex.Results.load(tmp_path / "saved.json").runs] == ["cuda:1"] * 4
    assert [r["device"] for r in ex.Results.from_folder(tmp_path / "s").runs] == ["cuda:1"] * 4
    res = ex.run_experiment({"a": {}, "b": {"lr": 2e-4}}, seeds=(0, 1), base=base,
                            base_preset="quick", out_dir=str(tmp_path / "s"), progress=False,
                            resume=True, devices="cpu")       # another placement resumes
    assert [r["device"] for r in res.runs] == ["cuda:1"] * 4  # the finished runs, as run
    with pytest.raises(ValueError, match="processes=3 is more runs at once than the 2"):
        ex.run_experiment({"a": {}}, seeds=(0,), base=base, base_preset="quick",
                          devices="0,1", processes=3)
    with pytest.raises(ValueError, match="start_method='fork' cannot train on the GPUs"):
        ex.run_experiment({"a": {}}, seeds=(0,), base=base, base_preset="quick",
                          start_method="fork")
    with pytest.raises(ValueError, match="sets seed, out_dir or speed.device"):
        ex.run_experiment({"a": {"speed": {"device": "cuda:0"}}}, seeds=(0,), base=base,
                          base_preset="quick")


def test_a_cpu_study_trains_on_the_cpu_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    base = {"prompts_per_step": 4, "group_size": 4, "eval_size": 0, "steps": 2, "threads": 1}
    res = ex.run_experiment({"a": {}}, seeds=(0,), base=base, base_preset="quick",
                            out_dir=str(tmp_path / "s"), progress=False)
    assert res.runs[0]["device"] == "cpu"
    assert json.loads((tmp_path / "s" / ex.STUDY_FILE).read_text())["devices"] == ["cpu"]
    # the same run outside a study: the same numbers (placement leaves a CPU run alone)
    alone = ex.train(preset("quick", **base, seed=0, time_budget_s=0.0, target_accuracy=0.0,
                            out_dir=str(tmp_path / "alone")), progress=False)
    def strip(history):                     # wall times and memory differ between two runs
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/"))}
                for r in history]
    assert "loss/total" in strip(alone)[-1] or "reward/mean" in strip(alone)[-1]
    assert strip(res.runs[0]["history"]) == strip(alone)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the bench would measure")
def test_the_gpu_study_bench_measures_nothing_without_a_gpu():
    import os
    import subprocess
    import sys
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "bench/bench_gpu_study.py"], cwd=root,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    assert "no GPU: nothing measured" in done.stdout
