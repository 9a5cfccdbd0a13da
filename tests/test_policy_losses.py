"""The algorithms issue's methods against numbers worked by hand: dual-clip and two-sided
clipping at their boundaries, CISPO, the log-ratio and KL clamps, the KL bias correction,
k1 as a loss term refused, each KL estimator's expected in-loss gradient, the IS levels, the
80/20 entropy mask, REINFORCE++-baseline's token whitening, overlong filter vs mask, the
named methods. float64 where the hand numbers have more digits than float32 holds."""
import math

import pytest
import torch

from grpo_lab.algorithm.advantages import ADVANTAGES
from grpo_lab.algorithm.advantages import grouped_advantages
from grpo_lab.algorithm.loss import KL, KL_ESTIMATORS, POLICY_LOSSES, Clip, grpo_loss
from grpo_lab.algorithm.token_weights import high_entropy_mask, is_weight
from grpo_lab.training.config import preset

D = torch.float64
ONE = torch.ones(1, 1, dtype=torch.bool)


def one_token(ratio, A, log_r=None, policy_loss="clip", **clip):
    """-> (loss, d loss / d logp) of grpo_loss on one token with pi_old = 1, float64; ``clip``:
    fields of its Clip (eps 0.2 both sides unless set)."""
    logp = torch.tensor([[math.log(ratio) if log_r is None else log_r]], dtype=D,
                        requires_grad=True)
    loss, _ = grpo_loss(logp, torch.zeros(1, 1, dtype=D), torch.tensor([A], dtype=D), ONE,
                        Clip(**{"eps_low": 0.2, "eps_high": 0.2, **clip}), policy_loss=policy_loss)
    loss.backward()
    return loss.item(), logp.grad.item()


# ---- dual-clip (Ye et al. 2020), c = 3, clip 0.2

@pytest.mark.parametrize("ratio, A, want_loss, want_grad", [
    (4.0, -1.0, 3.0, 0.0),        # -min(-4, -1.2) = 4, capped at -c A = 3: no gradient
    (2.0, -1.0, 2.0, 2.0),        # under the cap: -r A = 2, gradient -A r = 2
    (3.5, -2.0, 6.0, 0.0),        # -r A = 7 > -c A = 6
    (4.0, 1.0, -1.2, 0.0),        # A > 0: dual-clip does nothing (clip at 1.2)
    (0.5, -1.0, 0.8, 0.0),        # A < 0 below the clip: -A (1 - eps) = 0.8
])
def test_dual_clip_by_hand(ratio, A, want_loss, want_grad):
    loss, grad = one_token(ratio, A, dual_clip=3.0)
    assert loss == pytest.approx(want_loss, abs=1e-12)
    assert grad == pytest.approx(want_grad, abs=1e-12)


def test_dual_clip_at_its_boundary_and_off():
    # exactly on the boundary, r = c: log r = 1 and c = e as torch rounds exp(1), so r == c
    # bit for bit (exp(log 3) is 3.0000000000000004, past a bound of 3); A = -1: -r A = c = -c A
    c = torch.exp(torch.tensor(1.0, dtype=D)).item()
    logp = torch.tensor([[1.0, 1.0 + 1e-9, 1.0 - 1e-9, 1.0]], dtype=D, requires_grad=True)
    A = torch.tensor([[-1.0, -1.0, -1.0, 1.0]], dtype=D)
    loss, stats = grpo_loss(logp, torch.zeros(1, 4, dtype=D), A, torch.ones(1, 4, dtype=torch.bool),
                            Clip(0.2, 0.2, dual_clip=c), aggregation="token_mean")
    loss.backward()
    # per token: c (on the bound), c (capped), e^(1 - 1e-9) (under it), -1.2 (A > 0, clipped)
    want = (c + c + math.exp(1 - 1e-9) - 1.2) / 4
    assert loss.item() == pytest.approx(want, abs=1e-14)
    assert stats["clip/dual_frac"] == 0.25                         # r > c strictly: token 1 only
    g = logp.grad[0].tolist()
    assert g[1] == 0.0 and g[2] == pytest.approx(math.exp(1 - 1e-9) / 4, abs=1e-14) and g[3] == 0.0
    assert g[0] == pytest.approx(c / 8, abs=1e-15)      # on the tie torch.min splits it: half
    assert "clip/dual_frac" not in grpo_loss(logp.detach(), logp.detach(), [1.0],
                                             torch.ones(1, 4, dtype=torch.bool))[1]
    # off (the default): the exploded ratio's loss is unbounded, -r A = 4, gradient 4
    assert one_token(4.0, -1.0) == pytest.approx((4.0, 4.0), abs=1e-12)
    with pytest.raises(ValueError, match="dual_clip must be 0 \\(off\\) or > 1"):
        one_token(1.0, -1.0, dual_clip=1.0)
    with pytest.raises(ValueError, match="does not read it"):
        one_token(1.0, -1.0, dual_clip=3.0, policy_loss="cispo")


