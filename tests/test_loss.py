"""The GRPO loss against values worked out by hand (tests/test_loss.py)."""
import math

import pytest
import torch

from grpo_lab.algorithm.loss import AGGREGATIONS, KL, Clip, EntropyBonus, grpo_loss

# old_logp = 0, so ratio = exp(logp). Row 0 (A = +1): ratios 1.5 (clipped high at 1.28), 1.1.
# Row 1 (A = -1): ratio 0.5 (clipped low at 0.8), second token masked out.
RATIO = torch.tensor([[1.5, 1.1], [0.5, 0.9]])
MASK = torch.tensor([[True, True], [True, False]])
ADV = torch.tensor([1.0, -1.0])
# per-token loss -min(r A, clip(r) A): row 0: -1.28, -1.1; row 1: +0.8
EXPECTED = {
    "seq_mean_token_mean": ((-1.28 - 1.1) / 2 + 0.8) / 2,   # -0.195
    "token_mean": (-1.28 - 1.1 + 0.8) / 3,                  # -0.526667
    "dr_grpo": (-1.28 - 1.1 + 0.8) / (2 * 4),               # -0.1975 with max_len = 4
}


def run(aggregation, **kw):
    logp = RATIO.log().requires_grad_(True)
    loss, stats = grpo_loss(logp, torch.zeros(2, 2), ADV, MASK, Clip(eps_low=0.2, eps_high=0.28),
                            aggregation=aggregation, max_len=4, **kw)
    return logp, loss, stats


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_clipped_surrogate_by_hand(aggregation):
    _, loss, stats = run(aggregation)
    assert loss.item() == pytest.approx(EXPECTED[aggregation], abs=1e-6)
    assert stats["clip/high_frac"] == pytest.approx(1 / 3)
    assert stats["clip/low_frac"] == pytest.approx(1 / 3)
    assert stats["clip/ratio_mean"] == pytest.approx((1.5 + 1.1 + 0.5) / 3)


def test_gradient_zero_where_clipped():
    logp, loss, _ = run("seq_mean_token_mean")
    loss.backward()
    # d/dlogp of -(r A)/(|o_0| * N) at row 0 token 1: -1.1 / (2 * 2) = -0.275; clipped ones: 0
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.275], [0.0, 0.0]]))


def test_k3_kl_by_hand():
    # d = log(pi_ref / pi): log 2 -> 2 - log 2 - 1 = 0.306853; -log 2 -> 0.5 + log 2 - 1 = 0.193147
    logp = torch.zeros(2, 2)
    ref = torch.tensor([[math.log(2), 0.0], [-math.log(2), 5.0]])  # 5.0 sits under the mask
    loss, stats = grpo_loss(logp, logp, torch.zeros(2), MASK, kl=KL(beta=0.1),
                            aggregation="token_mean", ref_logp=ref)
    assert stats["loss/kl"] == pytest.approx(0.5 / 3, abs=1e-6)
    assert loss.item() == pytest.approx(0.1 * 0.5 / 3, abs=1e-7)
    # beta = 0: no reference, no KL computed, so none reported (absent, not a 0 that reads as
    # "the policy has not moved")
    _, stats = grpo_loss(logp, logp, torch.zeros(2), MASK, kl=KL(beta=0.0))
    assert "loss/kl" not in stats and "clip/ratio_mean" in stats


def test_bad_input():
    z = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="unknown aggregation 'mean'"):
        grpo_loss(z, z, ADV, MASK, aggregation="mean")
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(z, z, torch.zeros(3), MASK)
    with pytest.raises(ValueError, match="one \\(N, T\\) shape"):
        grpo_loss(z, torch.zeros(2, 3), ADV, MASK)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(z, z, ADV, MASK, kl=KL(beta=0.1))


def test_a_non_finite_tis_weight_or_entropy_on_a_real_token_is_named():
    # both were multiplied into the loss unchecked: a NaN weight gave loss NaN, inf -inf;
    # padding may hold anything, as for the log-probs
    z, nan = torch.zeros(2, 2), float("nan")
    with pytest.raises(ValueError, match="tis_weight of sample 0, token 1 is nan "
                                         "\\(1 non-finite tis_weight values in all\\)"):
        grpo_loss(z, z, ADV, MASK, tis_weight=torch.tensor([[1.0, nan], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="tis_weight of sample 1, token 0 is inf"):
        grpo_loss(z, z, ADV, MASK, tis_weight=torch.tensor([[1.0, 1.0], [math.inf, 1.0]]))
    with pytest.raises(ValueError, match="entropy of sample 0, token 0 is nan"):
        grpo_loss(z, z, ADV, MASK, entropy_bonus=EntropyBonus(0.1),
                  entropy=torch.tensor([[nan, 1.0], [1.0, 1.0]]))
    pad = torch.tensor([[1.0, 1.0], [1.0, nan]])                          # MASK's padding
    loss, _ = grpo_loss(z, z, ADV, MASK, tis_weight=pad, entropy_bonus=EntropyBonus(0.1),
                        entropy=pad)
    # ratio 1 everywhere: -A per token, minus 0.1 * H = 1; rows' token means averaged
    assert float(loss) == pytest.approx(((-1 - 0.1) + (1 - 0.1)) / 2)
