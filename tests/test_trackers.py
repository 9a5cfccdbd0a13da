"""report_to: what each tracker wrote, read back offline, equals metrics.jsonl; a tracker that
fails never stops training and says so once; a missing package is an error before any work."""
import dataclasses
import errno
import json
import os
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from grpo_lab.checkpoint import read_training_checkpoint
from grpo_lab.cli import build_parser, main, train_config
from grpo_lab.training import trackers
from grpo_lab.training.config import check_records, TrainConfig, preset, to_dict
from grpo_lab.training.trackers import TrackerFailed, Trackers, markdown_table, scalars

ROOT = Path(__file__).resolve().parent.parent
# 3 steps of 4 prompts x 2, evaluations at -1, 1 and 2 (the end) on 8 held-out prompts
SHORT = ["--preset", "quick", "--steps", "3", "--eval_every", "2", "--eval_size", "8",
         "--prompts_per_step", "4", "--group_size", "2", "--ckpt_every", "2", "--threads", "1"]


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def samples(out: Path) -> dict[int, list]:
    return {r["step"]: r["samples"] for r in map(json.loads, (out / "samples.jsonl").open())}


def numbers(row: dict) -> dict:
    """What a tracker must hold of a metrics row: every number but the step."""
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}


def read_tensorboard(folder: Path) -> tuple[dict, dict]:
    """-> ({tag: [(step, value), ...]}, {tag: {step: text}}), as TensorBoard loads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    values = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags["scalars"]}
    texts = {t.split("/text_summary")[0]: {e.step: e.tensor_proto.string_val[0].decode()
                                           for e in acc.Tensors(t)} for t in tags["tensors"]}
    return values, texts


def same_float32(a: float, b: float) -> bool:
    a, b = np.float32(a), np.float32(b)
    return bool(a == b or (np.isnan(a) and np.isnan(b)))


def assert_tensorboard_holds(out: Path, rows: list[dict]) -> None:
    values, texts = read_tensorboard(out / "tensorboard")
    want = {}                                            # tag -> [(step, value)] in run order
    for row in rows:
        for k, v in numbers(row).items():
            want.setdefault(k, []).append((row["step"], v))
    assert set(values) == set(want)
    for tag, pairs in want.items():
        got = values[tag]
        assert [s for s, _ in got] == [s for s, _ in pairs], tag        # each step once
        assert all(same_float32(a, b) for (_, a), (_, b) in zip(got, pairs)), (tag, got, pairs)
    by_step = samples(out)
    assert texts["samples"] == {s: markdown_table(r) for s, r in by_step.items()}
    assert set(by_step) == {r["step"] for r in rows if "eval/accuracy" in r}


def test_tensorboard_and_wandb_hold_every_scalar_and_sample_and_config_json_reruns(
        tmp_path, capsys, monkeypatch):
    pytest.importorskip("tensorboard")
    wandb = pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)      # the sink's default: offline
    out = tmp_path / "run"
    argv = ["train", *SHORT, "--out_dir", str(out), "--report_to", "tensorboard,wandb"]
    assert main(argv) == 0
    rows = metrics(out)
    assert [r["step"] for r in rows] == [-1, 0, 1, 2]
    assert_tensorboard_holds(out, rows)
    assert_wandb_holds(out, rows, wandb)
    # out_dir/config.json: the resolved config, and --config reads it back as the same one
    cfg = train_config(build_parser().parse_args(argv))
    saved = json.loads((out / "config.json").read_text())
    assert saved.pop("grpo_lab_version") == "0.1.0"            # which grpo_lab wrote it
    assert saved == to_dict(cfg) == read_training_checkpoint(out / "checkpoint.safetensors")["config"]
    again = train_config(build_parser().parse_args(["train", "--config", str(out / "config.json")]))
    assert again == cfg
    # resume from config.json, a flag over it: config.json rewritten with the override,
    # TensorBoard gets steps 3 and 4 only (a W&B run of its own: not asked for here)
    assert main(["train", "--config", str(out / "config.json"), "--resume", "--override",
                 "--steps", "5", "--report_to", "tensorboard"]) == 0
    rows = metrics(out)
    assert [r["step"] for r in rows] == [-1, 0, 1, 2, 3, 4]
    assert json.loads((out / "config.json").read_text())["steps"] == 5
    assert_tensorboard_holds(out, rows)


def wandb_records(path: Path):
    """The records of a W&B offline run file (.wandb): a LevelDB-style log of 32 KiB blocks,
    a 7-byte file header (":W&B", magic 0xBEE1, version), then records of a 7-byte header
    (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) and a Record protobuf."""
    from wandb.proto import wandb_internal_pb2
    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1)
    pos, part, block = 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (kind == 0 and length == 0):            # the block's zero padding
            pos += left
            continue
        part, pos = part + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            r = wandb_internal_pb2.Record()
            r.ParseFromString(part)
            part = b""
            yield r


def assert_wandb_holds(out: Path, rows: list[dict], wandb) -> None:
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    history = [{it.key or "/".join(it.nested_key): json.loads(it.value_json)  # a table: nested
                for it in r.history.item}
               for r in wandb_records(next(runs[0].glob("run-*.wandb")))
               if r.WhichOneof("record_type") == "history"]
    steps = [h for h in history if "samples/path" not in h]
    assert [h["step"] for h in steps] == [r["step"] for r in rows]
    for h, row in zip(steps, rows):
        want = numbers(row)
        assert {k: h[k] for k in want} == want, row["step"]
        assert set(h) - {"step", "_step", "_runtime", "_timestamp"} == set(want)
    tables = {h["step"]: h["samples/path"] for h in history if "samples/path" in h}
    by_step = samples(out)
    assert set(tables) == set(by_step)
    for step, path in tables.items():
        table = json.loads((runs[0] / "files" / path).read_text())
        assert table["columns"] == list(by_step[step][0])
        assert table["data"] == [list(r.values()) for r in by_step[step]]


TRACKIO_RUN = """
import json, sys
from grpo_lab.cli import main
assert main(sys.argv[2:]) == 0
from trackio.sqlite_storage import SQLiteStorage
runs = SQLiteStorage.get_runs("grpo_lab")
logs = SQLiteStorage.get_logs("grpo_lab", runs[0])
open(sys.argv[1], "w").write(json.dumps({"runs": runs, "logs": logs}, default=str))
"""


def test_trackio_holds_every_scalar_and_sample_locally(tmp_path):
    pytest.importorskip("trackio")
    out, dump = tmp_path / "run", tmp_path / "trackio.json"
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for var in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        env.pop(var, None)
    subprocess.run([sys.executable, "-c", TRACKIO_RUN, str(dump), "train", *SHORT,
                    "--out_dir", str(out), "--report_to", "trackio"],
                   env=env, cwd=ROOT, check=True, timeout=600, capture_output=True)
    got = json.loads(dump.read_text())
    assert len(got["runs"]) == 1 and got["runs"][0].startswith("run-")
    rows, logs = metrics(out), got["logs"]
    scalar_logs = [g for g in logs if "samples" not in g]
    assert [g["step"] for g in scalar_logs] == [r["step"] for r in rows]
    for g, row in zip(scalar_logs, rows):
        want = numbers(row)
        assert {k: g[k] for k in want} == want, row["step"]
        assert set(g) - {"step", "timestamp"} == set(want)
    tables = {g["step"]: g["samples"]["_value"] for g in logs if "samples" in g}
    assert tables == samples(out)


def short_cfg(out: Path, **kw) -> TrainConfig:
    return preset("quick", steps=3, eval_every=2, eval_size=8, prompts_per_step=4, group_size=2,
                  ckpt_every=2, threads=1, out_dir=str(out), **kw)


def test_a_full_disk_under_tensorboard_warns_once_and_training_goes_on(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    from grpo_lab.training.trainer import train
    attempts, write = [], RecordWriter.write

    def full_from_step_1(self, data):           # the disk fills up as step 1 is logged
        if Event.FromString(data).step >= 1:
            attempts.append(Event.FromString(data).step)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(self, data)

    monkeypatch.setattr(RecordWriter, "write", full_from_step_1)
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = train(short_cfg(out, report_to="tensorboard"), progress=False)
    failed = [w for w in caught if issubclass(w.category, TrackerFailed)]
    assert len(failed) == 1 and attempts == [1]           # said once, then never called again
    said = str(failed[0].message)
    assert "'tensorboard' failed at step 1" in said and "No space left on device" in said
    rows = metrics(out)
    assert rows == json.loads(json.dumps(history)) and [r["step"] for r in rows] == [-1, 0, 1, 2]
    assert read_training_checkpoint(out / "checkpoint.safetensors")["step"] == 2
    values, _ = read_tensorboard(out / "tensorboard")       # what was written before is there
    assert [s for s, _ in values["time/elapsed_s"]] == [-1, 0]
    assert [s for s, _ in values["reward/mean"]] == [0]      # the base row (-1) has no reward
    assert set(values) == set(numbers(rows[0])) | set(numbers(rows[1]))


def test_wandb_failing_mid_run_is_dropped_and_tensorboard_goes_on(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    wandb = pytest.importorskip("wandb")
    from grpo_lab.training.trainer import train
    monkeypatch.delenv("WANDB_MODE", raising=False)
    calls, log = [], wandb.sdk.wandb_run.Run.log

    def broken_at_step_1(self, data, *a, **kw):
        calls.append(data["step"])
        if data["step"] >= 1:
            raise wandb.Error("the run's service went away")
        return log(self, data, *a, **kw)

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", broken_at_step_1)
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(short_cfg(out, report_to="tensorboard,wandb"), progress=False)
    failed = [str(w.message) for w in caught if issubclass(w.category, TrackerFailed)]
    assert len(failed) == 1 and "'wandb' failed at step 1" in failed[0]
    assert "the run's service went away" in failed[0]
    assert calls == [-1, -1, 0, 1]               # base row, its samples, step 0, step 1: no more
    assert_tensorboard_holds(out, metrics(out))               # the other sink has every step


@pytest.mark.parametrize("sink", ["tensorboard", "wandb", "trackio"])
def test_a_missing_package_is_an_error_before_any_work(tmp_path, capsys, monkeypatch, sink):
    monkeypatch.setitem(sys.modules, sink, None)               # as if not installed
    out = tmp_path / "run"
    assert main(["train", *SHORT, "--out_dir", str(out), "--report_to", sink]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"report_to={sink!r} needs the {sink!r} package" in line
    assert f'pip install {sink} (in a checkout: pip install -e ".[{sink}]")' in line
    assert not out.exists()
    from grpo_lab.training.trainer import train
    with pytest.raises(ModuleNotFoundError,
                       match=rf'pip install {sink} \(in a checkout: pip install -e "\.\[{sink}\]"\)'):
        train(short_cfg(out, report_to=sink), progress=False)
    assert not out.exists()


def test_the_default_path_imports_no_tracker():
    code = ("import sys, grpo_lab.training.trainer, grpo_lab.cli; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'tensorboard', 'wandb', 'trackio'}))")
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert got.stdout.strip() == "[]"


def test_scalars_are_the_numbers_of_a_row():
    row = {"step": 3, "reward/mean": 0.25, "grad/norm": 2, "sample/topped_up": True,
           "comm/wchar_bytes": None, "resume/overrides": {"lr": [1, 2]}, "note": "x"}
    assert scalars(row) == {"reward/mean": 0.25, "grad/norm": 2.0, "sample/topped_up": 1.0}


def test_markdown_table_escapes_pipes_and_newlines():
    rows = [{"prompt": "1+2=", "completion": "3|4\n5", "reward": 0.5},
            {"prompt": "9+9=", "completion": "18", "reward": 1.0}]
    assert markdown_table(rows) == ("| prompt | completion | reward |\n|---|---|---|\n"
                                    "| 1+2= | 3\\|4⏎5 | 0.5 |\n| 9+9= | 18 | 1.0 |")


@pytest.mark.parametrize("text, names", [("none", []), ("", []), ("tensorboard", ["tensorboard"]),
                                         (" wandb , trackio", ["wandb", "trackio"])])
def test_sink_names(text, names):
    assert trackers.sink_names(text) == names


@pytest.mark.parametrize("text, said", [
    ("tensorbord", "unknown report_to sink 'tensorbord'; known: ['tensorboard', 'trackio', 'wandb']"),
    ("wandb,wandb", "report_to='wandb,wandb' names a sink twice"),
    ("tensorboard,none", "unknown report_to sink 'none'"),
])
def test_a_bad_report_to_is_refused_naming_it(text, said):
    with pytest.raises(ValueError, match=said.replace("[", r"\[").replace("]", r"\]")):
        check_records(TrainConfig(report_to=text))


def test_ranks_but_0_and_none_open_nothing(tmp_path):
    for t in (Trackers("tensorboard", tmp_path, {}, fresh=True, lead=False),
              Trackers("none", tmp_path, {}, fresh=True)):
        t.log({"step": 0, "reward/mean": 1.0}, [{"prompt": "1+1="}])
        t.close()
        assert t.live == {} and list(tmp_path.iterdir()) == []


def test_on_two_processes_only_rank_0_logs(tmp_path):
    """Every rank holds the same metrics; one event file, from rank 0, holds every step once."""
    pytest.importorskip("tensorboard")
    from grpo_lab.training.trainer import spawn_train
    out = tmp_path / "run"
    by_rank = spawn_train([short_cfg(out, report_to="tensorboard")], 2, run_timeout_s=300,
                          progress=False)[0]
    assert len(by_rank) == 2
    assert len(list((out / "tensorboard").iterdir())) == 1
    assert_tensorboard_holds(out, metrics(out))


def test_a_sink_that_cannot_open_is_said_once_and_skipped(tmp_path, monkeypatch):
    opened = []

    def full_disk(run_dir, config):
        opened.append(run_dir)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run_dir / "tensorboard"))

    monkeypatch.setitem(trackers.SINKS, "tensorboard",
                        trackers.Sink("tensorboard", "tensorboard", "tensorboard", full_disk))
    t = Trackers("tensorboard", tmp_path, {}, fresh=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            t.log({"step": step, "reward/mean": 0.5})
        t.close()
    said = [str(w.message) for w in caught if issubclass(w.category, TrackerFailed)]
    assert opened == [tmp_path] and len(said) == 1 and t.live == {}
    assert "'tensorboard' failed at opening it: OSError: [Errno 28] No space left on device" \
        in said[0]


def test_a_run_resumed_after_dying_past_its_checkpoint_shows_each_step_once(tmp_path):
    """An on_step hook raises at step 2, after TensorBoard got the step and the last checkpoint
    (step 1): the resumed run logs step 2 again, and TensorBoard shows it once, the resumed
    run's (the session start at step 2 hides the earlier process's steps from 2 on)."""
    pytest.importorskip("tensorboard")
    from grpo_lab.training.trainer import train
    out = tmp_path / "run"
    cfg = dataclasses.replace(short_cfg(out, report_to="tensorboard"), steps=4)

    def plot_fails_at_step_2(m, policy):
        if m["step"] == 2:
            raise RuntimeError("the live plot failed")

    with pytest.raises(RuntimeError, match="the live plot failed"):
        train(cfg, progress=False, on_step=plot_fails_at_step_2)
    assert read_training_checkpoint(out / "checkpoint.safetensors")["step"] == 1
    train(cfg, resume=True, progress=False)
    rows = metrics(out)
    assert [r["step"] for r in rows] == [-1, 0, 1, 2, 3]
    assert_tensorboard_holds(out, rows)              # each step once, the resumed run's values


def test_tensorboard_keeps_the_config_and_a_resumed_process_hides_the_steps_it_logs_again(
        tmp_path):
    pytest.importorskip("tensorboard")
    first = Trackers("tensorboard", tmp_path, {"lr": 1}, fresh=True)
    for step in (-1, 0, 1, 2):                        # the base evaluation first, as a run does
        first.log({"step": step, "reward/mean": float(step)})
    first.close()
    values, texts = read_tensorboard(tmp_path / "tensorboard")
    assert values["reward/mean"] == [(-1, -1.0), (0, 0.0), (1, 1.0), (2, 2.0)]
    assert list(texts["config"]) == [0]               # not hidden by the start at step -1
    again = Trackers("tensorboard", tmp_path, {"lr": 1}, fresh=False)
    for step in (1, 2, 3):                            # resumed from the checkpoint of step 0
        again.log({"step": step, "reward/mean": 10.0 * step})
    again.close()
    values, _ = read_tensorboard(tmp_path / "tensorboard")
    assert values["reward/mean"] == [(-1, -1.0), (0, 0.0), (1, 10.0), (2, 20.0), (3, 30.0)]
