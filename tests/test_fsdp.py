"""FSDP2 (``--exchange.name fsdp2``, distributed/fsdp.py) through the one trainer on 2 and 3
gloo processes, against one process with the allreduce exchange (plain AdamW): the toy policy
and the tiny transformers model (full fine-tuning and LoRA) end with the same weights and log
the same rows; a run killed on 2 processes resumes on 3 and on 1 from the single-file
checkpoint; the combinations it cannot run are refused by name.

Tolerances. Weights: FSDP2 is held to what tests/test_scaling.py holds the allreduce exchange
to on 2 and 3 processes, atol 1e-5 after a few AdamW steps of lr 3e-4 (each step moves a weight
by at most about lr; the ranks' summation order changes a gradient in its last bits, which
moves the update by a small fraction of lr, except where a gradient is rounding noise around
0: adam_eps 1e-6 bounds that, as in tests/test_exchanges.py); the runs must move the weights
by more than 10x the tolerance. Logged rows: rewards and lengths exactly (the same tokens are
sampled on every N); the loss, a mean of n = B*G*T terms ratio * A that cancel, within
``mean_tol(n, (1 + eps_high) |A| + beta KL)`` (tests/tolerance.py: n * eps * the terms'
magnitude); the gradient norm, each element a mean over the same n terms, within
``mean_tol(n, norm)`` plus the relative change the previous steps' weight differences make
(the weights differ by up to the weight tolerance, so every update after the first compares
gradients of slightly different models: 1e-5 of the norm per earlier update, a bound set from
the largest drift measured here, 1.2e-5 after one update, 3.7e-5 after five).
"""
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from grpo_lab.policies.policy import load_policy_any
from grpo_lab.checkpoint import read_training_checkpoint
from grpo_lab.distributed import launch
from grpo_lab.distributed.exchanges import ExchangeConfig
from grpo_lab.training.config import TrainConfig, check_records, preset
from grpo_lab.training.trainer import spawn_train, train
from tolerance import mean_tol

pytest.importorskip("torch.distributed.fsdp")

FSDP2 = {"name": "fsdp2"}
# 5 prompts split 3+2 and 2+2+1 (uneven on purpose); beta > 0 (a reference policy), eval every
# 2 steps (rank 0 decodes alone inside the exchange's gathered weights), clipping on (the norm
# of sharded gradients), a checkpoint after step 1 (the resume test starts from it)
RUN = dict(prompts_per_step=5, group_size=4, steps=3, lr=3e-4, warmup_steps=0, adam_eps=1e-6,
           kl={"beta": 0.05}, grad_clip=1.0, eval_size=8, eval_every=2, ckpt_every=2,
           time_budget_s=0.0, threads=1)
HF = dict(RUN, steps=2, grad_clip=0.0)
LORA = dict(HF, hf={"lora_r": 4}, lr=1e-3)        # beta > 0: the adapters-off reference
# two updates a step, each of two micro-batches (two reduce-scatters accumulate in the shards),
# through the packed update forward (one forward a micro-batch; prompt_once, the default, two)
MICRO = dict(mu=2, micro_batches=2, speed={"update_forward": "packed"})
WEIGHTS_ATOL = 1e-5
GRAD_NORM_DRIFT = 1e-5          # relative, per earlier update (module docstring)


def toy(out, exchange=None, **kw):
    return preset("quick", out_dir=str(out), exchange=exchange or {}, **{**RUN, **kw})


def hf(out, exchange=None, **kw):
    return preset("hf_tiny_cpu", out_dir=str(out), exchange=exchange or {}, **kw)


def params_of(out) -> dict:
    return load_policy_any(Path(out) / "checkpoint.safetensors").state_dict()


