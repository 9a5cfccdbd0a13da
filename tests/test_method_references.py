"""Each method name against its reference's formula, written out here independently of
grpo_lab's code (transcribed from the sources, variable names kept where they help):

  * TRL 1.16, trl/trainer/grpo_trainer.py: ``_compute_loss`` (loss_type "cispo":
    ``torch.clamp(coef_1, max=self.epsilon_high).detach()``, normalised by the global token
    count) and ``_generate_and_score_completions`` (``vllm_importance_sampling_mode``
    token_truncate / token_mask / sequence_truncate / sequence_mask with clip_min, clip_max);
  * verl, verl/trainer/ppo/core_algos.py ``compute_policy_loss_cispo`` (clamp of the ratio to
    [1 - clip_ratio_low, 1 + clip_ratio_high], log-ratio clamped to +-20) and ``agg_loss``;
    verl/trainer/ppo/rollout_corr_helper.py ``compute_rollout_correction_weights``
    (rollout_is token / sequence) and ``compute_rollout_rejection_mask`` (rollout_rs
    seq_mean_k1, which writes the rejection into the response mask: the normaliser).

Random cases, float64, seeded; every name must agree on every case, and the test also counts
how often the *other* convention agrees, so it shows that it can tell them apart.
"""
import dataclasses
import math

import pytest
import torch

from grpo_lab.algorithm.loss import Clip, grpo_loss
from grpo_lab.algorithm.token_weights import IS_LEVELS, is_weight
from grpo_lab.training.config import preset

D = torch.float64
CASES = 300


def _cases(seed, n=CASES, rows=3, T=5):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        scale = float(torch.rand((), generator=g)) * 2.0                   # how far off-policy
        log_r = torch.randn(rows, T, generator=g, dtype=D) * scale         # (rows, T)
        if torch.rand((), generator=g) < 0.1:
            log_r[0, 0] = 25.0 * torch.sign(torch.randn((), generator=g, dtype=D))  # past +-20
        A = torch.randn(rows, generator=g, dtype=D)                        # (rows,)
        lengths = torch.randint(1, T + 1, (rows,), generator=g)
        mask = torch.arange(T)[None] < lengths[:, None]                    # (rows, T)
        yield g, log_r, A, mask


def _agree(a, b, scale):
    """Equal up to rounding: the tolerance follows the magnitude of what is summed."""
    return bool(torch.allclose(a, b, rtol=0, atol=1e-12 * max(1.0, scale)))


# ---- CISPO

def _grpo_lab_cispo(log_r, A, mask, **kw):
    logp = log_r.clone().requires_grad_(True)                             # pi_old = 1
    loss, _ = grpo_loss(logp, torch.zeros_like(log_r), A, mask, Clip(**kw), aggregation="token_mean",
                        policy_loss="cispo")
    loss.backward()
    return loss.detach(), logp.grad


def _trl_cispo(log_r, A, mask, epsilon_high):
    """TRL 1.16 ``_compute_loss``, loss_type "cispo": clamp(coef_1, max=epsilon_high), divided by
    num_items_in_batch (the batch's tokens, one process)."""
    per_token_logps = log_r.clone().requires_grad_(True)
    coef_1 = torch.exp(per_token_logps - torch.zeros_like(log_r))
    clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()
    per_token_loss = -clamped_ratios * A[:, None] * per_token_logps
    m = mask.to(D)
    loss = (per_token_loss * m).sum() / m.sum().clamp(min=1.0)
    loss.backward()
    return loss.detach(), per_token_logps.grad * m


def _verl_cispo(log_r, A, mask, clip_ratio_low, clip_ratio_high):
    """verl ``compute_policy_loss_cispo`` with ``agg_loss`` "token-mean"."""
    log_prob = log_r.clone().requires_grad_(True)
    negative_approx_kl = torch.clamp(log_prob - torch.zeros_like(log_r), min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    clipped_ratio_sg = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high).detach()
    pg_losses = -clipped_ratio_sg * A[:, None] * log_prob
    m = mask.to(D)
    loss = (pg_losses * m).sum() / m.sum()
    loss.backward()
    return loss.detach(), log_prob.grad * m


