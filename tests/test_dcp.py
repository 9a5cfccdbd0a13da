"""Sharded checkpoints (``ckpt_format="dcp"``, distributed/dcp.py): a toy run saved by
torch.distributed.checkpoint on N gloo processes resumes on M (2 -> 1, 2 -> 3, 1 -> 2) and
ends as the run that never stopped; a damaged shard file is refused by name; a writer killed
inside a save leaves the last whole checkpoint.

Tolerance: tests/test_fsdp.py's, atol 1e-5 on the weights after 3 AdamW steps of lr 3e-4 (the
ranks' summation order moves a gradient in its last bits; its docstring works it out). A
1-process run resumed on 1 process is bit-identical to the one that never stopped.
"""
import dataclasses
import shutil

import pytest
import torch

from grpo_lab.checkpoint import CheckpointError, read_training_checkpoint
from grpo_lab.distributed import launch
from grpo_lab.distributed.exchanges import ExchangeConfig
from grpo_lab.training.trainer import spawn_train, train
from test_fsdp import FSDP2, WEIGHTS_ATOL, _killed_after_step_1, params_of, toy

pytest.importorskip("torch.distributed.fsdp")

DCP = dict(ckpt_format="dcp")


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory):
    """The weights of the 3-step run on one process (allreduce, torch's AdamW)."""
    out = tmp_path_factory.mktemp("one")
    train(toy(out), progress=False)
    return params_of(out)


def assert_as_never_stopped(out, never_stopped, atol=WEIGHTS_ATOL):
    got = params_of(out)                   # read whole from the shards, on this one process
    assert got.keys() == never_stopped.keys()
    for k, v in got.items():
        torch.testing.assert_close(v, never_stopped[k], atol=atol, rtol=0, msg=k)


def shard_files(out) -> dict:
    """{file name: bytes} of the one shard folder a run folder holds."""
    folders = list((out / "checkpoint.dcp").iterdir())
    assert len(folders) == 1, folders
    return {p.name: p.stat().st_size for p in folders[0].iterdir()}


def _stopped_after_step_1(m, policy):
    if m["step"] == 1:
        raise KeyboardInterrupt("stopped")


@pytest.fixture(scope="module")
def saved_on_2(tmp_path_factory):
    """A fsdp2 run on 2 processes stopped after step 1, its checkpoint sharded."""
    out = tmp_path_factory.mktemp("two") / "run"
    with pytest.raises(launch.RankFailedError, match="KeyboardInterrupt"):
        launch.spawn(_killed_after_step_1, 2, (toy(out, FSDP2, **DCP),), run_timeout_s=300)
    return out


def test_saved_on_2_processes_resumes_on_1_and_on_3(tmp_path, saved_on_2, never_stopped):
    """Each rank wrote its own shard file (about half the bytes each); 2 -> 1 process under
    allreduce (no process group: DCP reads every shard on one process; the exchange an
    override, recorded) and 2 -> 3 under fsdp2 end as the run that never stopped."""
    assert read_training_checkpoint(saved_on_2 / "checkpoint.safetensors")["step"] == 1
    sizes = shard_files(saved_on_2)
    assert sorted(sizes) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    both = sizes["__0_0.distcp"] + sizes["__1_0.distcp"]
    assert max(sizes["__0_0.distcp"], sizes["__1_0.distcp"]) < 0.6 * both
    on_1, on_3 = tmp_path / "on_1", tmp_path / "on_3"
    shutil.copytree(saved_on_2, on_1)
    shutil.copytree(saved_on_2, on_3)
    c = toy(on_1, **DCP)                                      # allreduce, one process
    history = train(c, resume=True, progress=False, allow_override=True)
    assert [h["step"] for h in history] == [-1, 0, 1, 2]
    assert history[3]["resume/overrides"] == {"exchange.name": ["fsdp2", "allreduce"]}
    assert_as_never_stopped(on_1, never_stopped)
    assert sorted(shard_files(on_1)) == [".metadata", "__0_0.distcp"]   # step 2's, on 1 rank
    spawn_train([toy(on_3, FSDP2, **DCP)], 3, resume=True, run_timeout_s=300, progress=False)
    assert_as_never_stopped(on_3, never_stopped)
    assert len(shard_files(on_3)) == 4


@pytest.fixture(scope="module")
def saved_on_1(tmp_path_factory):
    """The run on 1 process (allreduce) stopped after step 1, its checkpoint in DCP's format."""
    out = tmp_path_factory.mktemp("one_dcp") / "run"
    with pytest.raises(KeyboardInterrupt):
        train(toy(out, **DCP), progress=False, on_step=_stopped_after_step_1)
    return out


