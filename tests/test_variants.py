"""The GRPO variants of issue 24 against values worked out by hand: GSPO's sequence ratio,
overlong filtering and the soft penalty, the entropy bonus, the KL estimators k1/k2/k3 (and KL
in the reward), top-p sampling, truncated importance sampling; config errors name the value."""
import math

import pytest
import torch

from grpo_lab.training.config import preset
from grpo_lab.algorithm.loss import KL, KL_ESTIMATORS, Clip, EntropyBonus, grpo_loss, sequence_kl
from grpo_lab.policies.model import GPT, GPTConfig
from grpo_lab.algorithm.overlong import OVERLONG, soft_penalty
from grpo_lab.algorithm.rollout import sample, top_p_filter
from grpo_lab.tasks import encode
from tolerance import mean_tol


# ---- GSPO (ratio_level="sequence")

def test_gspo_ratio_of_a_3_token_sequence_by_hand():
    # log r_t = 0.1, 0.2, 0.3 -> s = exp(mean) = exp(0.2) = 1.221403 (inside [0.8, 1.28])
    logp = torch.tensor([[0.1, 0.2, 0.3]], requires_grad=True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = grpo_loss(logp, torch.zeros(1, 3), [1.0], mask, Clip(0.2, 0.28),
                            ratio_level="sequence")
    s = math.exp(0.2)
    assert loss.item() == pytest.approx(-s, rel=1e-6)                  # -(1/3) * 3 * s * A
    assert stats["clip/ratio_mean"] == pytest.approx(s, rel=1e-6)
    loss.backward()
    # d(-s A)/d logp_t = -s * (1/3): each token carries a third of the sequence's log-ratio
    torch.testing.assert_close(logp.grad, torch.full((1, 3), -s / 3))
    # the token ratios would differ per token: exp(0.1), exp(0.2), exp(0.3)
    tok, _ = grpo_loss(logp.detach(), torch.zeros(1, 3), [1.0], mask, Clip(0.2, 0.28))
    assert tok.item() == pytest.approx(-(math.exp(0.1) + math.exp(0.2) + 1.28) / 3, rel=1e-6)


def test_gspo_clips_the_whole_sequence():
    # log r = 0.3 on each token: s = exp(0.3) = 1.3499 > 1.28, A > 0 -> clipped, no gradient
    logp = torch.full((1, 3), 0.3, requires_grad=True)
    loss, stats = grpo_loss(logp, torch.zeros(1, 3), [1.0], torch.ones(1, 3, dtype=torch.bool),
                            Clip(0.2, 0.28), ratio_level="sequence")
    assert loss.item() == pytest.approx(-1.28, rel=1e-6)
    assert stats["clip/high_frac"] == 1.0
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros(1, 3))


def test_gspo_with_one_token_sequences_is_the_token_ratio():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 1, generator=g) * 0.3
    old, adv = torch.randn(6, 1, generator=g) * 0.3, torch.randn(6, generator=g)
    mask = torch.ones(6, 1, dtype=torch.bool)
    out = {}
    for level in ("token", "sequence"):
        logp = base.clone().requires_grad_(True)
        loss, stats = grpo_loss(logp, old, adv, mask, Clip(0.2, 0.28), ratio_level=level)
        loss.backward()
        out[level] = (loss.item(), logp.grad, stats)
    assert out["token"][0] == out["sequence"][0]
    torch.testing.assert_close(out["token"][1], out["sequence"][1], rtol=0, atol=1e-7)
    assert out["token"][2] == out["sequence"][2]


# ---- overlong: filter and soft

