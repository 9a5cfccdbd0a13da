"""The advantage explorer, driven without a browser."""
import pytest
import torch

from grpo_lab.algorithm.advantages import ADVANTAGES
from grpo_lab.teaching.widgets.advantage import advantage_explorer, explain_group


def test_sliders_drive_the_advantages():
    box, parts = advantage_explorer(rewards=[1.0, 0.0, 0.0, 1.0], lengths=[2, 2, 3, 3])
    # by hand: mean 0.5, std 0.57735 -> +-0.865875
    assert parts["data"]["advantages"]["grpo"] == pytest.approx([0.865875, -0.865875,
                                                                 -0.865875, 0.865875], abs=1e-5)
    html_before = parts["advantages"].value
    parts["reward_1"].value = 1.0                                          # observers fire
    want = ADVANTAGES["grpo"](torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long))
    assert parts["data"]["advantages"]["grpo"] == pytest.approx(want.tolist())
    assert parts["advantages"].value != html_before
    parts["reward_0"].value = parts["reward_2"].value = parts["reward_3"].value = 1.0
    assert parts["data"]["advantages"]["grpo"] == [0.0, 0.0, 0.0, 0.0]     # equal: no signal


def test_token_push_follows_the_aggregation():
    d = explain_group([1.0, 0.0], [2, 4], "dr_grpo", "seq_mean_token_mean")
    # A = +0.5, -0.5; weight 1 / (G |o_i|): 0.5 / (2*2) = 0.125 and -0.5 / (2*4) = -0.0625
    assert d["token_push"][0][:2] == pytest.approx([0.125, 0.125])
    assert d["token_push"][1] == pytest.approx([-0.0625] * 4)
    d = explain_group([1.0, 0.0], [2, 4], "dr_grpo", "token_mean")          # 1 / 6 tokens
    assert d["token_push"][0][0] == pytest.approx(0.5 / 6)


def test_bad_input():
    with pytest.raises(ValueError, match="at least 2 rewards, got 1"):
        advantage_explorer(rewards=[1.0])
    with pytest.raises(ValueError, match="3 lengths for 2 rewards"):
        explain_group([1.0, 0.0], [1, 2, 3])


def test_loss_is_zero_at_ratio_one_while_its_gradient_is_not():
    """seq_mean_token_mean: each completion weighs 1/G, so the loss is -mean(A) = 0; the push on a
    token is A_i / (G |o_i|), so the gradient's norm is that of those pushes, by hand."""
    d = explain_group([1.0, 0.0], [2, 4], "dr_grpo", "seq_mean_token_mean")
    assert d["loss"] == pytest.approx(0.0, abs=1e-7)
    assert d["grad_norm"] == pytest.approx((2 * 0.125 ** 2 + 4 * 0.0625 ** 2) ** 0.5)
    d = explain_group([1.0, 0.0], [2, 4], "dr_grpo", "token_mean")          # longer weighs more:
    assert d["loss"] == pytest.approx(-(2 * 0.5 - 4 * 0.5) / 6)              # not 0 any more
    d = explain_group([1.0, 1.0], [2, 4])                                     # equal rewards
    assert d["loss"] == 0 and d["grad_norm"] == 0                             # no signal at all
    box, parts = advantage_explorer(rewards=[1.0, 0.0, 0.0, 1.0], lengths=[2, 2, 3, 3])
    assert "gradient's norm" in parts["advantages"].value and parts["data"]["grad_norm"] > 0