# ---- two-sided clipping (INTELLECT-2): min(r, delta) inside the min; = dual-clip c = delta

def test_two_sided_by_hand_and_equal_to_dual_clip():
    # A = -1, r = 4, delta = 3: -min(min(4, 3) * -1, 1.2 * -1) = -min(-3, -1.2) = 3, no grad
    assert one_token(4.0, -1.0, policy_loss="two_sided", delta=3.0) == pytest.approx((3.0, 0.0))
    # r = 2 < delta: -min(-2, -1.2) = 2, gradient 2
    assert one_token(2.0, -1.0, policy_loss="two_sided", delta=3.0) == pytest.approx((2.0, 2.0))
    for r in (0.3, 0.8, 1.0, 1.2, 1.7, 2.999, 3.0, 3.001, 9.0):
        for A in (-1.5, 1.5):
            a = one_token(r, A, policy_loss="two_sided", delta=3.0)
            b = one_token(r, A, dual_clip=3.0)
            assert a[0] == pytest.approx(b[0], abs=1e-12) and a[1] == pytest.approx(b[1], abs=1e-12)
    with pytest.raises(ValueError, match="needs clip.delta > 1 \\+ clip.eps_high"):
        one_token(1.0, 1.0, policy_loss="two_sided", delta=1.1)
    with pytest.raises(ValueError, match="clip.delta is read only by"):
        one_token(1.0, 1.0, delta=4.0)


# ---- CISPO (MiniMax-M1): -sg(clamp(r, cispo_floor, cispo_cap)) A log pi, token_mean

def test_cispo_by_hand():
    # ratios 1.5 (A +1), 0.5 (A +1), 0.5 (A -1); cap 1.28, pi_old = 1 so log pi = log r
    logp = torch.tensor([[math.log(1.5), math.log(0.5), math.log(0.5)]], dtype=D,
                        requires_grad=True)
    A = torch.tensor([[1.0, 1.0, -1.0]], dtype=D)
    loss, _ = grpo_loss(logp, torch.zeros(1, 3, dtype=D), A, torch.ones(1, 3, dtype=torch.bool),
                        Clip(cispo_cap=1.28), aggregation="token_mean", policy_loss="cispo")
    # weights 1.28 (capped), 0.5 and 0.5 (no lower bound, where clip would stop at 0.8)
    want = (-1.28 * math.log(1.5) - 0.5 * math.log(0.5) + 0.5 * math.log(0.5)) / 3
    assert loss.item() == pytest.approx(want, abs=1e-12)              # -0.172998
    loss.backward()
    # every token keeps a gradient -w A / 3; clip would give 0 for the first and last
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.28 / 3, -0.5 / 3, 0.5 / 3]], dtype=D))


def test_cispo_at_the_cap():
    # r = 1.28 exactly: w = 1.28; grad -1.28 A, loss -1.28 A log 1.28
    loss, grad = one_token(1.28, 2.0, cispo_cap=1.28, policy_loss="cispo")
    assert loss == pytest.approx(-1.28 * 2 * math.log(1.28), abs=1e-12)
    assert grad == pytest.approx(-2.56, abs=1e-12)


# ---- verl's clamps

def test_log_ratio_clamp_keeps_an_exploded_ratio_finite():
    # float32, log r = 100, A = -1: exp(100) = inf, the loss is inf; clamped at 20: e^20
    logp = torch.tensor([[100.0]])
    A = torch.tensor([-1.0])
    inf, _ = grpo_loss(logp, torch.zeros(1, 1), A, ONE)
    assert math.isinf(inf.item())
    clamped, _ = grpo_loss(logp, torch.zeros(1, 1), A, ONE, Clip(eps_high=0.2, log_ratio_clamp=20.0))
    assert clamped.item() == pytest.approx(math.exp(20), rel=1e-6)     # 4.85e8