def test_overlong_filter_gives_zero_gradient_from_truncated_rows():
    logp = torch.tensor([[0.1, -0.2], [0.3, 0.1], [-0.1, 0.2]], requires_grad=True)
    old, mask = torch.zeros(3, 2), torch.ones(3, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5])
    stopped = torch.tensor([True, False, True])                            # row 1 truncated
    keep = OVERLONG["filter"].keep(stopped)
    loss, _ = grpo_loss(logp, old, adv, mask, Clip(0.3, 0.3), aggregation="token_mean", keep=keep)
    loss.backward()
    assert torch.equal(logp.grad[1], torch.zeros(2)) and logp.grad[0].abs().min() > 0
    # = the loss of the kept rows alone (no ratio clipped at eps 0.3):
    # (-(e^.1 + e^-.2) * 1 - (e^-.1 + e^.2) * .5) / 4 tokens
    by_hand = (-(math.exp(0.1) + math.exp(-0.2)) - 0.5 * (math.exp(-0.1) + math.exp(0.2))) / 4
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    assert torch.equal(OVERLONG["none"].keep(stopped), torch.ones(3, dtype=torch.bool))
    assert torch.equal(OVERLONG["soft"].keep(stopped), torch.ones(3, dtype=torch.bool))


def test_soft_overlong_penalty_by_hand():
    # DAPO eq. 13, L_max = 5, L_cache = 2: 0 up to 3 tokens, then (3 - |y|) / 2, -1 past 5
    lengths = torch.tensor([1, 3, 4, 5, 6])
    torch.testing.assert_close(soft_penalty(lengths, 5, 2), torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    torch.testing.assert_close(soft_penalty(lengths, 5, 1), torch.tensor([0.0, 0.0, 0.0, -1.0, -1.0]))
    with pytest.raises(ValueError, match="overlong.buffer must be in \\[1, max_new_tokens=5\\], got 6"):
        soft_penalty(lengths, 5, 6)
    assert OVERLONG["none"].penalty is None and OVERLONG["filter"].penalty is None


# ---- entropy bonus and truncated importance sampling

def test_entropy_bonus_by_hand():
    logp = torch.zeros(1, 2, requires_grad=True)
    H = torch.tensor([[0.5, 1.5]], requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = grpo_loss(logp, torch.zeros(1, 2), [0.0], mask, entropy_bonus=EntropyBonus(0.1),
                            entropy=H)
    assert loss.item() == pytest.approx(-0.1 * (0.5 + 1.5) / 2, rel=1e-6)   # A = 0: bonus only
    loss.backward()
    torch.testing.assert_close(H.grad, torch.tensor([[-0.05, -0.05]]))
    with pytest.raises(ValueError, match="entropy_bonus.coef=0.1 needs entropy"):
        grpo_loss(logp, torch.zeros(1, 2), [0.0], mask, entropy_bonus=EntropyBonus(0.1))


def test_tis_weight_scales_the_policy_gradient_term_by_hand():
    # ratio 1 (logp = old), A = 1: per-token surrogate 1, weighted 2 and 0.5 -> -(2 + .5) / 2
    logp = torch.zeros(1, 2, requires_grad=True)
    w = torch.tensor([[2.0, 0.5]])
    loss, _ = grpo_loss(logp, torch.zeros(1, 2), [1.0], torch.ones(1, 2, dtype=torch.bool),
                        tis_weight=w)
    assert loss.item() == pytest.approx(-1.25, rel=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, -0.25]]))   # -w * r * A / 2


# ---- KL estimators (Schulman 2020) on known distributions

P = torch.tensor([0.5, 0.3, 0.2])            # pi: the tokens are sampled from it
Q = torch.tensor([0.2, 0.3, 0.5])            # pi_ref
KL_PQ = float((P * (P / Q).log()).sum())     # 0.5 ln 2.5 + 0.2 ln 0.4 = 0.274887


def test_kl_estimators_by_hand():
    d = torch.tensor([math.log(2.0), -math.log(2.0)])                     # log pi_ref/pi
    torch.testing.assert_close(KL_ESTIMATORS["k1"](d), torch.tensor([-0.693147, 0.693147]))
    torch.testing.assert_close(KL_ESTIMATORS["k2"](d), torch.tensor([0.240227, 0.240227]))
    torch.testing.assert_close(KL_ESTIMATORS["k3"](d), torch.tensor([0.306853, 0.193147]))
    assert KL_PQ == pytest.approx(0.5 * math.log(2.5) + 0.2 * math.log(0.4), rel=1e-6)


