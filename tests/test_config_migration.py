"""Sub-configs with a migration: PPO's settings moved into ``TrainConfig.ppo`` (ppo.PPOConfig),
the transformers policy's into ``TrainConfig.hf`` (hf.HFConfig);
configs saved with the old flat names (checkpoints of earlier runs), old keyword arguments and
old flags still give the same config, and a run saved that way still resumes."""
import json
from pathlib import Path

import pytest

from grpo_lab.checkpoint import atomic_save_tensors, read_tensors
from grpo_lab.cli import build_parser, train_config
from grpo_lab.training.config import MOVED_FIELDS, TrainConfig, config_changes, from_dict, preset, to_dict
from grpo_lab.policies.hf import HFConfig
from grpo_lab.training.ppo import PPOConfig
from grpo_lab.training.trainer import train

OLD = {"ppo_gamma": 0.9, "ppo_lambda": 0.8, "vf_coef": 0.25, "vf_clip": 0.1,
       "ppo_critic": "network", "vf_lr": 1e-3}
NEW = PPOConfig(gamma=0.9, gae_lambda=0.8, vf_coef=0.25, vf_clip=0.1, critic="network",
                vf_lr=1e-3)


def flat(d: dict) -> dict:
    """A saved config as runs before the sub-configs (ppo, hf) wrote it."""
    d = dict(d)
    nested = {sub: d.pop(sub) for sub, _ in MOVED_FIELDS.values() if sub in d}
    d.update({old: nested[sub][new] for old, (sub, new) in MOVED_FIELDS.items()})
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


def run_and_flatten(cfg) -> tuple[list[dict], dict]:
    """Run ``cfg("a")`` whole; run ``cfg("b")`` stopped during step 2 (its checkpoint holds
    steps 0-1) and rewrite that checkpoint's config flat, as older versions wrote it ->
    (the whole run's history, the flat config written)."""
    full = train(cfg("a"), progress=False)

    def stop(m, policy):
        if m["step"] == 2:
            raise Stop

    with pytest.raises(Stop):
        train(cfg("b"), progress=False, on_step=stop)
    ckpt = Path(cfg("b").out_dir) / "checkpoint.safetensors"
    tensors, meta = read_tensors(ckpt)
    old = flat(json.loads(meta["config"]))
    meta["config"] = json.dumps(old)
    atomic_save_tensors(tensors, ckpt, meta)
    return full, old


def test_a_checkpoint_with_the_old_flat_config_resumes(tmp_path):
    def cfg(name):
        return preset("quick", objective="ppo", steps=4, ckpt_every=2, eval_size=5, threads=1,
                      out_dir=str(tmp_path / name), vf_lr=1e-3)
    full, _ = run_and_flatten(cfg)
    resumed = train(cfg("b"), resume=True, progress=False)          # steps 2, 3
    keys = ["loss/total", "ppo/value_loss", "reward/mean"]
    assert [[h[k] for k in keys] for h in full[1:]] == [[h[k] for k in keys] for h in resumed[1:]]


def test_building_a_config_has_no_side_effects():
    """TrainConfig(...) imports no plugin and registers no grouper; preset() does both."""
    from grpo_lab.algorithm.grouping import GROUPERS

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


# ---- the transformers policy's settings moved into TrainConfig.hf (hf.HFConfig)

OLD_HF = {"hf_dtype": "bfloat16", "hf_autocast": True, "hf_chat_template": True,
          "hf_trust_remote_code": False, "hf_gradient_checkpointing": True,
          "hf_sample_dtype": "bfloat16", "lora_r": 4, "lora_alpha": 8}
NEW_HF = HFConfig(dtype="bfloat16", autocast=True, chat_template=True, trust_remote_code=False,
                  gradient_checkpointing=True, sample_dtype="bfloat16", lora_r=4, lora_alpha=8)


def test_old_hf_names_give_the_nested_config():
    c = preset("hf_tiny_cpu", **OLD_HF)
    assert c.hf == NEW_HF and to_dict(c)["hf"]["sample_dtype"] == "bfloat16"
    assert (c.hf_dtype, c.hf_autocast, c.lora_r, c.lora_alpha) == ("bfloat16", True, 4, 8)
    assert from_dict(flat(to_dict(c))) == c
    assert config_changes(flat(to_dict(c)), c) == {}
    assert TrainConfig(policy="hf", base_checkpoint="data/hf_tiny", **OLD_HF).hf == NEW_HF
    assert TrainConfig(policy="hf", base_checkpoint="data/hf_tiny", hf_dtype="float16",
                       hf={"dtype": "bfloat16"}).hf.dtype == "bfloat16"   # the nested one wins
    # the presets now write the nested form; the old flat one gives the same config
    assert preset("hf_gpu").hf == HFConfig(autocast=True, chat_template=True,
                                           gradient_checkpointing=True)
    assert preset("hf_gpu", hf_autocast=False).hf.autocast is False
    assert preset("hf_gpu", hf_autocast=False).hf.chat_template is True  # merged, not replaced


def test_old_and_new_hf_flags():
    args = build_parser().parse_args(["train", "--preset", "hf_tiny_cpu", "--hf_autocast", "true",
                                      "--hf_chat_template", "false", "--lora_r", "4",
                                      "--hf.dtype", "bfloat16"])
    c = train_config(args)
    assert (c.hf.autocast, c.hf.chat_template, c.hf.lora_r, c.hf.dtype) == \
        (True, False, 4, "bfloat16")
    args = build_parser().parse_args(["train", "--preset", "hf_gpu", "--hf_autocast", "false"])
    assert train_config(args).hf.autocast is False                   # "false" is False


def test_bad_hf_values_are_named():
    with pytest.raises(ValueError, match=r"unknown hf.dtype 'fp8'; known: "
                                         r"\['bfloat16', 'float16', 'float32'\]"):
        preset("hf_tiny_cpu", hf={"dtype": "fp8"})
    with pytest.raises(ValueError, match=r"unknown hf.sample_dtype 'int8'"):
        preset("hf_tiny_cpu", hf_sample_dtype="int8")
    with pytest.raises(ValueError, match="HFConfig.lora_r must be >= 0, got -1"):
        preset("hf_tiny_cpu", lora_r=-1)
    with pytest.raises(ValueError, match=r"hf.lora_r=4 adds LoRA .* needs policy='hf'"):
        preset("quick", hf={"lora_r": 4})


def test_an_hf_checkpoint_with_the_old_flat_config_resumes(tmp_path):
    def cfg(name):
        return preset("hf_tiny_cpu", steps=4, ckpt_every=2, prompts_per_step=4, group_size=4,
                      eval_every=0, eval_size=5, threads=1, time_budget_s=0.0, beta=0.05,
                      out_dir=str(tmp_path / name), hf_gradient_checkpointing=True)
    full, old = run_and_flatten(cfg)
    assert "hf" not in old and old["hf_gradient_checkpointing"] is True
    ckpt = tmp_path / "b" / "checkpoint.safetensors"
    args = build_parser().parse_args(["train", "--resume", "--out_dir", str(tmp_path / "b")])
    assert train_config(args) == cfg("b")           # --resume reads the flat names into hf
    resumed = train(cfg("b"), resume=True, progress=False)          # steps 2, 3
    keys = ["loss/total", "loss/kl", "reward/mean"]
    assert [[h[k] for k in keys] for h in full[1:]] == [[h[k] for k in keys] for h in resumed[1:]]
    saved = json.loads(read_tensors(ckpt)[1]["config"])             # written again, nested
    assert saved["hf"]["gradient_checkpointing"] is True and "hf_gradient_checkpointing" not in saved
