"""The CLI is generated from the configs: help shows field docstrings; errors are clear."""
import json
import os
import sys
from pathlib import Path

import pytest

from grpo_lab.cli import build_parser, main, parse_weights
from grpo_lab.registry import SETTINGS
from grpo_lab.cli import field_docs
from grpo_lab.training.config import check_records, TrainConfig

ROOT = Path(__file__).resolve().parent.parent


def test_every_field_documented_and_in_help():
    docs = field_docs(TrainConfig)
    assert set(docs) == set(TrainConfig.__dataclass_fields__)
    helptext = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for name in set(docs) - {"blocks"}:   # the plugins field is the --plugin flag
        assert f"--{'plugin' if name == 'plugins' else name}" in helptext
    for block, cls in SETTINGS.items():      # each settings block's fields: --tis.cap
        assert set(field_docs(cls)) == set(cls.__dataclass_fields__), block
        for name in field_docs(cls):
            assert f"--{block}.{name} " in helptext
    assert "G: completions sampled per prompt" in helptext


def test_train_help_shows_the_defaults_a_run_without_flags_gets():
    """`train --help` showed TrainConfig's own defaults (--lr 0.0001, --kl.beta 0.02), but a run
    without --preset starts from tiny_cpu (lr 0.0003, kl.beta 0.0): every flag's "(default: X)"
    is the value that run gets."""
    from grpo_lab.training.config import preset, to_dict
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    shown = {a.dest: a.help.rsplit("(default: ", 1)[1][:-1] for a in train._actions
             if a.help and "(default: " in a.help}
    cfg = to_dict(preset("tiny_cpu"))
    weights = cfg.pop("reward_weights")
    values = {f"{k}.{sk}": sv for k, v in cfg.items() if isinstance(v, dict)
              for sk, sv in v.items()}
    values.update({k: v for k, v in cfg.items() if not isinstance(v, dict)})
    values["reward_weights"] = ",".join(f"{k}={v}" for k, v in weights.items())
    checked = {k: (shown[k], str(values[k])) for k in shown if k in values}
    assert len(checked) > 100
    assert {k: v for k, v in checked.items() if v[0] != v[1]} == {}
    assert (shown["lr"], shown["kl.beta"], shown["eval_every"]) == ("0.0003", "0.0", "50")


@pytest.mark.parametrize("old, new", [("--tis_cap", "tis.cap"), ("--beta", "kl.beta"),
                                      ("--eps_high", "clip.eps_high"),
                                      ("--overlong_buffer", "overlong.buffer"),
                                      ("--group_k", "group.k"), ("--combine", "group.combine"),
                                      ("--recluster_every", "group.recluster_every"),
                                      ("--group_schedule", "group.schedule"),
                                      ("--policy_loss", "loss.policy"),
                                      ("--ratio_level", "loss.ratio_level"),
                                      ("--aggregation", "loss.aggregation"),
                                      ("--sample_draw", "sampler.draw"),
                                      ("--drop_finished", "sampler.drop_finished"),
                                      ("--dynamic_sampling", "dynamic.sampling"),
                                      ("--dynamic_max_draws", "dynamic.max_draws"),
                                      ("--update_forward", "speed.update_forward")])
def test_an_old_flat_flag_is_argparses_error_naming_the_new_one(old, new, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", old, "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {old} 2" in err and f"'{new}'" in err
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{old[2:]}'.*'{new}'"):
        check_records(TrainConfig(**{old[2:]: 2}))


def test_the_old_dynamic_sampling_key_names_the_dynamic_block(capsys, tmp_path):
    """{"dynamic_sampling": true} as a config key: a config dict, a config file and a study
    arm each fail naming dynamic.sampling (the flag and the keyword: the test above)."""
    from grpo_lab.cli import read_config_file, study_arms
    from grpo_lab.training.config import from_dict, preset, to_dict
    for build in (lambda: preset("quick", dynamic_sampling=True),
                  lambda: from_dict({"dynamic_sampling": True})):
        with pytest.raises(TypeError, match="unexpected keyword argument 'dynamic_sampling'.*"
                                            "'dynamic.sampling'"):
            build()
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"dynamic_sampling": True}))
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --dynamic_sampling=true" in err and "'dynamic.sampling'" in err
    with pytest.raises(ValueError, match="unknown config field 'dynamic_sampling'.*"
                                         "'dynamic.sampling'"):
        study_arms([["dapo", "dynamic_sampling=true"]])
    # the new names, each way
    path.write_text(json.dumps({"dynamic": {"sampling": True, "max_draws": 3}}))
    assert read_config_file(path)[1]["dynamic"] == {"sampling": True, "max_draws": 3}
    assert study_arms([["dapo", "dynamic.sampling=true", "dynamic.max_draws=3"]]) == \
        {"dapo": {"dynamic": {"sampling": True, "max_draws": 3}}}
    c = preset("quick", dynamic={"sampling": True})
    assert (c.dynamic.sampling, c.dynamic.max_draws) == (True, 4)
    assert to_dict(c)["dynamic"] == {"sampling": True, "max_draws": 4}
    assert from_dict(to_dict(c)).dynamic == c.dynamic