@pytest.mark.parametrize("log_r, want_grad", [(20.0, math.exp(20)), (20.5, 0.0), (19.5, math.exp(19.5))])
def test_log_ratio_clamp_at_its_boundary(log_r, want_grad):
    # A = -1: loss -r A = r; d/dlogp = r inside [-20, 20] (the boundary counts as inside)
    loss, grad = one_token(None, -1.0, log_r=log_r, log_ratio_clamp=20.0)   # log r exactly
    assert loss == pytest.approx(math.exp(min(log_r, 20.0)), rel=1e-12)
    assert grad == pytest.approx(want_grad, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("d, want, want_grad", [(2.0, 2.0, -2.0), (3.0, 2.0, 0.0), (1.0, 0.5, -1.0)])
def test_kl_clamp_at_its_boundary(d, want, want_grad):
    # k2 = d^2 / 2 with d = log pi_ref - log pi, clamped at 2: d = 2 sits on the boundary
    # (value 2, gradient -d passes); d = 3 gives 4.5 -> 2, gradient 0
    logp = torch.zeros(1, 1, dtype=D, requires_grad=True)
    loss, stats = grpo_loss(logp, logp.detach(), [0.0], ONE, kl=KL(1.0, "k2", clamp=2.0),
                            ref_logp=torch.tensor([[d]], dtype=D))
    loss.backward()
    assert stats["loss/kl"] == pytest.approx(want, abs=1e-12)
    assert logp.grad.item() == pytest.approx(want_grad, abs=1e-12)


def test_k3_clamp_at_ten():
    # d = 3: k3 = e^3 - 4 = 16.0855 -> 10; d = 2: e^2 - 3 = 4.389056 unchanged
    for d, want in ((3.0, 10.0), (2.0, math.exp(2) - 3)):
        _, stats = grpo_loss(torch.zeros(1, 1, dtype=D), torch.zeros(1, 1, dtype=D), [0.0], ONE,
                             kl=KL(0.1, clamp=10.0), ref_logp=torch.tensor([[d]], dtype=D))
        assert stats["loss/kl"] == pytest.approx(want, abs=1e-12)


# ---- the KL terms

def test_k1_as_a_loss_term_is_an_error_that_says_why():
    z = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="as a loss term does nothing: its gradient is 0 in "
                                         "expectation"):
        grpo_loss(z, z, [0.0], ONE, kl=KL(0.1, "k1"), ref_logp=z)
    grpo_loss(z, z, [0.0], ONE, kl=KL(0.0, "k1"))                     # no KL term: fine
    with pytest.raises(ValueError, match="kl.placement='reward'"):
        preset("quick", kl={"beta": 0.02, "estimator": "k1", "placement": "loss"})
    preset("quick", kl={"beta": 0.02, "estimator": "k1", "placement": "reward"})


def test_kl_bias_correction_by_hand():
    # log pi = -0.5, log pi_old = -1, log pi_ref = -1.5: ratio e^0.5, d = -1,
    # k3 = e^-1 + 1 - 1 = e^-1; r k3 = e^-0.5 = 0.606531; d(r k3)/dlogp = r (k3 + 1 - e^d) = -d r
    logp = torch.tensor([[-0.5]], dtype=D, requires_grad=True)
    loss, stats = grpo_loss(logp, torch.tensor([[-1.0]], dtype=D), [0.0], ONE,
                            kl=KL(1.0, bias_correction=True), ref_logp=torch.tensor([[-1.5]], dtype=D))
    assert stats["loss/kl"] == pytest.approx(math.exp(-0.5), abs=1e-12)
    loss.backward()
    assert logp.grad.item() == pytest.approx(math.exp(0.5), abs=1e-12)


def expected_grads(logits, ref):
    """Exact E_{o ~ pi}[grad of the estimator in the loss] over a 3-token vocabulary, each
    estimator, and the gradients of the reverse and forward KL, all w.r.t. the logits."""
    out = {}
    for name in ("k1", "k2", "k3", "k3_corrected"):
        th = logits.clone().requires_grad_(True)
        logp = torch.log_softmax(th, 0)                                    # (V,)
        est = KL_ESTIMATORS[name.split("_")[0]](ref - logp)                # (V,) one per token
        if name == "k3_corrected":
            est = est * torch.exp(logp - logp.detach())                    # r = 1, its gradient
        (torch.exp(logp).detach() * est).sum().backward()                  # E over o ~ pi, sg(pi)
        out[name] = th.grad
    for name, f in (("reverse", lambda lp: (lp.exp() * (lp - ref)).sum()),
                    ("forward", lambda lp: (ref.exp() * (ref - lp)).sum())):
        th = logits.clone().requires_grad_(True)
        f(torch.log_softmax(th, 0)).backward()
        out[name] = th.grad
    return out


