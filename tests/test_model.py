"""Toy policy: KV cache and padding equivalences, safe save/load, config errors."""
import pytest
import torch
from safetensors.torch import save_file

from grpo_lab.checkpoint import CheckpointError
from grpo_lab.policies.model import GPT, GPTConfig, load_policy, save_policy
from grpo_lab.policies.engine import positions


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=16)).eval()


def test_cached_forward_equals_full_forward(model):
    idx = torch.randint(2, 40, (3, 10))
    full, _ = model(idx)                                                   # (3, 10, V)
    logits, cache = model(idx[:, :6])
    steps = [logits]
    for t in range(6, 10):
        logits, cache = model(idx[:, t:t + 1], cache=cache)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_left_padding_does_not_change_real_tokens(model):
    idx = torch.randint(2, 40, (1, 5))
    ref, _ = model(idx)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), idx], 1)      # 3 pads on the left
    mask = padded != 0
    out, _ = model(padded, positions(mask), mask)
    torch.testing.assert_close(out[:, 3:], ref, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()                                       # pad rows: no NaN


def test_save_load_round_trip(model, tmp_path):
    save_policy(model, tmp_path / "p.safetensors")
    loaded = load_policy(tmp_path / "p.safetensors")
    assert loaded.cfg == model.cfg
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    assert loaded.lm_head.weight is loaded.wte.weight                     # tying survives


def test_truncated_foreign_and_missing_files(model, tmp_path):
    path = tmp_path / "p.safetensors"
    save_policy(model, path)
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or foreign"):
        load_policy(tmp_path / "cut.safetensors")
    (tmp_path / "junk.bin").write_bytes(b"\x00not a checkpoint at all" * 10)
    with pytest.raises(CheckpointError, match="truncated or foreign"):
        load_policy(tmp_path / "junk.bin")
    save_file({"w": torch.zeros(2)}, str(tmp_path / "other.safetensors"), {"format": "someone"})
    with pytest.raises(ValueError, match="not a grpo_lab policy file"):
        load_policy(tmp_path / "other.safetensors")
    with pytest.raises(CheckpointError, match="no checkpoint file"):
        load_policy(tmp_path / "missing.safetensors")


def test_config_errors():
    with pytest.raises(ValueError, match="n_embd=30 is not divisible by n_head=4"):
        GPTConfig(n_embd=30)
    with pytest.raises(ValueError, match="n_layer must be positive, got 0"):
        GPTConfig(n_layer=0)
    m = GPT(GPTConfig(block_size=8, n_layer=1, n_embd=16))
    with pytest.raises(ValueError, match="past block_size=8"):
        m(torch.ones(1, 9, dtype=torch.long))


@pytest.mark.parametrize("path", ["data/base_policy.safetensors",
                                  "data/base_mixture.safetensors"])
def test_shipped_policies_load_and_run(path):
    from grpo_lab.tasks import encode
    model = load_policy(path)
    logits, _ = model(torch.tensor([encode("12+34=")]))                 # (1, 6, V)
    assert logits.shape == (1, 6, model.cfg.vocab_size) and torch.isfinite(logits).all()


def test_mixture_base_names_its_recipe():
    import json
    from grpo_lab.checkpoint import read_tensors
    recipe = json.loads(read_tensors("data/base_mixture.safetensors")[1]["pretrain_config"])
    assert recipe["tasks"].split(",") == ["addition", "sort", "reverse", "count", "compare",
                                          "max", "min"]
    assert (recipe["steps"], recipe["stop_after"], recipe["seed"]) == (3000, 1800, 0)