@pytest.mark.parametrize("old, new", [("exchange.preset", "compression.preset"),
                                      ("exchange.powersgd_rank", "powersgd.rank"),
                                      ("exchange.broadcast_preset", "sharding.broadcast_preset"),
                                      ("exchange.param_dtype", "fsdp2.param_dtype")])
def test_an_exchange_kinds_old_field_names_its_settings_block(old, new, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["train", f"--{old}", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: --{old} 2" in err and f"'{new}'" in err
    with pytest.raises(ValueError, match=f"unknown field {old}.*'{new}'"):
        TrainConfig(exchange={old.split(".")[1]: 2})
    path = tmp_path / "old.json"                         # a config file: the flag's error
    path.write_text(json.dumps({"exchange": {old.split(".")[1]: 2}}))
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: --{old}=2" in err and f"'{new}'" in err


def test_parse_weights():
    assert parse_weights("accuracy=1,format=0.1") == {"accuracy": 1.0, "format": 0.1}
    with pytest.raises(Exception, match="expected name=weight"):
        parse_weights("accuracy")


def test_train_eval_and_report(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--preset", "quick", "--steps", "4", "--out_dir", str(out),
                 "--eval_size", "20"]) == 0
    assert (out / "report.png").stat().st_size > 10_000
    assert "held-out greedy accuracy" in (out / "report.md").read_text()
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out / "checkpoint.safetensors"),
                 "--eval_size", "20"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert 0.0 <= res["eval/accuracy"] <= 1.0


def test_bad_values_exit_2_with_message(tmp_path, capsys):
    assert main(["train", "--group_size", "1", "--out_dir", str(tmp_path)]) == 2
    assert "group_size (G) must be >= 2 for a group-relative baseline, got 1" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tmp_path / "nope.safetensors")]) == 2
    assert "no checkpoint file" in capsys.readouterr().err