@pytest.mark.parametrize("scale", [0.1, 3.0])        # near and far from the reference
def test_each_estimator_expected_gradient_in_the_loss(scale):
    logits = torch.tensor([0.5, -0.2, 0.1], dtype=D) * scale
    ref = torch.log_softmax(torch.tensor([-0.3, 0.4, 0.0], dtype=D) * scale, 0)
    g = expected_grads(logits, ref)
    torch.testing.assert_close(g["k1"], torch.zeros(3, dtype=D), rtol=0, atol=1e-15)
    torch.testing.assert_close(g["k2"], g["reverse"], rtol=0, atol=1e-14)
    torch.testing.assert_close(g["k3"], g["forward"], rtol=0, atol=1e-14)
    torch.testing.assert_close(g["k3_corrected"], g["reverse"], rtol=0, atol=1e-14)
    if scale == 3.0:                       # far apart, k3's gradient is not the reverse KL's
        assert (g["k3"] - g["reverse"]).abs().max() > 0.1


# ---- IS levels and the entropy mask (token_weights.py)

LOG_W = torch.tensor([[0.1, 0.2], [0.5, 9.0]], dtype=D)                    # 9.0 under the mask
MASK = torch.tensor([[True, True], [True, False]])


@pytest.mark.parametrize("level, want", [
    ("token", [[math.exp(0.1), 1.2], [1.2, 0.0]]),             # min(w_t, 1.2) per token
    ("sequence", [[1.2, 1.2], [1.2, 0.0]]),                    # e^0.3 = 1.35 and e^0.5 -> 1.2
    ("seq_mean_k1", [[1.0, 1.0], [0.0, 0.0]]),                 # geo e^0.15 = 1.16 in, e^0.5 out
    ("token_truncate", [[math.exp(0.1), 1.2], [1.2, 0.0]]),    # TRL, floor 0: as "token"
    ("sequence_truncate", [[1.2, 1.2], [1.2, 0.0]]),           # TRL, floor 0: as "sequence"
    ("token_mask", [[math.exp(0.1), 0.0], [0.0, 0.0]]),        # e^0.2, e^0.5 > 1.2: 0
    ("sequence_mask", [[0.0, 0.0], [0.0, 0.0]]),               # products e^0.3, e^0.5 > 1.2
])
def test_is_levels_by_hand(level, want):
    w = is_weight(level, LOG_W, torch.zeros(2, 2, dtype=D), MASK, 1.2)
    torch.testing.assert_close(w, torch.tensor(want, dtype=D), rtol=0, atol=1e-15)


def test_seq_mean_k1_keeps_a_sequence_exactly_on_its_bounds():
    c = torch.log(torch.tensor(1.2, dtype=D))
    for log_w in (c, -c):                                   # geometric mean exactly C or 1/C
        w = is_weight("seq_mean_k1", log_w.expand(1, 2).clone(), torch.zeros(1, 2, dtype=D),
                      torch.ones(1, 2, dtype=torch.bool), 1.2)
        assert w.tolist() == [[1.0, 1.0]]
    w = is_weight("seq_mean_k1", (c * 1.001).expand(1, 2).clone(), torch.zeros(1, 2, dtype=D),
                  torch.ones(1, 2, dtype=torch.bool), 1.2)
    assert w.tolist() == [[0.0, 0.0]]


def test_high_entropy_mask_by_hand():
    H = torch.tensor([[0.1, 0.5, 100.0], [0.9, 0.3, 7.0]])                 # 100, 7 are padding
    m = torch.tensor([[True, True, False], [True, True, False]])
    # real entropies sorted 0.1 0.3 0.5 0.9; the 0.5 quantile is 0.4: keep 0.5 and 0.9
    assert high_entropy_mask(H, m, 0.5).tolist() == [[0, 1, 0], [1, 0, 0]]
    # the 0.75 quantile is 0.5 + 0.25 * 0.4 = 0.6: keep only 0.9
    assert high_entropy_mask(H, m, 0.25).tolist() == [[0, 0, 0], [1, 0, 0]]
    assert high_entropy_mask(H, m, 1.0).tolist() == [[1, 1, 0], [1, 1, 0]]   # off: every real
    # equal entropies: all at the threshold, all kept; no real token: nothing
    assert high_entropy_mask(torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool), 0.2).sum() == 3
    assert high_entropy_mask(H, torch.zeros(2, 3, dtype=torch.bool), 0.2).sum() == 0
    with pytest.raises(ValueError, match="top_entropy_quantile must be in \\(0, 1\\]"):
        high_entropy_mask(H, m, 0.0)


