"""The training loop: it learns, every parameter moves, resume is exact, kills lose little."""
import json

import pytest
import torch

from grpo_lab.checkpoint import CheckpointError
from grpo_lab.config import preset
from grpo_lab.model import load_policy
from grpo_lab.trainer import load_checkpoint, load_policy_any, train


def cfg(tmp_path, **kw):
    return preset("quick", out_dir=str(tmp_path / "run"), threads=1, **kw)


def test_short_run_raises_reward_and_moves_every_parameter(tmp_path):
    # a fixed pool of 16 training prompts, so 40 short steps revisit each one often
    c = cfg(tmp_path, steps=40, prompts_per_step=16, group_size=6, eval_every=0, lr=1e-4,
            train_pool=16)
    history = train(c, progress=False)
    rewards = [h["reward/mean"] for h in history if "reward/mean" in h]
    assert len(rewards) == 40
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.1, (first, last)
    base = load_policy(c.base_checkpoint).state_dict()
    trained = load_policy_any(tmp_path / "run" / "checkpoint.safetensors").state_dict()
    for name, p in base.items():
        assert not torch.equal(p, trained[name]), f"{name} did not change"
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 41 and "eval/accuracy" in json.loads(lines[-1])


def test_resume_continues_exactly(tmp_path):
    full = train(cfg(tmp_path / "a", steps=6, ckpt_every=3), progress=False)
    train(cfg(tmp_path / "b", steps=3, ckpt_every=3), progress=False)      # "killed" after 3
    resumed = train(cfg(tmp_path / "b", steps=6, ckpt_every=3), resume=True, progress=False)
    keys = ["loss/total", "reward/mean", "grad/norm", "loss/kl"]
    for a, b in zip(full[1:], resumed[1:]):
        assert a["step"] == b["step"]
        assert [a[k] for k in keys] == [b[k] for k in keys], a["step"]
    pa = load_policy_any(tmp_path / "a" / "run" / "checkpoint.safetensors").state_dict()
    pb = load_policy_any(tmp_path / "b" / "run" / "checkpoint.safetensors").state_dict()
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_kill_loses_only_steps_since_last_checkpoint(tmp_path):
    c = cfg(tmp_path, steps=10, ckpt_every=2)

    def die(m):
        if m["step"] == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(c, progress=False, on_step=die)
    path = tmp_path / "run" / "checkpoint.safetensors"
    policy = load_policy(c.base_checkpoint)
    opt = torch.optim.AdamW(policy.parameters())
    step, history, _ = load_checkpoint(path, policy, opt)
    assert step == 3 and history[-1]["step"] == 3                          # step 4 lost, 0-3 kept
    assert not list((tmp_path / "run").glob("*.tmp"))                      # no debris
    resumed = train(c, resume=True, progress=False)
    assert [h["step"] for h in resumed] == list(range(-1, 10))


def test_bad_checkpoints(tmp_path):
    c = cfg(tmp_path, steps=2)
    with pytest.raises(CheckpointError, match="no checkpoint file"):
        train(c, resume=True, progress=False)
    run = tmp_path / "run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "checkpoint.safetensors").write_bytes(open(c.base_checkpoint, "rb").read()[:500])
    with pytest.raises(CheckpointError, match="truncated or foreign"):
        train(c, resume=True, progress=False)
    (run / "checkpoint.safetensors").write_bytes(open(c.base_checkpoint, "rb").read())
    with pytest.raises(CheckpointError, match="not a grpo_lab training checkpoint"):
        train(c, resume=True, progress=False)


@pytest.mark.parametrize("field,value,msg", [
    ("group_size", 1, "group_size \\(G\\) must be >= 2"),
    ("advantage", "ppo", "unknown advantage 'ppo'"),
    ("aggregation", "sum", "unknown aggregation 'sum'"),
    ("lr", -1.0, "lr must be > 0"),
    ("prompts_per_step", 0, "prompts_per_step must be > 0"),
    ("task", "chess", "unknown task 'chess'"),
    ("reward_weights", {"speed": 1.0}, "unknown reward function 'speed'"),
    ("eps_low", 1.5, "eps_low"),
])
def test_invalid_config(tmp_path, field, value, msg):
    with pytest.raises(ValueError, match=msg):
        cfg(tmp_path, **{field: value})
