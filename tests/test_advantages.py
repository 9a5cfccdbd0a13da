"""Group-relative advantages against values worked out by hand."""
import math
from pathlib import Path

import pytest
import torch

from grpo_lab.algorithm.advantages import ADVANTAGES, COMBINE, EPS, grouped_advantages

T = torch.tensor


def test_grpo_one_group_by_hand():
    # mean 0.5; unbiased std = sqrt(4 * 0.25 / 3) = 0.577350; 0.5 / (0.577350 + 1e-4) = 0.865875
    adv = ADVANTAGES["grpo"](T([1.0, 0.0, 0.0, 1.0]), T([0, 0, 0, 0]))
    torch.testing.assert_close(adv, T([0.8658754, -0.8658754, -0.8658754, 0.8658754]),
                               rtol=0, atol=1e-6)


def test_two_groups_any_ids_and_sizes():
    r, g = T([1.0, 2.0, 3.0, 5.0, 5.0]), T([7, 7, 7, 2, 2])
    # group 7: mean 2, std 1 -> (r - 2) / (1 + 1e-4); group 2: all equal -> 0
    torch.testing.assert_close(ADVANTAGES["grpo"](r, g),
                               T([-0.99990001, 0.0, 0.99990001, 0.0, 0.0]), rtol=0, atol=1e-7)
    torch.testing.assert_close(ADVANTAGES["dr_grpo"](r, g), T([-1.0, 0.0, 1.0, 0.0, 0.0]))
    # rloo: 1 - (2+3)/2 = -1.5, 2 - (1+3)/2 = 0, 3 - (1+2)/2 = 1.5
    torch.testing.assert_close(ADVANTAGES["rloo"](r, g), T([-1.5, 0.0, 1.5, 0.0, 0.0]))


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_equal_rewards_and_singletons_give_zero_not_nan(name):
    adv = ADVANTAGES[name](T([0.3, 0.3, 0.3, 1.0]), T([0, 0, 0, 1]))
    assert torch.isfinite(adv).all()
    torch.testing.assert_close(adv, torch.zeros(4))


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_bad_input(name):
    fn = ADVANTAGES[name]
    with pytest.raises(ValueError, match="sample 2 is nan"):
        fn(T([0.0, 1.0, float("nan")]), T([0, 0, 0]))
    with pytest.raises(ValueError, match="inf"):
        fn(T([float("inf"), 1.0]), T([0, 0]))
    with pytest.raises(ValueError, match="shapes"):
        fn(T([0.0, 1.0]), T([0, 0, 0]))
    with pytest.raises(ValueError, match="empty"):
        fn(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="integers"):
        fn(T([0.0, 1.0]), T([0.0, 0.0]))


def test_process_supervision_by_hand():
    from grpo_lab.algorithm.advantages import process_advantages
    from grpo_lab.tasks import Example
    from grpo_lab.tasks.rewards import step_rewards

    ex = [Example("12+34=", "46", "addition")] * 2
    steps = step_rewards(["46", "47"], ex, [True, True])
    assert steps == [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]]                    # digits, then <eos>
    # all six step rewards: mean 5/6, unbiased std sqrt(1/6) = 0.408248 (+1e-4)
    # normalised: 1 -> 0.408148, 0 -> -2.040741; advantage = sum of own and later steps
    adv = process_advantages(torch.tensor(steps), torch.ones(2, 3, dtype=torch.bool),
                             T([0, 0]))
    torch.testing.assert_close(adv, T([[1.224444, 0.816296, 0.408148],
                                       [-1.224445, -1.632593, 0.408148]]), rtol=0, atol=2e-6)
    # padding stays 0; a stop at the wrong length earns no <eos> reward; cut-off: no <eos> step
    assert step_rewards(["4", "461"], ex, [True, False]) == [[1.0, 0.0], [1.0, 1.0, 0.0]]
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = process_advantages(torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]), mask, T([3, 3]))
    assert adv[0, 2] == 0 and torch.isfinite(adv).all()


def test_process_supervision_bad_shapes():
    from grpo_lab.algorithm.advantages import process_advantages

    with pytest.raises(ValueError, match="one \\(N, T\\) shape"):
        process_advantages(torch.zeros(2, 3), torch.ones(2, 2, dtype=torch.bool), T([0, 0]))
    with pytest.raises(ValueError, match="group_ids"):
        process_advantages(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), T([0]))


