"""The fast-path probe (speed_probe.py): the choice worked out by hand from given timings, the
accuracy check and the margin deciding it, the choice recorded in config.json and the report
and used by the run, the cache per machine. Timings are set by replacing ``measure``: no test
here asserts a speed."""
import json

import pytest
import torch

from grpo_lab.training import speed_probe as sp
from grpo_lab.training.config import preset, to_dict
from grpo_lab.training.report import write_report
from grpo_lab.training.trainer import train

pytest.importorskip("transformers")

MEDIANS = {"rollout": {"fp32": {1: 1.0, 2: 0.8}, "bf16 copy": {1: 0.5, 2: 0.6},
                       "autocast": {1: 2.0, 2: 1.5}},
           "update": {"fp32": {1: 2.0, 2: 1.2}, "autocast": {1: 1.0, 2: 1.1}}}


def test_choice_by_hand():
    # default (fp32, fp32, 2 threads) 0.8 + 1.2 = 2.0; bf16 copy + autocast at their best
    # threads (1 and 1) 0.5 + 1.0 = 1.5: chosen, 2.0 / 1.5 faster
    out = sp.choose(MEDIANS, {"bf16 copy": 0.01, "autocast": 0.01}, default_threads=2)
    assert out["choice"] == {"sample_dtype": "bfloat16", "autocast": True, "rollout_threads": 1,
                             "threads": 1}
    assert out["default_step_s"] == 2.0 and out["choice_step_s"] == 1.5
    assert out["speedup"] == pytest.approx(2.0 / 1.5, rel=1e-12)
    by = {(s["sample_dtype"], s["autocast"]): s["step_s"] for s in out["settings"]}
    assert by == {("", False): 2.0, ("", True): 2.5, ("bfloat16", False): 1.7,
                  ("bfloat16", True): 1.5}


def test_a_mode_failing_the_accuracy_check_is_never_chosen():
    # autocast off the bound: the best left is the bf16 copy with the fp32 update, 0.5 + 1.2
    out = sp.choose(MEDIANS, {"bf16 copy": 0.01, "autocast": sp.LOGP_TOLERANCE}, 2)
    assert out["choice"] == {"sample_dtype": "bfloat16", "autocast": False,
                             "rollout_threads": 1, "threads": 2}
    assert out["choice_step_s"] == 1.7
    out = sp.choose(MEDIANS, {"bf16 copy": 0.2, "autocast": 0.2}, 2)   # both fail: fp32's best
    assert out["choice"] == {"sample_dtype": "", "autocast": False, "rollout_threads": 0,
                             "threads": 0}                  # the default, the run's own threads


def test_a_gain_inside_the_margin_keeps_the_default():
    m = json.loads(json.dumps(MEDIANS), object_hook=lambda d: {
        int(k) if k.isdigit() else k: v for k, v in d.items()})
    m["rollout"]["bf16 copy"] = {1: 0.75, 2: 0.75}          # 0.75 + 1.2 = 1.95 > 0.95 * 2.0
    m["update"]["autocast"] = {1: 5.0, 2: 5.0}
    out = sp.choose(m, {"bf16 copy": 0.0, "autocast": 0.0}, 2)
    assert out["choice"]["sample_dtype"] == "" and out["choice"]["threads"] == 0
    assert out["speedup"] == 1.0
    m["rollout"]["bf16 copy"] = {1: 0.6, 2: 0.75}           # 0.6 + 1.2 = 1.8 < 1.9: taken
    assert sp.choose(m, {"bf16 copy": 0.0, "autocast": 0.0}, 2)["choice"]["sample_dtype"] \
        == "bfloat16"


FAKE = {("rollout", "fp32"): 1.0, ("rollout", "bf16 copy"): 0.25, ("rollout", "autocast"): 3.0,
        ("update", "fp32"): 1.0, ("update", "autocast"): 2.0}