def rows_of(out) -> list[dict]:
    lines = (Path(out) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["step"] >= 0]


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def assert_same_run(one_out, many_out, c: TrainConfig, base: dict) -> float:
    """The many-process run's weights and rows equal the one-process run's -> the weights'
    largest difference."""
    a, b = params_of(one_out), params_of(many_out)
    assert max_diff(a, {k: base[k] for k in a}) > 10 * WEIGHTS_ATOL     # the runs trained
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=WEIGHTS_ATOL, rtol=0, msg=k)
    one, many = rows_of(one_out), rows_of(many_out)
    assert [r["step"] for r in one] == [r["step"] for r in many] == list(range(c.steps))
    for s, (x, y) in enumerate(zip(one, many)):
        for k in ("reward/mean", "completion/mean_len", "eval/accuracy"):
            assert x.get(k) == y.get(k), (s, k)
        n = round(c.prompts_per_step * c.group_size * x["completion/mean_len"])
        terms = (1 + c.clip.eps_high) * x["adv/abs_mean"] + c.kl.beta * x.get("loss/kl", 0.0)
        assert y["loss/total"] == pytest.approx(x["loss/total"], rel=0, abs=mean_tol(n, terms))
        earlier = s * c.mu + c.mu - 1           # updates before the step's last (the logged)
        tol = mean_tol(n, x["grad/norm"]) + earlier * GRAD_NORM_DRIFT * x["grad/norm"]
        assert y["grad/norm"] == pytest.approx(x["grad/norm"], rel=0, abs=tol), s
    assert many[-1]["comm/bytes"] > 0
    return max_diff(a, b)


# ---------------------------------------------------------------- the toy policy


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    train(toy(root / "one"), progress=False)                               # allreduce, AdamW
    train(toy(root / "one_micro", **MICRO), progress=False)
    spawn_train([toy(root / "fsdp2_2", FSDP2),
                 toy(root / "fsdp2_2_kept", FSDP2, fsdp2={"reshard_after_forward": False}),
                 toy(root / "fsdp2_2_micro", FSDP2, **MICRO)],
                2, run_timeout_s=300, progress=False)
    spawn_train([toy(root / "fsdp2_3", FSDP2)], 3, run_timeout_s=300, progress=False)
    return root


def test_fsdp2_on_2_and_3_processes_trains_as_one_process(toy_runs):
    base = load_policy_any(toy("x").base_checkpoint).state_dict()
    found = {name: assert_same_run(toy_runs / "one", toy_runs / name, toy("x"), base)
             for name in ("fsdp2_2", "fsdp2_2_kept", "fsdp2_3")}
    found["fsdp2_2_micro"] = assert_same_run(toy_runs / "one_micro", toy_runs / "fsdp2_2_micro",
                                             toy("x", **MICRO), base)
    print("toy, largest weight difference from one process:", found)
    # bytes: the gradients' reduce-scatter, (N-1)/N x 4 B per weight, and the all-gathers; a
    # block kept gathered from forward to backward is all-gathered once fewer per update
    numel = sum(v.numel() for v in base.values() if v is not base.get("lm_head.weight"))
    for name in ("fsdp2_2", "fsdp2_2_kept"):
        assert all(r["comm/payload_bytes"] == 4 * numel for r in rows_of(toy_runs / name))
    sent = {n: sum(r["comm/bytes"] for r in rows_of(toy_runs / n)) for n in ("fsdp2_2", "fsdp2_2_kept")}
    assert sent["fsdp2_2_kept"] < sent["fsdp2_2"]


def test_checkpoint_holds_whole_weights_and_optimizer_state(toy_runs):
    """Rank 0 writes the single-file format of every other exchange: whole tensors, AdamW's
    state_dict keyed by parameter index."""
    one = read_training_checkpoint(toy_runs / "one" / "checkpoint.safetensors")
    two = read_training_checkpoint(toy_runs / "fsdp2_2" / "checkpoint.safetensors")
    assert one["policy"].keys() == two["policy"].keys()
    assert all(one["policy"][k].shape == two["policy"][k].shape for k in one["policy"])
    assert one["optim"]["state"].keys() == two["optim"]["state"].keys()
    for pid, st in one["optim"]["state"].items():
        assert st.keys() == two["optim"]["state"][pid].keys()
        for k, v in st.items():
            assert v.shape == two["optim"]["state"][pid][k].shape, (pid, k)


def _killed_after_step_1(rank, world, c):
    def hook(m, policy):                          # step 1's checkpoint is written before this
        if m["step"] == 1 and rank == world - 1:
            raise KeyboardInterrupt("killed")
    train(c, progress=False, on_step=hook)