def test_k1_and_k3_unbiased_k2_biased_k3_nonnegative():
    d = (Q / P).log()                                                      # (3,) log r per token
    for name, e in KL_ESTIMATORS.items():
        exact = float((P * e(d)).sum())                                    # E_pi[k] exactly
        assert (abs(exact - KL_PQ) < 1e-6) == e.unbiased, name
    # sampled: the mean of 20000 draws sits within 4 standard errors of KL for k1 and k3
    tok = torch.multinomial(P, 20000, replacement=True, generator=torch.Generator().manual_seed(0))
    for name in ("k1", "k3"):
        k = KL_ESTIMATORS[name](d[tok].double())
        assert abs(float(k.mean()) - KL_PQ) < 4 * float(k.std()) / math.sqrt(len(k)), name
    # k3 is 0 only at log r = 0 and positive elsewhere; k1 goes negative; k2 >= 0
    grid = torch.linspace(-20, 5, 1001)
    assert bool((KL_ESTIMATORS["k3"](grid) >= 0).all()) and KL_ESTIMATORS["k3"].nonnegative
    assert bool((KL_ESTIMATORS["k2"](grid) >= 0).all())
    assert float(KL_ESTIMATORS["k1"](grid).min()) < 0 and not KL_ESTIMATORS["k1"].nonnegative
    # the variance the notebook teaches: k3's is below k1's on this pair
    assert float(KL_ESTIMATORS["k3"](d[tok]).var()) < float(KL_ESTIMATORS["k1"](d[tok]).var())


def test_kl_in_the_loss_uses_the_estimator_and_sequence_kl_by_hand():
    logp, mask = torch.zeros(1, 2), torch.tensor([[True, False]])
    ref = torch.tensor([[math.log(2.0), 7.0]])                             # 7.0 under the mask
    for name, want in (("k2", 0.240227), ("k3", 0.306853)):
        loss, stats = grpo_loss(logp, logp, [0.0], mask, kl=KL(0.1, name), ref_logp=ref)
        assert stats["loss/kl"] == pytest.approx(want, rel=1e-5)
        assert loss.item() == pytest.approx(0.1 * want, rel=1e-5)
    # k1 (value -0.693147 here) has zero expected gradient as a loss term: refused
    with pytest.raises(ValueError, match="does nothing"):
        grpo_loss(logp, logp, [0.0], mask, kl=KL(0.1, "k1"), ref_logp=ref)
    # summed per completion: two tokens with log r = ln 2 and -ln 2 -> k3: 0.306853 + 0.193147
    two = torch.tensor([[math.log(2.0), -math.log(2.0)]])
    torch.testing.assert_close(sequence_kl(torch.zeros(1, 2), two, torch.ones(1, 2), "k3"),
                               torch.tensor([0.5]))


def test_sequence_kl_refuses_a_broadcast_an_unknown_estimator_and_a_nan_on_a_real_token():
    # a (1, T) ref_logp was broadcast over 2 rows, "k4" was a bare KeyError, a NaN ref_logp on
    # a real token a NaN sum; a NaN under the mask is never read (row 1: ln 2, k3 = 0.306853)
    z, m = torch.zeros(2, 2), torch.tensor([[True, True], [True, False]])
    with pytest.raises(ValueError, match="logp, ref_logp and mask must be one \\(N, T\\) shape, "
                                         "got \\(2, 2\\), \\(1, 2\\) and \\(2, 2\\)"):
        sequence_kl(z, torch.zeros(1, 2), m)
    with pytest.raises(ValueError, match="unknown kl.estimator 'k4'; known: \\['k1', 'k2', 'k3'\\]"):
        sequence_kl(z, z, m, "k4")
    ref = torch.tensor([[0.0, math.nan], [math.log(2.0), math.nan]])
    with pytest.raises(ValueError, match="ref_logp of sample 0, token 1 is nan "
                                         "\\(1 non-finite ref_logp values in all\\)"):
        sequence_kl(z, ref, m)
    ref[0, 1] = 0.0
    torch.testing.assert_close(sequence_kl(z, ref, m), torch.tensor([0.0, 0.306853]))


# ---- top-p in the sampler