@pytest.fixture
def fake_timer(monkeypatch, tmp_path):
    """Each (phase, mode) takes FAKE seconds on 1 thread and twice that on more; the
    candidate's work is not run. The cache goes to tmp_path."""
    monkeypatch.setenv("GRPO_LAB_CACHE", str(tmp_path / "cache"))
    calls = []

    def measure(phase, mode, threads, fn):
        calls.append((phase, mode, threads))
        return FAKE[phase, mode] * (1 if threads == 1 else 2)
    monkeypatch.setattr(sp, "measure", measure)
    return calls


def tiny_cfg(out, **kw):
    return preset("hf_tiny_cpu", out_dir=str(out), steps=2, eval_size=0, time_budget_s=0.0,
                  prompts_per_step=2, group_size=2, speed={"fast_path": "probe"}, **kw)


def test_the_choice_is_recorded_and_used(fake_timer, tmp_path):
    seen = []
    h = train(tiny_cfg(tmp_path / "run"), progress=False,
              on_step=lambda m, p: seen.append((p.cfg.sample_dtype, p.cfg.autocast,
                                                p._copy is not None)))
    assert fake_timer                                       # the probe ran
    # bf16 copy 0.25 + fp32 update 1.0 at 1 thread beats the default 2.0 (or 4.0 on 2 threads)
    assert seen == [("bfloat16", False, True)] * 2          # sampled from the bf16 copy
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["hf"]["sample_dtype"] == "bfloat16" and saved["hf"]["autocast"] is False
    assert saved["threads"] == 1 and saved["speed"]["rollout_threads"] == 1
    assert saved["speed"]["fast_path"] == "probe"
    record = saved["fast_path_choice"]
    assert record["choice"] == {"sample_dtype": "bfloat16", "autocast": False,
                                "rollout_threads": 1, "threads": 1}
    assert record["choice_step_s"] == 1.25
    assert all(0 < e < sp.LOGP_TOLERANCE for e in record["logp_error"].values())  # measured
    assert h[0]["time/threads"] == 1
    md = write_report(h, tmp_path / "run", to_dict(tiny_cfg(tmp_path / "run")))
    assert "**Fast path**" in md.read_text() and "sampling bf16 copy" in md.read_text()
    # the config.json runs again through --config: the record is skipped, not a field
    from grpo_lab.training.config_file import config_file_args
    flags, _ = config_file_args(tmp_path / "run" / "config.json")
    assert not any("fast_path_choice" in f for f in flags) and "--speed.fast_path=probe" in flags


def test_the_cache_is_read_on_the_same_machine_and_not_on_another(fake_timer, tmp_path,
                                                                  monkeypatch):
    cfg = tiny_cfg(tmp_path / "a")
    first = sp.cached(cfg, say=lambda s: None)
    n = len(fake_timer)
    assert sp.cached(cfg, say=lambda s: None) == first and len(fake_timer) == n   # cached
    assert sp.cache_path(cfg).parent == tmp_path / "cache" / "fast_path"
    here = sp.cache_path(cfg)
    other = dict(sp.machine_id(), torch="0.0.0")
    monkeypatch.setattr(sp, "machine_id", lambda: other)
    assert sp.cache_path(cfg) != here
    sp.cached(cfg, say=lambda s: None)
    assert len(fake_timer) == 2 * n                          # another torch: probed again


def test_the_accuracy_check_excludes_bf16_at_a_zero_bound(fake_timer, tmp_path, monkeypatch):
    monkeypatch.setattr(sp, "LOGP_TOLERANCE", 0.0)
    record = sp.probe(tiny_cfg(tmp_path / "a"), rounds=1)
    assert record["choice"]["sample_dtype"] == "" and record["choice"]["autocast"] is False