def test_a_nan_entropy_on_a_real_token_is_named_not_a_mask_of_zeros():
    # the NaN made the quantile NaN and every token's comparison False: the whole batch lost
    # its policy gradient without a word; padding (100, 7 above) may hold anything
    H = torch.tensor([[0.1, 0.5, float("nan")], [0.9, float("nan"), 7.0]])
    m = torch.tensor([[True, True, False], [True, True, False]])
    with pytest.raises(ValueError, match="entropy of sample 1, token 1 is nan"):
        high_entropy_mask(H, m, 0.5)
    m[1, 1] = False                                 # real 0.1 0.5 0.9: the median 0.5 and 0.9
    assert high_entropy_mask(H, m, 0.5).tolist() == [[0, 1, 0], [1, 0, 0]]


def test_entropy_mask_zeroes_the_policy_gradient_of_low_entropy_tokens():
    # 2 tokens, A = +1, on-policy: token_mean gradient -1/2 per token; masked token: 0
    logp = torch.zeros(1, 2, dtype=D, requires_grad=True)
    w = high_entropy_mask(torch.tensor([[0.2, 1.0]]), torch.ones(1, 2, dtype=torch.bool), 0.5)
    loss, _ = grpo_loss(logp, logp.detach(), [1.0], torch.ones(1, 2, dtype=torch.bool),
                        aggregation="token_mean", tis_weight=w.to(D))
    loss.backward()
    assert loss.item() == pytest.approx(-0.5, abs=1e-15)                 # normaliser still 2
    assert logp.grad.tolist() == [[0.0, -0.5]]


# ---- REINFORCE++-baseline (verl's token whitening)

def test_reinforce_pp_baseline_by_hand():
    # rewards 1, 0 | 0, 0 in groups 0 | 1; lengths 1, 3, 2, 2 (8 tokens)
    # c = 0.5, -0.5, 0, 0; token mean mu = (0.5 - 1.5) / 8 = -0.125
    # c - mu = 0.625, -0.375, 0.125, 0.125; var = (0.390625 + 3 * 0.140625 + 4 * 0.015625) / 7
    #        = 0.875 / 7 = 0.125; A = (c - mu) / sqrt(0.125 + 1e-8)
    r, g = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=D), torch.tensor([0, 0, 1, 1])
    adv = ADVANTAGES["reinforce_pp_baseline"](r, g, lengths=torch.tensor([1, 3, 2, 2]))
    s = math.sqrt(0.125 + 1e-8)
    torch.testing.assert_close(adv, torch.tensor([0.625, -0.375, 0.125, 0.125], dtype=D) / s,
                               rtol=0, atol=1e-14)
    # group 1's equal rewards get A = 0.354, not 0: the token mean is subtracted again
    assert adv[2] > 0.35
    # through the grouping path the lengths arrive the same
    torch.testing.assert_close(grouped_advantages([0, 1], torch.tensor([0, 0, 1, 1]), r,
                                                  "cluster", "reinforce_pp_baseline",
                                                  torch.tensor([1, 3, 2, 2])), adv)


def test_reinforce_pp_baseline_edges():
    fn = ADVANTAGES["reinforce_pp_baseline"]
    L = torch.tensor([2, 5, 1])
    assert fn(torch.tensor([0.7, 0.7, 0.7]), torch.tensor([0, 0, 0]), lengths=L).tolist() == [0, 0, 0]
    assert fn(torch.tensor([0.0, 1.0, 3.0]), torch.tensor([0, 1, 2]), lengths=L).tolist() == [0, 0, 0]  # G=1
    assert fn(torch.tensor([1.0]), torch.tensor([0]), lengths=torch.tensor([1])).tolist() == [0.0]
    # an empty row carries no token: its advantage is (c - mu) / std of the others
    a = fn(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]), lengths=torch.tensor([1, 1, 0]))
    # c = 2/3, -1/3, -1/3; tokens: 2/3 and -1/3, mu = 1/6; dev 0.5, -0.5, -0.5; var = 0.5 / 1
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, -0.5]) / math.sqrt(0.5 + 1e-8))