def test_killed_fsdp2_run_resumes_on_3_processes_and_on_1(tmp_path, toy_runs):
    """The checkpoint after step 1 is whole: 2 -> 3 processes under fsdp2, and 2 -> 1 process
    under allreduce (another exchange: an override, recorded), both end as the run that never
    stopped."""
    c = toy(tmp_path / "run", FSDP2)
    with pytest.raises(launch.RankFailedError, match="KeyboardInterrupt"):
        launch.spawn(_killed_after_step_1, 2, (c,), run_timeout_s=300)
    ckpt = tmp_path / "run" / "checkpoint.safetensors"
    assert read_training_checkpoint(ckpt)["step"] == 1
    saved = ckpt.read_bytes()
    spawn_train([c], 3, resume=True, run_timeout_s=300, progress=False)
    never_stopped = params_of(toy_runs / "one")
    for k, v in params_of(tmp_path / "run").items():
        torch.testing.assert_close(v, never_stopped[k], atol=WEIGHTS_ATOL, rtol=0, msg=k)
    ckpt.write_bytes(saved)                                        # step 1 again, then 1 process
    history = train(dataclasses.replace(c, exchange=ExchangeConfig()), resume=True,
                    progress=False, allow_override=True)
    assert [h["step"] for h in history] == [-1, 0, 1, 2]
    assert history[3]["resume/overrides"] == {"exchange.name": ["fsdp2", "allreduce"]}
    for k, v in params_of(tmp_path / "run").items():
        torch.testing.assert_close(v, never_stopped[k], atol=WEIGHTS_ATOL, rtol=0, msg=k)


def _killed_in_the_final_write(rank, world, c):
    """Rank 0 (the writer) dies by SIGKILL half-way through the run's second checkpoint write
    (the final one, after step 2): the file half written, the process gone, no clean-up."""
    import os
    import signal

    import safetensors.torch

    from grpo_lab import checkpoint
    calls = []

    def dying_save(tensors, path, metadata):
        calls.append(path)
        safetensors.torch.save_file(tensors, path, metadata)
        if len(calls) == 2:
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
            os.kill(os.getpid(), signal.SIGKILL)
    checkpoint.save_file = dying_save
    train(c, progress=False)


def test_fsdp2_run_killed_mid_save_resumes_from_the_last_whole_checkpoint(tmp_path, toy_runs):
    """Issue 40's probe on the sharded path: the writer killed inside a checkpoint write leaves
    step 1's checkpoint whole and a stale .tmp; the resumed run (2 processes, fsdp2) deletes it
    and ends as the run that never stopped."""
    c = toy(tmp_path / "run", FSDP2)
    with pytest.raises(launch.RankFailedError):
        launch.spawn(_killed_in_the_final_write, 2, (c,), run_timeout_s=300)
    out = tmp_path / "run"
    tmps = list(out.glob("*.tmp"))
    assert len(tmps) == 1 and tmps[0].name.startswith("checkpoint.safetensors.")
    assert read_training_checkpoint(out / "checkpoint.safetensors")["step"] == 1
    spawn_train([c], 2, resume=True, run_timeout_s=300, progress=False)
    assert not list(out.glob("*.tmp"))
    assert read_training_checkpoint(out / "checkpoint.safetensors")["step"] == 2
    never_stopped = params_of(toy_runs / "one")
    for k, v in params_of(out).items():
        torch.testing.assert_close(v, never_stopped[k], atol=WEIGHTS_ATOL, rtol=0, msg=k)


# ---------------------------------------------------------------- the tiny transformers model


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("hf")
    train(hf(root / "one", **HF), progress=False)
    train(hf(root / "one_lora", **LORA), progress=False)
    spawn_train([hf(root / "fsdp2_2", FSDP2, **HF), hf(root / "fsdp2_2_lora", FSDP2, **LORA)],
                2, run_timeout_s=400, progress=False)
    spawn_train([hf(root / "fsdp2_3", FSDP2, **HF)], 3, run_timeout_s=400, progress=False)
    return root


def test_hf_model_under_fsdp2_on_2_and_3_processes_trains_as_one_process(hf_runs):
    """The lean decoder (hf.py) samples from the gathered weights: the same tokens on every N,
    after every update (fsdp.gathered bumps the weights' versions, so it re-stacks q/k/v)."""
    from grpo_lab.policies.hf import load_hf_policy
    base = load_hf_policy(hf("x").base_checkpoint).state_dict()
    found = {n: assert_same_run(hf_runs / "one", hf_runs / n, hf("x", **HF), base)
             for n in ("fsdp2_2", "fsdp2_3")}
    print("hf_tiny, largest weight difference from one process:", found)