def test_saved_on_1_process_resumes_on_1_and_on_2(tmp_path, saved_on_1, never_stopped):
    """1 -> 1: bit-identical; 1 -> 2 under fsdp2: within the sharded runs' tolerance."""
    assert sorted(shard_files(saved_on_1)) == [".metadata", "__0_0.distcp"]
    again, on_2 = tmp_path / "again", tmp_path / "on_2"
    shutil.copytree(saved_on_1, again)
    shutil.copytree(saved_on_1, on_2)
    train(toy(again, **DCP), resume=True, progress=False)
    assert_as_never_stopped(again, never_stopped, atol=0.0)
    spawn_train([toy(on_2, FSDP2, **DCP)], 2, resume=True, run_timeout_s=300, progress=False,
                allow_override=True)
    assert_as_never_stopped(on_2, never_stopped)


@pytest.mark.parametrize("name, damage", [("__0_0.distcp", "truncate"),
                                          (".metadata", "flip")])
def test_a_damaged_shard_file_is_refused_by_name(tmp_path, saved_on_1, name, damage):
    out = tmp_path / "run"
    shutil.copytree(saved_on_1, out)
    (f,) = (out / "checkpoint.dcp").glob(f"*/{name}")
    data = bytearray(f.read_bytes())
    if damage == "truncate":
        del data[len(data) // 2:]
    else:
        data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    said = rf"{f.parent.name}/{name} is corrupt: sha256 .* does not match"
    with pytest.raises(CheckpointError, match=said):
        read_training_checkpoint(out / "checkpoint.safetensors")
    with pytest.raises(CheckpointError, match=said):
        train(toy(out, **DCP), resume=True, progress=False)
    f.unlink()
    with pytest.raises(CheckpointError, match=rf"{name} is missing: .* names it as one of its "
                                              rf"2 shard files"):
        train(toy(out, **DCP), resume=True, progress=False)


def test_resume_without_the_checkpoint_file_names_the_shards_it_found(tmp_path, saved_on_1,
                                                                     capsys):
    """checkpoint.safetensors deleted, its shard folder kept: `--resume` said the run "was
    killed before its first one"; it says what is there and what is missing."""
    from grpo_lab.cli import main
    out = tmp_path / "run"
    shutil.copytree(saved_on_1, out)
    (out / "checkpoint.safetensors").unlink()
    (shards,) = (out / "checkpoint.dcp").iterdir()
    assert main(["train", "--out_dir", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and (f"{out} holds the shards of a sharded checkpoint (checkpoint.dcp/"
                                f"{shards.name}) but no checkpoint.safetensors") in err, err
    assert "killed before its first one" not in err


def test_the_sharder_cannot_write_a_sharded_checkpoint(tmp_path):
    with pytest.raises(ValueError, match=r"ckpt_format='dcp' saves the state of torch's AdamW; "
                                         r"exchange 'sharded' steps its own Adam"):
        toy(tmp_path, {"name": "sharded"}, **DCP)
    with pytest.raises(ValueError, match=r"unknown ckpt_format 'zip'"):
        toy(tmp_path, ckpt_format="zip")
    toy(tmp_path, {"name": "sharded"})                         # the single file: its default


def _killed_in_the_commit(rank, world, c):
    """Rank 0 dies by SIGKILL after every rank wrote step 2's shards and before the checkpoint
    file naming them replaced step 1's (the commit)."""
    import os
    import signal

    from grpo_lab.distributed import dcp
    calls = []
    commit = dcp.save_training_checkpoint

    def dying_commit(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        commit(*args, **kw)
    dcp.save_training_checkpoint = dying_commit
    train(c, progress=False)


def test_a_writer_killed_before_the_commit_leaves_the_last_checkpoint(tmp_path, never_stopped):
    """Step 2's shards written in full, step 1's checkpoint still the one named; the resumed
    run (2 processes) deletes the unfinished folder and ends as the run that never stopped."""
    out = tmp_path / "run"
    c = toy(out, FSDP2, **DCP)
    with pytest.raises(launch.RankFailedError):
        launch.spawn(_killed_in_the_commit, 2, (c,), run_timeout_s=300)
    assert sorted(d.name[:11] for d in (out / "checkpoint.dcp").iterdir()) == \
        ["step-000001", "step-000002"]
    named = read_training_checkpoint(out / "checkpoint.safetensors")
    assert named["step"] == 1 and named["shards"].name.startswith("step-000001")
    spawn_train([c], 2, resume=True, run_timeout_s=300, progress=False)
    assert [d.name[:11] for d in (out / "checkpoint.dcp").iterdir()] == ["step-000002"]
    assert read_training_checkpoint(out / "checkpoint.safetensors")["step"] == 2
    assert_as_never_stopped(out, never_stopped)