def test_bad_fast_path_and_device_are_errors_naming_the_value(tmp_path):
    with pytest.raises(ValueError, match="'fast'"):
        preset("hf_tiny_cpu", speed={"fast_path": "fast"})
    with pytest.raises(ValueError, match="policy='toy'"):
        preset("tiny_cpu", speed={"fast_path": "probe"})
    with pytest.raises(ValueError, match="'gpu'"):
        preset("tiny_cpu", speed={"device": "gpu"})
    with pytest.raises(ValueError, match="rollout_threads must be >= 0, got -1"):
        preset("tiny_cpu", speed={"rollout_threads": -1})


def test_the_flat_names_of_the_speed_block_are_errors_naming_the_new_one(capsys):
    """fast_path, rollout_threads and device live on the speed block: no alias; the error
    names the new field (as the settings blocks' renames did)."""
    from grpo_lab.cli import parse
    from grpo_lab.training.config import TrainConfig
    for flat in ("fast_path", "rollout_threads", "device"):
        with pytest.raises(TypeError, match=f"'speed.{flat}'"):
            TrainConfig(**{flat: "probe" if flat == "fast_path" else 1})
        with pytest.raises(SystemExit):
            parse(["train", f"--{flat}", "1"])
        assert f"'speed.{flat}'" in capsys.readouterr().err
    assert parse(["train", "--speed.device", "cpu"]).__dict__["speed.device"] == "cpu"


def test_probe_leaves_the_callers_threads(fake_timer, tmp_path):
    was = torch.get_num_threads()
    sp.probe(tiny_cfg(tmp_path / "a"), rounds=1, threads=[1])
    assert torch.get_num_threads() == was


def test_preflight_probe_prints_the_choice_and_then_reads_the_cache(fake_timer, capsys,
                                                                  monkeypatch):
    from grpo_lab.cli import main
    from grpo_lab.teaching import workshop
    monkeypatch.setattr(workshop, "_timed_steps", lambda steps: ("GRPO steps", True, "not timed"))
    main(["preflight", "--steps", "1", "--probe", "hf_tiny_cpu"])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x[5:].startswith("fast path"))   # the check
    assert "probing the fast path of data/hf_tiny" in out                # said while probing
    # FAKE on 1 thread: the bf16 copy 0.25 + the fp32 update 1.0 = 1.25 s, the fastest
    assert line.startswith("ok ") and "hf_tiny_cpu: sampling bf16 copy, update fp32, threads " \
        "1 (rollout) / 1 (update): probe step 1.250 s" in line
    path = sp.cache_path(preset("hf_tiny_cpu", speed={"fast_path": "probe"}))
    assert f"probed now, cached in {path}" in line
    assert json.loads(path.read_text())["choice"] == {"sample_dtype": "bfloat16",
                                                      "autocast": False, "rollout_threads": 1,
                                                      "threads": 1}
    n = len(fake_timer)
    main(["preflight", "--steps", "1", "--probe", "hf_tiny_cpu"])
    out = capsys.readouterr().out
    assert f"read from {path}" in out and len(fake_timer) == n          # not probed again
    main(["preflight", "--steps", "1", "--probe", "tiny_cpu"])           # the toy policy: none
    line = next(x for x in capsys.readouterr().out.splitlines() if x[5:].startswith("fast path"))
    assert line.startswith("BAD") and "policy='toy'" in line


def test_the_probe_times_the_runs_own_batch_up_to_its_cap():
    # smollm_cpu: 4 prompts x 8 completions x 24 tokens, inside the cap: probed as it runs
    # (a smaller batch misjudged bf16 on an AMX Xeon: BENCHMARKS section 32)
    assert sp._shape(preset("smollm_cpu")) == {"B": 4, "G": 8, "max_new": 24}
    big = preset("smollm_cpu", prompts_per_step=16, group_size=16, max_new_tokens=64)
    assert sp._shape(big) == {"B": sp.PROBE_PROMPTS, "G": sp.PROBE_G, "max_new": sp.PROBE_TOKENS}
    assert (sp.PROBE_PROMPTS, sp.PROBE_G, sp.PROBE_TOKENS) == (4, 8, 32)
