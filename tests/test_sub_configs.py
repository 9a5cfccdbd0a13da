"""Sub-configs: PPO's settings live in ``TrainConfig.ppo`` (ppo.PPOConfig), the transformers
policy's in ``TrainConfig.hf`` (hf.HFConfig), the gradient exchange's in ``TrainConfig.exchange``;
they round-trip through a saved config, take ``--ppo.*`` / ``--hf.*`` flags, and the flat names
of the first layout (``vf_lr``, ``hf_autocast``, ``lora_r``, ...) are not fields or flags."""
import pytest

from grpo_lab.cli import build_parser, train_config
from grpo_lab.training.config import check_records, TrainConfig, from_dict, preset, to_dict
from grpo_lab.training.saved_config import config_changes
from grpo_lab.policies.hf import HFConfig
from grpo_lab.training.ppo import PPOConfig

PPO = {"gamma": 0.9, "gae_lambda": 0.8, "vf_coef": 0.25, "vf_clip": 0.1, "critic": "network",
       "vf_lr": 1e-3}


def test_the_ppo_sub_config_round_trips():
    c = preset("quick", objective="ppo", ppo=PPO)
    assert c.ppo == PPOConfig(**PPO) and to_dict(c)["ppo"]["gae_lambda"] == 0.8
    assert from_dict(to_dict(c)) == c
    assert config_changes(to_dict(c), to_dict(c)) == {}
    given = to_dict(preset("quick", objective="ppo", ppo={**PPO, "vf_lr": 2e-3}))
    assert config_changes(to_dict(c), given) == {"ppo.vf_lr": [1e-3, 2e-3]}
    assert TrainConfig(objective="ppo", ppo=PPO).ppo == PPOConfig(**PPO)


def test_ppo_flags():
    args = build_parser().parse_args(["train", "--preset", "quick", "--objective", "ppo",
                                      "--ppo.vf_lr", "0.001", "--ppo.gamma", "0.9"])
    c = train_config(args)
    assert (c.ppo.vf_lr, c.ppo.gamma, c.ppo.critic) == (1e-3, 0.9, "head")


@pytest.mark.parametrize("old", ["vf_lr", "ppo_critic", "hf_autocast", "lora_r"])
def test_the_flat_names_are_neither_fields_nor_flags(old, capsys):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
        check_records(TrainConfig(**{old: 1}))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--preset", "quick", f"--{old}", "1"])
    assert f"unrecognized arguments: --{old} 1" in capsys.readouterr().err
    assert not hasattr(TrainConfig(), old)


def test_bad_ppo_values_are_named():
    with pytest.raises(ValueError, match="PPOConfig.vf_clip must be >= 0, got -0.1"):
        preset("quick", objective="ppo", ppo={"vf_clip": -0.1})
    with pytest.raises(ValueError, match=r"unknown ppo.critic 'mlp'; known: \['head', 'network'\]"):
        preset("quick", objective="ppo", ppo={"critic": "mlp"})


def test_building_a_config_has_no_side_effects():
    """TrainConfig(...) imports no plugin and registers no grouper; preset() does both."""
    from grpo_lab.algorithm.grouping import GROUPERS

    def halves_test(batch, k, seed=0):
        return [i % 2 for i in range(len(batch.prompts))]
    before = set(GROUPERS)
    assert TrainConfig(plugins="no_such_plugin_module").plugins == "no_such_plugin_module"
    with pytest.raises(ValueError, match="a config holds a grouper's name"):
        check_records(TrainConfig(grouping=halves_test))
    assert set(GROUPERS) == before
    with pytest.raises(ValueError, match="plugin 'no_such_plugin_module'"):
        preset("quick", plugins="no_such_plugin_module")
    try:
        assert preset("quick", grouping=halves_test).grouping == "halves_test"
        assert GROUPERS["halves_test"].fn is halves_test
    finally:
        GROUPERS.pop("halves_test", None)


# ---- the transformers policy's settings (hf.HFConfig)

HF = {"dtype": "bfloat16", "autocast": True, "chat_template": True, "trust_remote_code": False,
      "gradient_checkpointing": True, "sample_dtype": "bfloat16", "lora_r": 4, "lora_alpha": 8}


def test_the_hf_sub_config_round_trips():
    c = preset("hf_tiny_cpu", hf=HF)
    assert c.hf == HFConfig(**HF) and to_dict(c)["hf"]["sample_dtype"] == "bfloat16"
    assert from_dict(to_dict(c)) == c
    assert config_changes(to_dict(c), to_dict(c)) == {}
    assert TrainConfig(policy="hf", base_checkpoint="data/hf_tiny", hf=HF).hf == HFConfig(**HF)
    assert preset("hf_gpu").hf == HFConfig(autocast=True, chat_template=True,
                                           gradient_checkpointing=True)
    assert preset("hf_gpu", hf={"autocast": False}).hf.autocast is False
    assert preset("hf_gpu", hf={"autocast": False}).hf.chat_template is True  # merged, not replaced


def test_hf_flags():
    args = build_parser().parse_args(["train", "--preset", "hf_tiny_cpu", "--hf.autocast", "true",
                                      "--hf.chat_template", "false", "--hf.lora_r", "4",
                                      "--hf.dtype", "bfloat16"])
    c = train_config(args)
    assert (c.hf.autocast, c.hf.chat_template, c.hf.lora_r, c.hf.dtype) == \
        (True, False, 4, "bfloat16")
    args = build_parser().parse_args(["train", "--preset", "hf_gpu", "--hf.autocast", "false"])
    assert train_config(args).hf.autocast is False                   # "false" is False


def test_bad_hf_values_are_named():
    with pytest.raises(ValueError, match=r"unknown hf.dtype 'fp8'; known: "
                                         r"\['bfloat16', 'float16', 'float32'\]"):
        preset("hf_tiny_cpu", hf={"dtype": "fp8"})
    with pytest.raises(ValueError, match=r"unknown hf.sample_dtype 'int8'"):
        preset("hf_tiny_cpu", hf={"sample_dtype": "int8"})
    with pytest.raises(ValueError, match="HFConfig.lora_r must be >= 0, got -1"):
        preset("hf_tiny_cpu", hf={"lora_r": -1})
    with pytest.raises(ValueError, match=r"hf.lora_r=4 adds LoRA .* needs policy='hf'"):
        preset("quick", hf={"lora_r": 4})


def test_of_several_unknown_blocks_the_first_given_is_named_under_any_hash_seed():
    """Not whichever a set's (hash-seeded) order puts first: the same message every run."""
    import os
    import subprocess
    import sys
    code = ("from grpo_lab.training.config import TrainConfig\n"
            "try:\n    TrainConfig(blocks={'zzz': {}, 'aaa': {}, 'mmm': {}, 'kl': {}})\n"
            "except TypeError as e:\n    print(e)")
    said = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip()
            for seed in range(6)}
    assert said == {"TrainConfig got an unknown settings block 'zzz'"}