def test_reinforce_pp_baseline_gives_a_group_of_one_c_0_where_verl_gives_c_r():
    """Stated in docs/guide/methods.md: verl takes a lone completion's group mean as 0 (c = r
    = 2 here, A = [0.5, -1.5, 1.0] / 1.5); grpo_lab's c is r - r = 0. By hand: c = [0.5,
    -0.5, 0], mu = 0, var = 0.5 / 2 = 0.25, A = c / sqrt(0.25 + 1e-8)."""
    from grpo_lab.algorithm.advantages import reinforce_pp_baseline_advantages
    a = reinforce_pp_baseline_advantages(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0, 0, 1]))
    s = (0.25 + 1e-8) ** 0.5
    torch.testing.assert_close(a, torch.tensor([0.5 / s, -0.5 / s, 0.0]), atol=1e-7, rtol=0)
    methods = (Path(__file__).resolve().parent.parent / "docs/guide/methods.md").read_text()
    assert "a group of one: c = 0 (verl: its baseline is 0, c = r)" in methods


def test_pooled_std_coerces_int_and_list_rewards_as_every_estimator_does():
    # int rewards came back as int64 advantages, truncated to [0, 0]; a list was an
    # AttributeError. One prompt of rewards 1, 0: (r - 0.5) / (sqrt(0.5) + EPS)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    adv = grouped_advantages([0], T([0, 0]), T([1, 0]), combine="within_prompt_pooled_std")
    assert adv.dtype == torch.float32 and adv.tolist() == pytest.approx([a, -a], rel=1e-6)
    adv = COMBINE["within_prompt_pooled_std"]([1, 0], [0, 0], T([0, 0]))
    assert adv.dtype == torch.float32 and adv.tolist() == pytest.approx([a, -a], rel=1e-6)


def test_reinforce_pp_baseline_refuses_nan_or_inf_lengths():
    # NaN < 0 and inf < 0 are False: both passed and every advantage came back NaN
    fn = ADVANTAGES["reinforce_pp_baseline"]
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"finite and >= 0, got \\[{bad}, 1.0\\]"):
            fn(T([1.0, 0.0]), T([0, 0]), lengths=[bad, 1])
    # lengths 3, 1: c = +-0.5, mu = (1.5 - 0.5) / 4 = 0.25, var = (3 * 0.0625 + 0.5625) / 3
    # = 0.25, A = (c - mu) / sqrt(0.25 + 1e-8) = 0.5, -1.5
    assert fn(T([1.0, 0.0]), T([0, 0]), lengths=[3, 1]).tolist() == pytest.approx([0.5, -1.5])


@pytest.mark.parametrize("eps", [0.0, float("nan"), -1e-4, float("inf")])
def test_eps_must_be_a_finite_number_above_0(eps):
    # eps 0 or NaN made the all-equal group 0 / 0 = NaN, a negative eps shrank the divisor
    # (1 / (std - 1e-4)); both came back as advantages without a word
    from grpo_lab.algorithm.advantages import (batch_std_advantages, grpo_advantages,
                                               process_advantages)
    r, g = T([1.0, 1.0, 0.0, 1.0]), T([0, 0, 1, 1])
    for call in (lambda: grpo_advantages(r, g, eps=eps), lambda: batch_std_advantages(r, g, eps),
                 lambda: process_advantages(torch.ones(2, 3), torch.ones(2, 3), T([0, 0]), eps)):
        with pytest.raises(ValueError, match=f"eps must be a finite number > 0, got {eps}"):
            call()
    # a positive eps is taken as before: group 1, mean 0.5, std sqrt(0.5), (r - 0.5) / (std + eps)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert grpo_advantages(r, g, eps=1e-6).tolist() == pytest.approx([0, 0, -a, a], rel=1e-6)


def test_grouped_advantages_takes_a_list_prompt_index_and_refuses_floats_by_name():
    # a list was a bare TypeError ('>=' between list and int), a float tensor an IndexError
    r = T([1.0, 0.0, 1.0, 1.0])
    a = 0.5 / (math.sqrt(0.5) + EPS)                                   # prompt 0: r 1, 0
    for pi in ([0, 0, 1, 1], T([0, 0, 1, 1]), T([0, 0, 1, 1]).int()):
        assert grouped_advantages([0, 1], pi, r).tolist() == pytest.approx([a, -a, 0, 0])
    for pi in ([0.0, 0.5, 1.0, 1.0], T([0.0, 0.0, 1.0, 1.0]), [True, True, False, False]):
        with pytest.raises(ValueError, match="prompt_index must be integers \\(the prompt of "
                                             "each row\\), got dtype torch.(float32|bool)"):
            grouped_advantages([0, 1], pi, r)
    with pytest.raises(ValueError, match="prompt_index holds 2 but only 2 prompts"):
        grouped_advantages([0, 1], [0, 0, 1, 2], r)