def test_cispo_cap_is_trls_epsilon_high():
    same, old_convention = 0, 0
    for g, log_r, A, mask in _cases(1):
        e = 1.0 + 5.0 * float(torch.rand((), generator=g))                # TRL's epsilon_high
        log_r = log_r.clamp(-20, 20)                                       # TRL does not clamp
        want = _trl_cispo(log_r, A, mask, e)
        scale = float((log_r.abs() * A.abs()[:, None]).max()) * e
        got = _grpo_lab_cispo(log_r, A, mask, cispo_cap=e)
        same += _agree(got[0], want[0], scale) and _agree(got[1], want[1], scale)
        old = _grpo_lab_cispo(log_r, A, mask, cispo_cap=1 + e)             # the cap 1 + eps_high
        old_convention += _agree(old[0], want[0], scale) and _agree(old[1], want[1], scale)
    assert same == CASES
    assert old_convention < CASES // 2                 # the test tells the conventions apart


def test_cispo_floor_and_cap_are_verls_clip_ratios():
    same, without_floor = 0, 0
    for g, log_r, A, mask in _cases(2):
        low, high = 0.1 + 0.3 * float(torch.rand((), generator=g)), 0.28
        want = _verl_cispo(log_r, A, mask, low, high)
        scale = float((log_r.abs().clamp(max=25) * A.abs()[:, None]).max()) * (1 + high)
        got = _grpo_lab_cispo(log_r, A, mask, cispo_cap=1 + high, cispo_floor=1 - low,
                              log_ratio_clamp=20.0)
        same += _agree(got[0], want[0], scale) and _agree(got[1], want[1], scale)
        trl_like = _grpo_lab_cispo(log_r, A, mask, cispo_cap=1 + high, log_ratio_clamp=20.0)
        without_floor += _agree(trl_like[0], want[0], scale)
    assert same == CASES
    assert without_floor < CASES     # verl differs exactly where a ratio is below 1 - low


def test_cispo_refuses_the_clip_range_and_names_its_bounds():
    with pytest.raises(ValueError, match="clip.eps_high=5.0 is not read by loss.policy='cispo'"
                                         ".*clip.cispo_cap"):
        preset("quick", loss={"policy": "cispo"}, clip={"eps_high": 5.0})
    with pytest.raises(ValueError, match="clip.cispo_floor is read only by loss.policy='cispo'"):
        preset("quick", clip={"cispo_floor": 0.8})
    with pytest.raises(ValueError, match="clip.cispo_cap is read only by loss.policy='cispo'"):
        preset("quick", clip={"cispo_cap": 2.0})
    with pytest.raises(ValueError, match="cispo_floor < clip.cispo_cap"):
        preset("quick", loss={"policy": "cispo"}, clip={"cispo_cap": 2.0, "cispo_floor": 2.0})
    c = preset("quick", method="cispo", clip={"cispo_cap": 2.0, "cispo_floor": 0.8})
    assert (c.loss.policy, c.clip.cispo_cap, c.clip.cispo_floor) == ("cispo", 2.0, 0.8)


# ---- the IS modes

def _verl_is(rollout_is, log_ratio, response_mask, threshold):
    """verl ``compute_rollout_correction_weights`` (no batch normalisation)."""
    m = response_mask.to(D)
    if rollout_is == "token":
        w = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    else:
        s = (torch.where(response_mask, log_ratio, 0.0) * m).sum(-1).unsqueeze(-1)
        w = torch.exp(torch.clamp(s, min=-20.0, max=20.0)).expand_as(log_ratio)
    return (w * m).clamp(max=threshold)


def _verl_seq_mean_k1_mask(log_ratio, response_mask, threshold):
    """verl ``compute_rollout_rejection_mask``, rollout_rs "seq_mean_k1", one threshold U: the
    bounds are [1/U, U]; -> the modified response mask."""
    m = response_mask.to(D)
    token_k1 = -torch.clamp(log_ratio, min=-20.0, max=20.0)
    seq_stat = (torch.where(response_mask, token_k1, 0.0) * m).sum(-1) / (m.sum(-1) + 1e-8)
    lower_log, upper_log = math.log(1.0 / threshold), math.log(threshold)
    keep = (seq_stat >= lower_log) & (seq_stat <= upper_log)
    return m * keep[:, None].to(D)