def test_lora_under_fsdp2_trains_as_one_process(hf_runs):
    from grpo_lab.policies.hf import load_hf_policy
    c = hf("x", **LORA)
    base = load_hf_policy(c.base_checkpoint, lora_r=4).state_dict()
    got = assert_same_run(hf_runs / "one_lora", hf_runs / "fsdp2_2_lora", c, base)
    trained = params_of(hf_runs / "one_lora")
    frozen = [k for k in trained if "lora_" not in k]
    assert frozen and all(torch.equal(trained[k], base[k]) for k in frozen)   # base untouched
    print("hf_tiny LoRA, largest weight difference from one process:", got)


# ---------------------------------------------------------------- what it refuses


def test_bad_combinations_are_refused_by_name(tmp_path):
    def checked(name, **blocks):
        return check_records(TrainConfig(exchange={"name": name}, **blocks))
    with pytest.raises(ValueError, match=r"compression\.preset='fp16': the compression block is "
                                         r"read by exchange 'compressed' or 'sharded_compressed', "
                                         r"not by 'fsdp2'"):
        checked("fsdp2", compression={"preset": "fp16"})
    with pytest.raises(ValueError, match=r"sharding\.policy='importance_round_robin', "
                                         r"sharding\.reshard_every=2: .* not by 'fsdp2'"):
        checked("fsdp2", sharding={"policy": "importance_round_robin", "reshard_every": 2})
    with pytest.raises(ValueError, match=r"compression\.error_feedback=False: .* not by 'fsdp2'"):
        checked("fsdp2", compression={"error_feedback": False})
    with pytest.raises(ValueError, match=r"fsdp2\.reshard_after_forward=False: the fsdp2 block is "
                                         r"read by exchange 'fsdp2', not by 'compressed'"):
        checked("compressed", fsdp2={"reshard_after_forward": False})
    with pytest.raises(ValueError, match=r"unknown fsdp2\.param_dtype 'fp8'"):
        checked("fsdp2", fsdp2={"param_dtype": "fp8"})
    with pytest.raises(ValueError, match=r"hf\.sample_dtype='bfloat16' .* exchange 'fsdp2'"):
        hf(tmp_path, FSDP2, hf={"sample_dtype": "bfloat16"})
    with pytest.raises(ValueError, match=r"overlong\.rule='filter' .* exchange 'fsdp2'"):
        toy(tmp_path, FSDP2, overlong={"rule": "filter"})
    with pytest.raises(ValueError, match="exchange 'fsdp2' needs a process group"):
        train(toy(tmp_path / "alone", FSDP2), progress=False)
    checked("fsdp2", fsdp2={"reshard_after_forward": False, "param_dtype": "bfloat16"})  # its own


def _held_by_rank(rank, world):
    """One update of a small GPT under fsdp2 -> (weight elements this rank holds, the model's
    in all, AdamW moment elements in the whole state a checkpoint saves)."""
    from grpo_lab.distributed.exchanges import AdamW, make_exchange
    from grpo_lab.distributed.fsdp import local
    from grpo_lab.policies.model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_embd=16, n_head=2, block_size=16))
    whole = sum(p.numel() for p in model.parameters())
    ex = make_exchange(model, ExchangeConfig(name="fsdp2"), AdamW(lr=1e-3), world, rank)
    logits, _ = ex.module(torch.randint(0, 10, (2, 8)))
    logits.square().mean().backward()
    ex.reduce()
    ex.step()
    held = sum(local(p).numel() for p in model.parameters())
    state = ex.state_dict()                       # whole (a collective), as checkpoints save it
    return held, whole, sum(v.numel() for st in state["state"].values()
                            for k, v in st.items() if k != "step")


def test_each_rank_holds_its_share_of_the_weights():
    """The weights are sharded for real: the ranks' local shards partition every tensor (dim 0
    cut in N chunks), and the optimizer state gathered for a checkpoint is whole (2 moments)."""
    out = launch.spawn(_held_by_rank, 2, (), run_timeout_s=120)
    held = [h for h, _, _ in out]
    whole = out[0][1]
    assert sum(held) == whole and max(held) < 0.6 * whole
    assert all(m == 2 * whole for _, _, m in out)