# ---- overlong filter (kept rows) vs mask (all rows, TRL)

def test_overlong_mask_divides_by_all_rows():
    # row 0 kept (2 tokens, A = +1), row 1 truncated; seq_mean_token_mean, on-policy:
    # filter: -1 over 1 row = -1; mask: (-1 + 0) / 2 rows = -0.5 (N_kept / N = 1/2)
    logp = torch.zeros(2, 2, dtype=D)
    m = torch.ones(2, 2, dtype=torch.bool)
    keep = torch.tensor([True, False])
    filt, _ = grpo_loss(logp, logp, [1.0, 1.0], m, keep=keep)
    mask, _ = grpo_loss(logp, logp, [1.0, 1.0], m & keep[:, None])
    assert (filt.item(), mask.item()) == (-1.0, -0.5)
    from grpo_lab.algorithm.overlong import OVERLONG
    assert OVERLONG["mask"].counts_dropped and not OVERLONG["filter"].counts_dropped
    assert OVERLONG["mask"].keep(torch.tensor([True, False])).tolist() == [True, False]


# ---- named methods

def test_dr_grpo_is_one_switch_and_half_of_it_is_refused():
    cfg = preset("quick", method="dr_grpo")
    assert (cfg.advantage, cfg.loss.aggregation) == ("dr_grpo", "dr_grpo")
    with pytest.raises(ValueError, match="half of Dr. GRPO.*method='dr_grpo'.*'mean_centred'"):
        preset("quick", advantage="dr_grpo")
    assert preset("quick", advantage="mean_centred").loss.aggregation == "seq_mean_token_mean"


def test_methods_set_their_fields_and_refuse_a_third_value():
    assert preset("quick", method="grpo").clip.eps_high == 0.2               # the paper's symmetric clip
    d = preset("quick", method="dapo")
    assert (d.loss.aggregation, d.dynamic.sampling, d.overlong.rule, d.kl.beta) == (
        "token_mean", True, "soft", 0.0)
    assert preset("quick", method="cispo").loss.policy == "cispo"
    assert preset("quick", method="gspo").loss.ratio_level == "sequence"
    assert preset("quick", method="dapo", clip={"eps_high": 0.28}).clip.eps_high == 0.28  # the same
    with pytest.raises(ValueError, match="method='dapo' sets clip.eps_high=0.28 .* "
                                         "clip.eps_high=0.3"):
        preset("quick", method="dapo", clip={"eps_high": 0.3})
    with pytest.raises(ValueError, match="unknown method 'ppo2'"):
        preset("quick", method="ppo2")


@pytest.mark.parametrize("kw, match", [
    ({"kl": {"clamp": 10.0, "beta": 0.0}}, "kl.clamp=10.0 acts on the KL term of the loss"),
    ({"kl": {"bias_correction": True, "beta": 0.02, "placement": "reward"}},
     "kl.bias_correction=True"),
    ({"tis": {"level": "sequence"}}, "tis.level='sequence' says what tis.cap bounds"),
    ({"loss": {"policy": "two_sided"}}, "needs clip.delta > 1 \\+ clip.eps_high"),
    ({"loss": {"policy": "cispo"}, "clip": {"dual_clip": 3.0}}, "does not read it"),
    ({"clip": {"dual_clip": 0.5}}, "dual_clip must be 0 \\(off\\) or > 1"),
    ({"loss": {"policy": "ppo"}}, "unknown loss.policy 'ppo'"),
    ({"top_entropy": {"quantile": 0.0}}, "top_entropy.quantile must be in \\(0, 1\\]"),
    ({"objective": "ppo", "group_size": 1, "loss": {"policy": "cispo"}}, "read by the grpo objective only"),
])
def test_config_refuses_combinations_that_do_nothing(kw, match):
    with pytest.raises(ValueError, match=match):
        preset("quick", **kw)