def _trl_is(mode, logps_diff_tokens, mask, clip_min, clip_max):
    """TRL 1.16 ``vllm_importance_sampling_mode`` (old_per_token_logps - sampling_logps)."""
    per_token_logps_diff = logps_diff_tokens * mask.to(D)
    if mode in ("sequence_mask", "sequence_truncate"):
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ("sequence_truncate", "token_truncate"):
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        ratio = ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)
    return ratio.expand_as(logps_diff_tokens) * mask.to(D)                # the loss's mask


@pytest.mark.parametrize("name", ["token", "sequence", "seq_mean_k1", "token_truncate",
                                  "sequence_truncate", "token_mask", "sequence_mask"])
def test_is_level_against_its_reference(name):
    same, counts = 0, {}
    for g, log_w, _, mask in _cases(10 + len(name)):
        cap = 1.0 + 2.0 * float(torch.rand((), generator=g))
        floor = 0.5 * float(torch.rand((), generator=g)) if name in (
            "token_truncate", "sequence_truncate", "token_mask", "sequence_mask") else 0.0
        if name in ("token", "sequence"):
            want = _verl_is(name, log_w, mask, cap)
        elif name == "seq_mean_k1":
            want = _verl_seq_mean_k1_mask(log_w, mask, cap)
        else:
            want = _trl_is(name, log_w, mask, floor or None, cap)
        got = is_weight(name, log_w, torch.zeros_like(log_w), mask, cap, floor)
        same += _agree(got, want, cap)
        for other in ("seq_mean_k1", "sequence_mask"):                     # the old confusion
            if other != name:
                o = is_weight(other, log_w, torch.zeros_like(log_w), mask, cap, floor * (
                    IS_LEVELS[other].reads_floor))
                counts[other] = counts.get(other, 0) + _agree(o, want, cap)
    assert same == CASES, f"{name}: {same}/{CASES} agree with {IS_LEVELS[name].reference}"
    if name in ("seq_mean_k1", "sequence_mask"):                          # each is not the other
        other = "sequence_mask" if name == "seq_mean_k1" else "seq_mean_k1"
        assert counts[other] < CASES // 2, counts


def test_is_weight_refuses_what_it_cannot_weigh_by_name():
    # a (1, T) trainer_logp was broadcast over N rows, an unknown level was a bare KeyError,
    # cap NaN gave NaN weights and seq_mean_k1 with cap 0 a ZeroDivisionError (log(1 / 0))
    z, m = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="trainer_logp, sampler_logp and mask must be one "
                                         "\\(N, T\\) shape \\(not broadcast\\), got \\(1, 3\\), "
                                         "\\(2, 3\\) and \\(2, 3\\)"):
        is_weight("token", torch.zeros(1, 3), z, m, 2.0)
    with pytest.raises(ValueError, match="unknown tis.level 'tokn'; known: \\['seq_mean_k1'"):
        is_weight("tokn", z, z, m, 2.0)
    for level, cap in (("token", math.nan), ("seq_mean_k1", 0.0), ("sequence", -1.0)):
        with pytest.raises(ValueError, match=f"cap must be a finite number > 0, got {cap}"):
            is_weight(level, z, z, m, cap)
    with pytest.raises(ValueError, match="floor must be a finite number >= 0 \\(0 = none\\), "
                                         "got nan"):
        is_weight("token_truncate", z, z, m, 2.0, math.nan)
    # w = e^0.5 = 1.6487 on row 0; capped at 1.5 (token), kept as is on row 1 (e^-0.5)
    tl = torch.tensor([[0.5], [-0.5]])
    assert is_weight("token", tl, torch.zeros(2, 1), torch.ones(2, 1), 1.5).flatten().tolist() \
        == pytest.approx([1.5, math.exp(-0.5)])


