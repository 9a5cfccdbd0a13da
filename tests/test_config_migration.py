"""Sub-configs with a migration: PPO's settings moved into ``TrainConfig.ppo`` (ppo.PPOConfig);
configs saved with the old flat names (checkpoints of earlier runs), old keyword arguments and
old flags still give the same config, and a run saved that way still resumes."""
import json

import pytest

from grpo_lab.checkpoint import atomic_save_tensors, read_tensors
from grpo_lab.cli import build_parser, train_config
from grpo_lab.config import MOVED_FIELDS, TrainConfig, config_changes, from_dict, preset, to_dict
from grpo_lab.ppo import PPOConfig
from grpo_lab.trainer import train

OLD = {"ppo_gamma": 0.9, "ppo_lambda": 0.8, "vf_coef": 0.25, "vf_clip": 0.1,
       "ppo_critic": "network", "vf_lr": 1e-3}
NEW = PPOConfig(gamma=0.9, gae_lambda=0.8, vf_coef=0.25, vf_clip=0.1, critic="network",
                vf_lr=1e-3)


def flat(d: dict) -> dict:
    """A saved config as runs before the sub-config wrote it."""
    d = dict(d)
    ppo = d.pop("ppo")
    d.update({old: ppo[new] for old, (_, new) in MOVED_FIELDS.items()})
    return d


def test_old_names_give_the_nested_config():
    c = preset("quick", objective="ppo", **OLD)
    assert c.ppo == NEW and to_dict(c)["ppo"]["gae_lambda"] == 0.8
    assert (c.vf_lr, c.ppo_critic, c.ppo_lambda) == (1e-3, "network", 0.8)   # old reads
    assert from_dict(flat(to_dict(c))) == c
    assert config_changes(flat(to_dict(c)), c) == {}
    assert TrainConfig(objective="ppo", **OLD).ppo == NEW
    assert TrainConfig(objective="ppo", vf_lr=1e-3, ppo={"vf_lr": 2e-3}).ppo.vf_lr == 2e-3


def test_old_and_new_flags():
    args = build_parser().parse_args(["train", "--preset", "quick", "--objective", "ppo",
                                      "--vf_lr", "0.001", "--ppo.gamma", "0.9"])
    c = train_config(args)
    assert (c.ppo.vf_lr, c.ppo.gamma, c.ppo.critic) == (1e-3, 0.9, "head")


def test_bad_ppo_values_are_named():
    with pytest.raises(ValueError, match="PPOConfig.vf_clip must be >= 0, got -0.1"):
        preset("quick", objective="ppo", ppo={"vf_clip": -0.1})
    with pytest.raises(ValueError, match=r"unknown ppo_critic 'mlp'; known: \['head', 'network'\]"):
        preset("quick", objective="ppo", ppo={"critic": "mlp"})


class Stop(Exception):
    pass


def test_a_checkpoint_with_the_old_flat_config_resumes(tmp_path):
    def cfg(name):
        return preset("quick", objective="ppo", steps=4, ckpt_every=2, eval_size=5, threads=1,
                      out_dir=str(tmp_path / name), vf_lr=1e-3)
    full = train(cfg("a"), progress=False)

    def stop(m, policy):             # stopped during step 2: the checkpoint holds steps 0-1
        if m["step"] == 2:
            raise Stop

    with pytest.raises(Stop):
        train(cfg("b"), progress=False, on_step=stop)
    ckpt = tmp_path / "b" / "checkpoint.safetensors"
    tensors, meta = read_tensors(ckpt)
    meta["config"] = json.dumps(flat(json.loads(meta["config"])))   # as older versions wrote it
    atomic_save_tensors(tensors, ckpt, meta)
    resumed = train(cfg("b"), resume=True, progress=False)          # steps 2, 3
    keys = ["loss/total", "ppo/value_loss", "reward/mean"]
    assert [[h[k] for k in keys] for h in full[1:]] == [[h[k] for k in keys] for h in resumed[1:]]


def test_building_a_config_has_no_side_effects():
    """TrainConfig(...) imports no plugin and registers no grouper; preset() does both."""
    from grpo_lab.grouping import GROUPERS

    def halves_test(batch, k, seed=0):
        return [i % 2 for i in range(len(batch.prompts))]
    before = set(GROUPERS)
    assert TrainConfig(plugins="no_such_plugin_module").plugins == "no_such_plugin_module"
    with pytest.raises(ValueError, match="a config holds a grouper's name"):
        TrainConfig(grouping=halves_test)
    assert set(GROUPERS) == before
    with pytest.raises(ValueError, match="plugin 'no_such_plugin_module'"):
        preset("quick", plugins="no_such_plugin_module")
    try:
        assert preset("quick", grouping=halves_test).grouping == "halves_test"
        assert GROUPERS["halves_test"].fn is halves_test
    finally:
        GROUPERS.pop("halves_test", None)