def test_top_p_filter_by_hand():
    logp = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()                    # sorted: .5 .3 .15 .05
    kept = lambda p: torch.isfinite(top_p_filter(logp, p))[0].tolist()   # noqa: E731
    assert kept(0.5) == [False, True, False, False]                        # .5 reaches .5
    assert kept(0.7) == [False, True, False, True]                         # .5 + .3 crosses .7
    assert kept(0.81) == [False, True, True, True]
    assert kept(1e-9) == [False, True, False, False]                       # at least one token
    assert torch.equal(top_p_filter(logp, 0.7)[0, [1, 3]], logp[0, [1, 3]])  # values kept as is


def test_top_p_and_top_k_out_of_range_are_refused_by_name():
    # p <= 0 set every token to -inf (the race then drew token 0), a NaN p turned the filter
    # off, k <= 0 was torch's own RuntimeError: each now names the setting and its value
    from grpo_lab.algorithm.rollout import nucleus, race_draw, top_k_filter
    logp = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    draw = lambda k, p: race_draw(logp, k, 1, torch.Generator().manual_seed(0),   # noqa: E731
                                  torch.arange(1), 1, p)
    for p in (0.0, -0.5, float("nan"), 1.5):
        for call in (lambda: top_p_filter(logp, p), lambda: nucleus(logp, None, p),
                     lambda: draw(None, p)):
            with pytest.raises(ValueError, match=f"top_p must be in \\(0, 1\\] \\(1 = off\\), "
                                                 f"got {p}"):
                call()
    for k in (0, -1, 2.5):
        for call in (lambda: top_k_filter(logp, k), lambda: draw(k, 1.0)):
            with pytest.raises(ValueError, match=f"top_k must be an int >= 1 or None, got {k}"):
                call()
    assert torch.isfinite(top_k_filter(logp, 2))[0].tolist() == [False, True, False, True]
    assert draw(1, 1.0).tolist() == [1]                                   # top-1: the argmax


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=24))


PROMPTS = [encode("12+34="), encode("sort:3142="), encode("7+5=")]


def test_top_p_one_is_the_sampler_bit_for_bit_and_tiny_top_p_is_greedy(model):
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(3)]   # noqa: E731
    for top_k in (None, 5):
        a = sample(model, PROMPTS, 4, 8, 0.9, top_k, generator=gens())
        b = sample(model, PROMPTS, 4, 8, 0.9, top_k, generator=gens(), top_p=1.0)
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert torch.equal(a.logprobs, b.logprobs)
    nucleus = sample(model, PROMPTS, 4, 8, 0.9, generator=gens(), top_p=1e-6)
    greedy = sample(model, PROMPTS, 4, 8, 0.9, greedy=True)
    assert torch.equal(nucleus.completion_ids, greedy.completion_ids)
    with pytest.raises(ValueError, match="top_p must be in \\(0, 1\\] \\(1 = off\\), got 1.5"):
        sample(model, PROMPTS, 2, 4, top_p=1.5)


# ---- the config names each bad value

@pytest.mark.parametrize("kw, match", [
    ({"loss": {"ratio_level": "seq"}}, "unknown loss.ratio_level 'seq'"),
    ({"kl": {"estimator": "k4"}}, "unknown kl.estimator 'k4'"),
    ({"kl": {"placement": "advantage"}}, "unknown kl.placement 'advantage'"),
    ({"overlong": {"rule": "cut"}}, "unknown overlong.rule 'cut'"),
    ({"top_p": 0.0}, "top_p must be in \\(0, 1\\] \\(1 = off\\), got 0.0"),
    ({"tis": {"cap": 0.5}}, "tis.cap must be 0 \\(off\\) or >= 1 .*got 0.5"),
    ({"entropy_bonus": {"coef": -0.1}}, "entropy_bonus.coef must be finite and >= 0, got -0.1"),
    ({"overlong": {"rule": "soft", "buffer": 0}}, "overlong.buffer must be an int >= 1, got 0"),
])
def test_config_errors_name_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        preset("quick", **kw)


def test_mean_tol_is_used_where_terms_cancel():
    # a loss of cancelling terms: the tolerance follows the terms (tests/tolerance.py)
    logp = torch.tensor([[0.2, -0.2]])
    loss, _ = grpo_loss(logp, torch.zeros(1, 2), [1.0], torch.ones(1, 2, dtype=torch.bool),
                        Clip(0.5, 0.5), ratio_level="sequence")                  # s = exp(0) = 1
    assert loss.item() == pytest.approx(-1.0, abs=mean_tol(2, 1.2))