def test_tis_floor_is_read_by_trls_modes_only():
    with pytest.raises(ValueError, match="tis.floor=0.5 is TRL's clip_min.*tis.level="
                                         "'seq_mean_k1' \\(verl rollout_rs='seq_mean_k1'\\)"):
        preset("quick", tis={"cap": 2.0, "level": "seq_mean_k1", "floor": 0.5})
    with pytest.raises(ValueError, match="tis.floor must be 0 \\(none\\) or a bound below"):
        preset("quick", tis={"cap": 2.0, "level": "token_mask", "floor": 3.0})
    with pytest.raises(ValueError, match="tis.floor=0.5 bounds the weights of tis.cap's modes"):
        preset("quick", tis={"floor": 0.5})
    with pytest.raises(ValueError, match="unknown tis.level 'geometric'"):
        preset("quick", tis={"cap": 2.0, "level": "geometric"})
    assert preset("quick", tis={"cap": 3.0, "level": "sequence_mask", "floor": 0.5}).tis.floor == 0.5


# ---- the normaliser: verl's rejection takes the rejected rows out of it, TRL's mask does not

def _step_with_off_policy_rows(monkeypatch, level, aggregation, shift_rows=(0, 3)):
    """One collect + grpo_objective on the toy with tis on, the trainer's old log-probs moved
    by +1 per token on ``shift_rows`` (geometric-mean ratio e > cap 2: rejected by seq_mean_k1)
    -> (the objective's loss, the policy's log-probs, old, sampler, mask, advantages)."""
    from grpo_lab.algorithm import variants
    from grpo_lab.algorithm.rollout import completion_logprobs
    from grpo_lab.policies.engine import UPDATE_FORWARDS
    from grpo_lab.policies.model import load_policy
    from grpo_lab.tasks.task_data import load_eval
    from grpo_lab.training.step import StepContext, collect, grpo_objective
    from grpo_lab.training.trainer import make_grouper, prompt_source

    def shifted(policy, cfg, r, ctx):
        old = completion_logprobs(policy, r, cfg.temperature,
                                  forward=UPDATE_FORWARDS[cfg.speed.update_forward])
        bump = torch.zeros(old.shape[0], 1)
        bump[list(shift_rows)] = 1.0
        return {"old": old + bump * r.policy_mask}
    monkeypatch.setitem(variants.VARIANTS, "tis",
                        dataclasses.replace(variants.VARIANTS["tis"], rows=shifted))
    c = preset("quick", prompts_per_step=2, group_size=4, kl={"beta": 0.0}, loss={"aggregation": aggregation},
               tis={"cap": 2.0, "level": level})
    policy = load_policy(c.base_checkpoint)
    held_out = {e.prompt for t in c.task_names for e in load_eval(t)}
    batch = collect(policy, c, 0, StepContext(prompt_source(c, held_out), make_grouper(c), policy))
    loss, _ = grpo_objective(policy, batch, c)
    r = batch.scored.rollout
    with torch.no_grad():
        logp = completion_logprobs(policy, r, c.temperature)
    _step_with_off_policy_rows.last = (policy, batch)
    return float(loss.detach()), logp, batch.rows["old"], r.logprobs, r.policy_mask, batch.advantages, c


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_seq_mean_k1_takes_rejected_rows_out_of_the_normaliser_as_verl(monkeypatch, aggregation):
    loss, logp, old, sampler, mask, A, c = _step_with_off_policy_rows(
        monkeypatch, "seq_mean_k1", aggregation)
    m = mask.to(logp.dtype)
    response_mask = _verl_seq_mean_k1_mask((old - sampler).double(), mask, 2.0).to(logp.dtype)
    assert response_mask.sum(1).tolist()[0] == 0 and response_mask.sum(1).tolist()[3] == 0
    assert (response_mask.sum(1) == m.sum(1))[[1, 2, 4, 5, 6, 7]].all()
    # verl: the clipped surrogate (ratio to the trainer's old log-probs), agg_loss on the
    # modified mask ("token-mean": its tokens; "seq-mean-token-mean": its non-empty rows)
    ratio = torch.exp(logp - old)
    pg = -torch.min(ratio * A[:, None], ratio.clamp(1 - c.clip.eps_low, 1 + c.clip.eps_high) * A[:, None])
    if aggregation == "token_mean":
        want = (pg * response_mask).sum() / response_mask.sum()
    else:
        n = response_mask.sum(-1)
        seq = (pg * response_mask).sum(-1) / (n + 1e-8)
        want = (seq * (n > 0)).sum() / (n > 0).sum()
    assert loss == pytest.approx(float(want), abs=1e-6)
    # TRL's normaliser would still count the rejected rows' tokens: a different number
    trl = (pg * response_mask).sum() / m.sum() if aggregation == "token_mean" else \
        ((pg * response_mask).sum(-1) / m.sum(-1)).mean()
    assert abs(loss - float(trl)) > 1e-3