def test_every_policy_loss_is_the_plain_gradient_on_policy():
    # at ratio 1 (mu = 1) every surrogate's gradient is -A grad log pi: the records differ
    # only off-policy (a check that each record is wired, not a tautology: cispo's value differs)
    for name in POLICY_LOSSES:
        kw = {"delta": 3.0} if name == "two_sided" else {}
        loss, grad = one_token(1.0, 0.7, policy_loss=name, **kw)
        assert grad == pytest.approx(-0.7, abs=1e-15), name
        assert loss == pytest.approx(0.0 if name == "cispo" else -0.7, abs=1e-15), name
    assert [f for f in Clip.__dataclass_fields__] == ["eps_low", "eps_high", "dual_clip", "delta",
                                                      "log_ratio_clamp", "cispo_cap",
                                                      "cispo_floor"]


def test_a_method_round_trips_through_the_saved_config():
    from grpo_lab.training.config import from_dict, to_dict
    cfg = preset("quick", method="dapo")
    again = from_dict(to_dict(cfg))
    assert to_dict(again) == to_dict(cfg) and again.method == "dapo"


def test_entropy_mask_and_cispo_train_end_to_end(tmp_path):
    # mu = 2: the second update is off-policy; every policy parameter moves, the loss is finite
    from grpo_lab.policies.policy import load_policy_any
    from grpo_lab.training.trainer import train
    kw = dict(steps=2, mu=2, prompts_per_step=4, group_size=4, eval_size=0, eval_every=0,
              ckpt_every=2, time_budget_s=0.0, threads=1, warmup_steps=0, lr=1e-3)
    h = train(preset("quick", out_dir=str(tmp_path / "a"), method="cispo",
                     top_entropy={"quantile": 0.2}, off_policy_mask={"delta": 0.5}, **kw),
              progress=False)
    rows = [r for r in h if r["step"] >= 0]
    assert len(rows) == 2 and all(math.isfinite(r["loss/total"]) for r in rows)
    before = load_policy_any(preset("quick").base_checkpoint).state_dict()
    after = load_policy_any(tmp_path / "a" / "checkpoint.safetensors").state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in after), "a parameter did not move"


def test_off_policy_sequence_mask_by_hand():
    from grpo_lab.algorithm.token_weights import off_policy_sequence_mask
    # mean log(pi_sampler / pi) per row: 0.6, 0.5 (exactly delta: kept, the test is strict),
    # 0.9 with A > 0 (kept), 0.7 on the one real token of row 3 (the 9.0 is padding)
    sampler = torch.tensor([[0.5, 0.7], [0.5, 0.5], [0.9, 0.9], [0.7, 9.0]], dtype=D)
    logp = torch.zeros(4, 2, dtype=D)
    m = torch.tensor([[True, True], [True, True], [True, True], [True, False]])
    w = off_policy_sequence_mask(logp, sampler, torch.tensor([-1.0, -1.0, 1.0, -0.5], dtype=D),
                                 m, 0.5)
    assert w.tolist() == [[0, 0], [1, 1], [1, 1], [0, 0]]
    with pytest.raises(ValueError, match="one advantage per completion"):
        off_policy_sequence_mask(logp, sampler, torch.zeros(4, 2, dtype=D), m, 0.5)
    with pytest.raises(ValueError, match="supervision='outcome'"):
        preset("quick", off_policy_mask={"delta": 0.5}, supervision="process")


def test_off_policy_sequence_mask_refuses_a_nan_delta_and_advantages_of_another_length():
    # a NaN delta kept every row (kl > NaN is False), 3 advantages for 2 rows was torch's
    # RuntimeError; row 0 (A < 0, mean log ratio 1 > 0.5) is the row a real delta masks
    from grpo_lab.algorithm.token_weights import off_policy_sequence_mask
    logp, sampler, m = torch.zeros(2, 2, dtype=D), torch.ones(2, 2, dtype=D), torch.ones(2, 2)
    A = torch.tensor([-1.0, 1.0], dtype=D)
    with pytest.raises(ValueError, match="delta must be finite and >= 0, got nan"):
        off_policy_sequence_mask(logp, sampler, A, m, math.nan)
    with pytest.raises(ValueError, match="got advantages of shape \\(3,\\) for mask \\(2, 2\\): "
                                         "it must be \\(N,\\) = \\(2,\\)"):
        off_policy_sequence_mask(logp, sampler, torch.tensor([-1.0, 1.0, 1.0], dtype=D), m, 0.5)
    assert off_policy_sequence_mask(logp, sampler, A, m, 0.5).tolist() == [[0, 0], [1, 1]]
