"""One trainer at every scale: the same GRPO run on 1, 2 and 3 gloo processes ends with the same
parameters; a run killed after a checkpoint resumes on 1 or 2 processes and continues exactly;
a dead or stuck rank ends every rank with a clear error, the last checkpoint intact; the
README's command lines (``grpo-lab train --nproc 2``, ``torchrun ... -m grpo_lab.cli train``)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grpo_lab.policies.policy import load_policy_any
from grpo_lab.checkpoint import read_training_checkpoint
from grpo_lab.training.config import preset
from grpo_lab.distributed import launch
from grpo_lab.training.trainer import spawn_train, train
from hangs import assert_ended_in_time, stamp, stamped
from tolerance import mean_tol

# a grouper that crosses prompts, dynamic sampling, mu = 2 and token_mean: everything that
# must be decided on the global batch. 7 prompts split 4+3 and 3+2+2 (uneven on purpose).
# adam_eps 1e-6: see tests/test_exchanges.py (rounding noise on exactly-zero gradients).
RUN = dict(prompts_per_step=7, group_size=4, steps=4, grouping="kmeans_semantic", group={"k": 2},
           dynamic={"sampling": True, "max_draws": 2}, mu=2, loss={"aggregation": "token_mean"},
           lr=3e-4, warmup_steps=0, adam_eps=1e-6, eval_size=10, eval_every=0, ckpt_every=2, time_budget_s=0.0, threads=1)
LOSSLESS = {"allreduce": {"exchange": {"name": "allreduce"}},
            "sharded_fp32": {"exchange": {"name": "sharded_compressed"},
                             "compression": {"preset": "fp32"}}}


def cfg(out, over=None, **kw):
    return preset("quick", out_dir=str(out), **{**RUN, **kw, **(over or {})})


def params_of(out) -> dict:
    return load_policy_any(Path(out) / "checkpoint.safetensors").state_dict()


def close(a: dict, b: dict, atol: float):
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    history = train(cfg(out), progress=False)
    return {"history": history, "params": params_of(out), "out": out}


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    """{(exchange, N): out_dir} for N = 2 and 3 (one spawn per N)."""
    root = tmp_path_factory.mktemp("multi")
    outs = {}
    for n in (2, 3):
        cases = {name: cfg(root / f"{name}{n}", ex) for name, ex in LOSSLESS.items()}
        spawn_train(list(cases.values()), n, run_timeout_s=400)
        outs.update({(name, n): root / f"{name}{n}" for name in cases})
    return outs


def test_same_run_on_1_2_and_3_processes(single, multi):
    base = load_policy_any(cfg("x").base_checkpoint).state_dict()
    moved = max(float((single["params"][k] - base[k]).abs().max()) for k in base)
    assert moved > 1e-4                                                    # 10x the tolerance
    for (name, n), out in multi.items():
        close(params_of(out), single["params"], atol=1e-5)
    # the logged metrics are those of the global batch: the same on every N
    one = [h for h in single["history"] if h["step"] >= 0]
    for (name, n), out in multi.items():
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        got = [h for h in lines if h["step"] >= 0]
        for a, b in zip(one, got):
            for k in ("reward/mean", "group/zero_std_frac", "adv/var", "sample/draws",
                      "completion/mean_len"):
                assert a[k] == pytest.approx(b[k], abs=1e-9), (name, n, k)
            # a mean of B*G*T terms ratio * A that cancel, summed over ranks in another
            # order: the tolerance follows those terms (tests/tolerance.py), not the result
            n_terms = round(RUN["prompts_per_step"] * RUN["group_size"] * a["completion/mean_len"])
            c = cfg("x")
            tol = mean_tol(n_terms, (1 + c.clip.eps_high) * a["adv/abs_mean"]
                           + c.kl.beta * a["loss/kl"])
            assert a["loss/total"] == pytest.approx(b["loss/total"], rel=0, abs=tol), (name, n)
        assert got[-1]["comm/bytes"] > 0


def test_rank_owns_a_contiguous_slice():
    from grpo_lab.distributed.group import Group
    assert [list(Group(r, 3).slice(7)) for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [list(Group(r, 2).slice(7)) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6]]


@pytest.mark.parametrize("initialised,backend,expected", [
    (True, "nccl", torch.device("cuda", 0)),     # a group of one under torchrun on one GPU
    (True, "gloo", torch.device("cpu")),
    (False, None, torch.device("cpu"))])         # no group: a plain process
def test_group_of_one_under_nccl_trains_on_its_gpu(monkeypatch, initialised, backend, expected):
    """The trainer puts the policy on Group.device: a one-process NCCL group (one GPU) must
    get the GPU, not the CPU (it did get the CPU while the check was world > 1)."""
    from grpo_lab.distributed import group as g
    monkeypatch.setattr(g.dist, "is_initialized", lambda: initialised)
    monkeypatch.setattr(g.dist, "get_backend", lambda *a: backend)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert g.Group(0, 1).device == expected


# ---------------------------------------------------------------- kill, resume, dead ranks
def _train_with_fault(rank, world, c, fault, step_at, copy_to):
    def hook(m, policy):
        if m["step"] == step_at - 1 and rank == 0 and copy_to:            # right after a checkpoint
            shutil.copy(Path(c.out_dir) / "checkpoint.safetensors", copy_to)
        if m["step"] in (step_at - 1, step_at) and rank == world - 1:     # the step before, the fault
            stamp(Path(c.out_dir).with_name(f"step{m['step']}.at"))
        if m["step"] == step_at and rank == world - 1:
            if fault == "raise":
                raise KeyboardInterrupt("killed")
            if fault == "exit":
                os._exit(1)
            if fault == "stall":
                time.sleep(3600)
    train(c, progress=False, on_step=hook)


def test_killed_two_process_run_resumes_on_one_and_on_two(tmp_path, single, multi):
    for n in (1, 2):
        out = tmp_path / f"resume{n}"
        c = cfg(out)
        with pytest.raises(launch.RankFailedError, match="KeyboardInterrupt"):
            launch.spawn(_train_with_fault, 2, (c, "raise", 2, None), run_timeout_s=300)
        assert read_training_checkpoint(out / "checkpoint.safetensors")["step"] == 1
        if n == 1:
            resumed = train(c, resume=True, progress=False)
            close(params_of(out), single["params"], atol=1e-5)             # as if never killed
        else:
            resumed = spawn_train([c], 2, resume=True, run_timeout_s=300)[0][0]["history"]
            uninterrupted = params_of(multi[("allreduce", 2)])
            for k, v in params_of(out).items():
                assert torch.equal(v, uninterrupted[k]), k                 # bit for bit on 2
        assert [h["step"] for h in resumed] == [-1, 0, 1, 2, 3]


@pytest.mark.parametrize("fault", ["exit", "stall"])
def test_dead_or_stuck_rank_stops_every_rank_and_keeps_the_checkpoint(tmp_path, fault):
    """The run ends within the collective's timeout and spawn's grace of the fault, plus ten
    of this run's own steps (timed here: a busy machine is slow, not red); a stall that the
    timeout did not end would last an hour (run_timeout_s ends the test at 600 s)."""
    c = cfg(tmp_path / "run", exchange={"timeout_s": 5.0})
    good = tmp_path / "after_step1.safetensors"
    with pytest.raises(launch.RankFailedError) as e:
        launch.spawn(_train_with_fault, 2, (c, fault, 2, str(good)), timeout_s=5.0,
                     run_timeout_s=600)
    error_at, fault_at = time.time(), stamped(tmp_path / "step2.at")
    step_s = fault_at - stamped(tmp_path / "step1.at")                      # one step, now
    assert_ended_in_time(fault_at, error_at, timeout_s=5.0, grace_s=5.0, calibration_s=step_s,
                         k=10)
    print(f"{fault}: fault -> error {error_at - fault_at:.1f} s, one step {step_s:.2f} s")
    assert ("rank 1 of 2 died" in str(e.value)) if fault == "exit" else ("rank 0" in str(e.value))
    assert (tmp_path / "run" / "checkpoint.safetensors").read_bytes() == good.read_bytes()


# ---------------------------------------------------------------- the README's command lines
def _cli(args, tmp_path, **env):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", **env}
    return subprocess.run(args, cwd=Path(__file__).resolve().parent.parent, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("how", ["nproc", "torchrun"])
def test_command_lines_run_two_processes(tmp_path, how):
    out = tmp_path / how
    flags = ["train", "--preset", "quick", "--steps", "3", "--eval_size", "10",
             "--out_dir", str(out), "--exchange.name", "sharded"]
    if how == "nproc":
        cmd = [sys.executable, "-m", "grpo_lab.cli", *flags, "--nproc", "2"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", "-m", "grpo_lab.cli", *flags]
    r = _cli(cmd, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "report:" in r.stdout and (out / "report.md").exists()
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 2 and last["comm/bytes"] > 0 and "shard/imbalance" in last


def test_process_supervision_is_the_same_on_2_processes(tmp_path):
    # per-token advantages normalised over a group's steps: gathered ragged step rewards
    kw = dict(supervision="process", grouping="by_task", dynamic={"sampling": False}, mu=1,
              task="addition,sort", steps=2, ckpt_every=2)
    one = train(cfg(tmp_path / "one", **kw), progress=False)
    spawn_train([cfg(tmp_path / "two", **kw)], 2, run_timeout_s=300)
    close(params_of(tmp_path / "two"), params_of(tmp_path / "one"), atol=1e-5)
    two = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(one[1:], two[1:]):
        assert a["adv/var"] == pytest.approx(b["adv/var"], abs=1e-9)