# ---- 1 vs 2 processes with every option on (tests/test_scaling.py's check)

# max_new_tokens 2 truncates most answers, so overlong filtering and the soft penalty act;
# 5 prompts split 3 + 2; adam_eps 1e-6 as in tests/test_scaling.py
SCALE = dict(prompts_per_step=5, group_size=4, steps=3, mu=2, max_new_tokens=2, lr=3e-4,
             warmup_steps=0, adam_eps=1e-6, eval_size=10, eval_every=0, ckpt_every=3,
             time_budget_s=0.0, threads=1)
OPTIONS = {
    "filter_gspo_entropy_k1reward_topp_tis": dict(
        overlong={"rule": "filter"}, loss={"ratio_level": "sequence"}, entropy_bonus={"coef": 0.05},
        kl={"beta": 0.05, "placement": "reward", "estimator": "k1"}, top_p=0.8,
        tis={"cap": 2.0, "level": "seq_mean_k1"}),          # verl's rejection: gathered rows
    "soft_k2loss_tokenmean": dict(overlong={"rule": "soft"}, kl={"beta": 0.05, "estimator": "k2"},
                                  loss={"aggregation": "token_mean"}),
    # the algorithms issue's options (the entropy mask is left out: its quantile is per rank)
    "mask_cispo_rppb_seqmask_klcorr": dict(
        overlong={"rule": "mask"}, loss={"policy": "cispo"}, advantage="reinforce_pp_baseline",
        tis={"cap": 2.0, "level": "sequence_mask"},
        kl={"beta": 0.05, "bias_correction": True, "clamp": 10.0}, clip={"log_ratio_clamp": 20.0}),
    "dualclip_seqis_offpolicymask": dict(clip={"dual_clip": 3.0}, tis={"cap": 2.0, "level": "sequence"},
                                         overlong={"rule": "filter"}, off_policy_mask={"delta": 0.5}),
}


def test_every_option_same_on_1_and_2_processes(tmp_path):
    from grpo_lab.policies.policy import load_policy_any
    from grpo_lab.training.trainer import spawn_train, train
    import json
    cfgs = {n: preset("quick", out_dir=str(tmp_path / f"{n}2"), **SCALE, **kw)
            for n, kw in OPTIONS.items()}
    spawn_train(list(cfgs.values()), 2, run_timeout_s=400, progress=False)
    for n, kw in OPTIONS.items():
        one = train(preset("quick", out_dir=str(tmp_path / f"{n}1"), **SCALE, **kw), progress=False)
        a = load_policy_any(tmp_path / f"{n}1" / "checkpoint.safetensors").state_dict()
        b = load_policy_any(tmp_path / f"{n}2" / "checkpoint.safetensors").state_dict()
        for k in a:
            torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0, msg=f"{n} {k}")
        two = [json.loads(x) for x in (tmp_path / f"{n}2" / "metrics.jsonl").read_text().splitlines()]
        one, two = [h for h in one if h["step"] >= 0], [h for h in two if h["step"] >= 0]
        assert len(one) == len(two) == 3
        assert max(h["completion/truncated_frac"] for h in one) > 0.2, n   # the rule acts
        # the KL in the reward is a sum over a completion's tokens of ref_logp - logp, two
        # forwards over batches that differ between 1 and 2 processes: its rounding follows
        # the log-probs summed (|log p| < 10 here), and beta times it reaches the rewards
        kl_tol = mean_tol(SCALE["max_new_tokens"], 10.0)
        for x, y in zip(one, two):
            for k in x:
                if k.split("/")[0] in ("reward", "completion", "adv", "sample"):
                    tol = kl_tol if k.startswith("reward/kl") else 1e-9 + kw.get("kl", {}).get("beta", 0) * kl_tol
                    assert x[k] == pytest.approx(y[k], abs=tol), (n, k)
                if k.split("/")[0] in ("loss", "policy") or k.startswith("sample/logprob"):
                    assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-7), (n, k)
