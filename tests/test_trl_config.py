"""``--config`` reads a TRL GRPOConfig file: TRL's key names as the grpo_lab settings that mean
the same (training/trl_keys.py), the batch arithmetic as TRL's, the rest refused by name."""
import json
from pathlib import Path

import pytest

from grpo_lab.cli import build_parser, main, train_config
from grpo_lab.training import trl_keys

ROOT = Path(__file__).resolve().parent.parent

TRL_YAML = """\
# a TRL GRPOConfig (trl 1.16), as a TRL user writes it
learning_rate: 5.0e-5
num_generations: 4
per_device_train_batch_size: 8
gradient_accumulation_steps: 2
max_completion_length: 6
max_steps: 3
beta: 0.04
epsilon: 0.2
epsilon_high: 0.28
temperature: 0.9
seed: 7
loss_type: dapo
scale_rewards: none
num_iterations: 2
mask_truncated_completions: true
"""


def write(tmp_path, text, name="grpo.yaml"):
    pytest.importorskip("yaml")
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def cfg_of(argv):
    return train_config(build_parser().parse_args(["train", *argv]))


def test_a_trl_file_means_the_same_settings(tmp_path):
    cfg = cfg_of(["--config", write(tmp_path, TRL_YAML), "--preset", "quick"])
    assert (cfg.lr, cfg.group_size, cfg.max_new_tokens, cfg.steps) == (5e-5, 4, 6, 3)
    assert (cfg.kl.beta, cfg.clip.eps_low, cfg.clip.eps_high, cfg.temperature, cfg.seed) == (
        0.04, 0.2, 0.28, 0.9, 7)
    assert (cfg.loss.aggregation, cfg.advantage, cfg.mu, cfg.overlong.rule) == (
        "token_mean", "mean_centred", 2, "mask")
    # TRL: generation batch = 8 per device x 2 accumulation steps x 1 process = 16
    # completions per optimizer step = 16 / 4 generations = 4 prompts
    assert cfg.prompts_per_step == 4


def test_epsilon_alone_is_both_clips_as_in_trl(tmp_path):
    cfg = cfg_of(["--config", write(tmp_path, "epsilon: 0.1\n")])
    assert (cfg.clip.eps_low, cfg.clip.eps_high) == (0.1, 0.1)


def test_a_trl_grpo_config_yaml_trains(tmp_path, capsys):
    out = tmp_path / "run"
    path = write(tmp_path, TRL_YAML + f"output_dir: {out}\n")
    assert main(["train", "--config", path, "--preset", "quick", "--eval_size", "10",
                 "--threads", "1"]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] >= 0] == [0, 1, 2]
    saved = json.loads((out / "config.json").read_text())
    assert (saved["lr"], saved["group_size"], saved["prompts_per_step"], saved["mu"]) == (
        5e-5, 4, 4, 2)


@pytest.mark.parametrize("text, said", [
    ("num_train_epochs: 3\nuse_vllm: true\nlearning_rate: 1.0e-5\n",
     "TRL GRPOConfig keys with no grpo_lab equivalent: num_train_epochs, use_vllm"),
    ("vllm_importance_sampling_mode: sequence_mask\n",
     "TRL GRPOConfig key with no grpo_lab equivalent: vllm_importance_sampling_mode (the table: "
     "docs/guide/methods.md, 'A TRL GRPOConfig file'); vllm_importance_sampling_mode is TRL's, "
     "applied with use_vllm only: grpo_lab's tis.level (TRL's four names) with --rollout vllm"),
    ("loss_type: bnpo\n", "loss_type='bnpo' has no grpo_lab equivalent (these have: 'grpo', "
                          "'dapo', 'dr_grpo', 'cispo')"),
    ("scale_rewards: batch\n", "scale_rewards='batch' has no grpo_lab equivalent"),
    ("loss_type: [grpo]\n", "loss_type=['grpo'] has no grpo_lab equivalent (these have: "),
    ("scale_rewards: {a: 1}\n", "scale_rewards={'a': 1} has no grpo_lab equivalent"),
    ("lr: 0.001\nlearning_rate: 0.002\n", "lr is given twice: by lr and by learning_rate"),
    ("per_device_train_batch_size: 6\nnum_generations: 4\n",
     "generation batch 6 (per_device_train_batch_size 6 x gradient_accumulation_steps 1) is "
     "not a multiple of num_generations 4"),
    ("steps_per_generation: 4\n", "steps_per_generation=4 with gradient_accumulation_steps=1"),
])
def test_what_has_no_equivalent_is_named(tmp_path, capsys, text, said):
    path = write(tmp_path, text)
    assert main(["train", "--config", path, "--out_dir", str(tmp_path / "run")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"grpo-lab: error: --config {path}: {said}"), line
    assert not (tmp_path / "run").exists()


def test_every_key_of_the_mapping_is_in_the_documented_table():
    doc = (ROOT / "docs/guide/methods.md").read_text()
    table = doc.split("## A TRL GRPOConfig file", 1)[1]
    for key in [*trl_keys.RENAMED, *trl_keys.CONVERTED, *trl_keys.BATCH]:
        assert f"`{key}`" in table, key
    for key, field in trl_keys.RENAMED.items():
        assert f"| `{key}` | `{field}` |" in table, key


@pytest.mark.parametrize("text, cap", [
    ("loss_type: cispo\nepsilon_high: 5.0\n", 5.0),              # TRL's docs: the cap itself
    ("loss_type: cispo\nepsilon: 0.2\nepsilon_high: 4.0\n", 4.0),  # epsilon: not read by cispo
    ("loss_type: cispo\nepsilon: 3.0\n", 3.0),                   # epsilon_high defaults to it
    ("loss_type: cispo\n", 5.0),                                 # neither: grpo_lab's default
])
def test_trl_cispo_maps_epsilon_high_to_the_cap_itself(tmp_path, text, cap):
    # TRL 1.16 _compute_loss: clamp(coef_1, max=self.epsilon_high), normalised by the tokens
    cfg = cfg_of(["--config", write(tmp_path, text), "--preset", "quick"])
    assert (cfg.loss.policy, cfg.loss.aggregation, cfg.clip.cispo_cap, cfg.clip.cispo_floor) == (
        "cispo", "token_mean", cap, 0.0)
    assert (cfg.clip.eps_low, cfg.clip.eps_high) == (0.2, 0.28)          # untouched, unread