def test_trl_sequence_mask_keeps_masked_rows_in_the_normaliser(monkeypatch):
    loss, logp, old, sampler, mask, A, c = _step_with_off_policy_rows(
        monkeypatch, "sequence_mask", "token_mean")
    m = mask.to(logp.dtype)
    w = _trl_is("sequence_mask", (old - sampler).double(), mask, None, 2.0).to(logp.dtype)
    assert (w.sum(1) == 0).tolist()[0] and (w.sum(1) == 0).tolist()[3]
    ratio = torch.exp(logp - old)
    pg = -torch.min(ratio * A[:, None], ratio.clamp(1 - c.clip.eps_low, 1 + c.clip.eps_high) * A[:, None])
    want = (pg * w * m).sum() / m.sum()                 # TRL: per_token_loss * IS ratio, mask kept
    assert loss == pytest.approx(float(want), abs=1e-6)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_seq_mean_k1_micro_batches_add_up_to_the_whole_batch(monkeypatch, aggregation):
    """The rejection is decided again on each micro-batch's rows; with the global counts
    (rejected rows left out) the micro-batches' losses add up to the whole batch's."""
    from grpo_lab.training.step import backward, grpo_objective, split_batch
    loss, *_, c = _step_with_off_policy_rows(monkeypatch, "seq_mean_k1", aggregation,
                                             shift_rows=(0, 5))
    policy, batch = _step_with_off_policy_rows.last
    for m in (2, 4):
        shares = backward(grpo_objective, policy, split_batch(batch, m), c)
        assert shares["loss/total"] == pytest.approx(loss, abs=1e-6), m


def test_a_saved_config_from_before_the_renames_keeps_its_meaning_or_says_why_not():
    from grpo_lab.training.config import from_dict, to_dict
    from grpo_lab.training.saved_config import config_changes
    old = to_dict(preset("quick", loss={"policy": "cispo"}))
    old["clip"] = {k: v for k, v in old["clip"].items() if k not in ("cispo_cap", "cispo_floor")}
    old["clip"]["eps_high"] = 4.0                      # then: a cap of 1 + 4 = 5
    cfg = from_dict(old)
    assert (cfg.clip.cispo_cap, cfg.clip.eps_high) == (5.0, 0.28)
    assert config_changes(old, to_dict(cfg)) == {}     # --resume: the saved run, unchanged
    assert config_changes(old, to_dict(preset("quick", loss={"policy": "cispo"},
                                               clip={"cispo_cap": 2.0}))) == {
        "clip.cispo_cap": [5.0, 2.0]}                  # a change named in today's names
    old["clip"].update(eps_low=0.1, eps_high=0.5)      # eps_low: read by no cispo loss then
    cfg = from_dict(old)
    assert (cfg.clip.cispo_cap, cfg.clip.eps_low, cfg.clip.cispo_floor) == (1.5, 0.2, 0.0)
    old = to_dict(preset("quick", tis={"cap": 2.0, "level": "sequence_mask"}))
    del old["tis"]["floor"]
    with pytest.raises(ValueError, match="saved when tis.level='sequence_mask' meant the "
                                         "geometric-mean rejection.*seq_mean_k1"):
        from_dict(old)