def test_eval_of_a_run_folder_names_its_checkpoint(tmp_path, capsys):
    """`eval --checkpoint OUT_DIR` (a run's folder, which holds a config.json) was loaded as a
    transformers model and failed with "Couldn't instantiate the backend tokenizer from one of:",
    naming neither the folder nor the file to pass."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"steps": 2}))   # a run's, not a model's
    (run / "checkpoint.safetensors").write_bytes(b"")
    assert main(["eval", "--checkpoint", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (f"--checkpoint {run} is a training run's folder, not a transformers model: evaluate "
            f"its checkpoint, --checkpoint {run / 'checkpoint.safetensors'}") in err


def test_a_policy_file_where_a_folder_is_is_refused_before_the_run(tmp_path, capsys,
                                                                    monkeypatch):
    """`warmup --out FOLDER` and `pretrain --out FOLDER` trained all their steps (1500 and 1800
    by default) and only then failed to write the file: refused before the first step."""
    import grpo_lab.agents.warmup as warmup
    import grpo_lab.training.pretrain as pretrain

    def ran(*args, **kwargs):
        raise AssertionError("the run started")
    monkeypatch.setattr(warmup, "run_warm_up", ran)
    monkeypatch.setattr(pretrain, "main", ran)
    for argv in (["warmup", "--task", "guess"], ["pretrain"]):
        assert main([*argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"--out {tmp_path} is a folder: name the .safetensors file to write" in err, argv


def test_pretrain_block_size_and_threads_are_refused_before_the_run(capsys, monkeypatch):
    """`pretrain --block_size 2` failed at step 0 on a position past it (naming no flag), and
    `--threads -1` in torch.set_num_threads: both refused up front, naming the field and value.
    The default tasks' longest demonstration is 'sort:' + 6 digits + '=' + 6 digits + <eos>."""
    import grpo_lab.training.pretrain as pretrain

    def ran(*args, **kwargs):
        raise AssertionError("the run started")
    monkeypatch.setattr(pretrain, "main", ran)
    assert main(["pretrain", "--block_size", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "block_size=2 is shorter than the longest demonstration" in err
    assert "is 19 tokens; use --block_size 19 or more" in err, err
    assert main(["pretrain", "--threads", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "PretrainConfig.threads must be >= 0, got -1" in err, err
    # the shortest block that holds them passes the check (the run itself is patched out)
    assert main(["pretrain", "--block_size", "19"]) == 2
    assert "the run started" in capsys.readouterr().err


def test_an_unknown_answer_format_lists_raw_among_the_known(tmp_path, capsys):
    """`--answer_format nope` listed ['boxed', 'number', 'tags']: not raw, the default."""
    for argv in (["train", "--out_dir", str(tmp_path / "run")], ["eval"]):
        assert main([*argv, "--answer_format", "nope"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and ("unknown answer format 'nope'; known: ['boxed', 'number', "
                                    "'raw', 'tags']") in err, (argv, err)


@pytest.mark.parametrize("argv", [["train", "--st", "2"], ["pretrain", "--thr", "1"],
                                  ["study", "--out_dir", "s", "--arm", "a", "--see", "1"],
                                  ["eval", "--eval", "3"], ["preflight", "--st", "1"],
                                  ["train", "--plug", "my_lab.py"]])
def test_an_abbreviated_flag_is_an_error_not_the_flag_it_starts(argv, capsys):
    """argparse's default took `train --st 2` as --steps 2 (a config file's keys take no
    abbreviation): every subcommand refuses it, naming it and its value."""
    from grpo_lab.cli import parse
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    assert stop.value.code == 2
    assert f"error: unrecognized arguments: {' '.join(argv[-2:])}" in capsys.readouterr().err


def test_bench_lists_runs_and_rejects_unknown(capsys):
    assert main(["bench"]) == 0
    listed = capsys.readouterr().out
    for name in ("codecs", "sharder", "train_dist", "grouping_train", "kv_cache"):
        assert f"bench_{name}.py" in listed
    assert main(["bench", "kv_cache", "--help"]) == 0                       # the script's own help
    assert main(["bench", "nope"]) == 2
    err = capsys.readouterr().err                 # every bench/ script is listed
    assert "unknown bench 'nope'; known: [" in err and "'codecs'" in err


def test_trl_bench_gpu_recipe_parses_help_without_trl_or_a_gpu():
    """bench_hf_trl.py's GPU recipe (--device cuda --model ...) is untested here; its --help
    must still run on a CPU machine without the optional bench packages (trl imports lazily)."""
    import subprocess
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "bench/bench_hf_trl.py", "--help"], cwd=root,
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    for flag in ("--device {cpu,cuda}", "--model", "--seeds", "--accuracy_steps"):
        assert flag in out.stdout, flag


def test_lab_opens_jupyterlab_on_the_notebooks(monkeypatch):
    import subprocess
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    assert main(["lab"]) == 0
    assert calls[0][1:3] == ["-m", "jupyterlab"] and calls[0][3].endswith("notebooks")


def _long_context_tiny(tmp_path):
    """data/hf_tiny with room for an instruct prompt (RoPE: its weights work at any length)."""
    import shutil
    model = tmp_path / "tiny"
    shutil.copytree(ROOT / "data" / "hf_tiny", model)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 256
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize("lora", [0, 4])
def test_eval_of_a_training_checkpoint_asks_as_its_run_asked(tmp_path, capsys, lora):
    """`grpo-lab eval` on an instruct run (answer format, new-token budget) and on a LoRA run
    gives the run's own final held-out accuracy; it used to ask '7+74=' with 5 new tokens
    (instruct: 0.0 where the run said 5%) and refused every LoRA checkpoint ('30 missing')."""
    model, out = _long_context_tiny(tmp_path), tmp_path / "run"
    args = ["train", "--preset", "hf_tiny_cpu", "--base_checkpoint", str(model),
            "--answer_format", "tags", "--max_new_tokens", "12", "--steps", "2",
            "--eval_size", "20", "--eval_every", "0", "--threads", "1", "--hf.lora_r", str(lora),
            "--out_dir", str(out)]
    assert main(args) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in rows if "eval/accuracy" in r][-1]
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out / "checkpoint.safetensors"),
                 "--eval_size", "20"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["eval/accuracy"] == final["eval/accuracy"]
    assert got["eval/format"] == final["eval/format"] and got["eval/reward"] == final["eval/reward"]


def test_version(capsys):
    import grpo_lab
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"grpo-lab {grpo_lab.__version__}\n" == "grpo-lab 0.1.0\n"


def test_eval_of_a_transformers_folder_asks_it_as_an_hf_policy(tmp_path, capsys):
    """`eval --checkpoint FOLDER --answer_format tags` called a transformers folder 'the toy'
    ('needs policy='hf' ... the toy uses raw'): a folder is an HF policy."""
    model = _long_context_tiny(tmp_path)
    assert main(["eval", "--checkpoint", str(model), "--answer_format", "tags",
                 "--eval_size", "5"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["checkpoint"] == str(model) and "eval/format" in got     # asked with tags
    assert main(["eval", "--checkpoint", "data/hf_tiny", "--answer_format", "tags",
                 "--eval_size", "5"]) == 2                  # its 64-token context is too short
    err = capsys.readouterr().err
    assert "toy" not in err and "exceeds the model's block_size 64" in err, err


def test_a_lora_run_as_base_checkpoint_starts_from_its_merged_weights(tmp_path, capsys):
    """A LoRA run's checkpoint as --base_checkpoint failed with '30 missing' (its keys are the
    peft model's): the next run starts from base + (alpha / r) B A, with or without LoRA."""
    import torch
    from grpo_lab.policies.policy import _load_hf, load_policy_any
    from grpo_lab.training.config import preset
    model, out = _long_context_tiny(tmp_path), tmp_path / "lora"
    common = ["--preset", "hf_tiny_cpu", "--steps", "2", "--eval_size", "5", "--eval_every",
              "0", "--threads", "1", "--lr", "0.01"]
    assert main(["train", *common, "--base_checkpoint", str(model), "--hf.lora_r", "4",
                 "--out_dir", str(out)]) == 0
    ckpt = str(out / "checkpoint.safetensors")
    x = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        trained = load_policy_any(ckpt).eval()(x)[0]                       # (1, 6, V)
        base = load_policy_any(str(model)).eval()(x)[0]
        assert (trained - base).abs().max() > 1e-3                    # the adapters moved it
        for r in (0, 4):
            cfg = preset("hf_tiny_cpu", base_checkpoint=ckpt, hf={"lora_r": r})
            start = _load_hf(cfg, ckpt).eval()
            assert start.cfg.lora_r == r
            # one fp32 rounding of W + s * B A per weight, through 2 layers: ~1e-5 measured
            torch.testing.assert_close(start(x)[0], trained, atol=1e-4, rtol=0)
    for r in ("0", "4"):
        assert main(["train", *common, "--base_checkpoint", ckpt, "--hf.lora_r", r,
                     "--out_dir", str(tmp_path / f"next{r}")]) == 0


def test_more_processes_than_prompts_is_one_line_before_any_rank_starts(capsys, tmp_path):
    """Each rank refused it on its own (the same line 3 times); the launcher refuses it first,
    before claiming the folder or starting torchrun."""
    out = tmp_path / "run"
    assert main(["train", "--preset", "quick", "--nproc", "3", "--prompts_per_step", "2",
                 "--out_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("prompts_per_step=2 is fewer than the 3 processes: each rank "
                              "needs at least one prompt") in err[0]
    assert not out.exists()


def test_a_resume_says_when_config_json_was_edited_since_the_checkpoint(capsys, tmp_path):
    """A resume takes the checkpoint's config and writes config.json again: an edit of the
    file was dropped unsaid. A plain resume says nothing."""
    out = tmp_path / "run"
    flags = ["--out_dir", str(out), "--eval_size", "0", "--threads", "1"]
    assert main(["train", "--preset", "quick", "--steps", "1", *flags]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", *flags]) == 0
    assert "note" not in capsys.readouterr().err
    cfg = json.loads((out / "config.json").read_text())
    cfg["group_size"] += 2
    cfg["kl"]["beta"] = 0.5
    (out / "config.json").write_text(json.dumps(cfg))
    assert main(["train", "--resume", *flags]) == 0
    err = capsys.readouterr().err
    assert (f"grpo-lab: note: {out / 'config.json'} differs from the checkpoint's config "
            f"(group_size, kl.beta); a resume takes the checkpoint's") in err
    assert json.loads((out / "config.json").read_text())["group_size"] == cfg["group_size"] - 2
