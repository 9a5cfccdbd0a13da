"""Agents (grpo_lab/agents/): environments and tools as records, the multi-turn rollout, the
observation tokens' zero gradient, KV reuse == recompute, GiGPO's step advantages by hand,
hostile environments, the objective's refusals."""
from __future__ import annotations

import math
import random
import re
import time

import pytest
import torch

from grpo_lab import timelimit
from grpo_lab.agents import step as agent_step  # noqa: F401 (the environments, "agent")
from grpo_lab.agents.credit import (CREDITS, discounted_returns, gigpo_credit, mtgrpo_credit,
                                    step_advantages, step_groups, turn_advantages)
from grpo_lab.agents.environments import (ENVIRONMENTS, TOOLS, AgentSettings, EnvironmentFailed,
                                          call_tool, get_environment, parse_call,
                                          register_environment)
from grpo_lab.agents.episodes import Turn, sample_episodes
from grpo_lab.agents.games import GuessNumber, optimal_guesses
from grpo_lab.algorithm.rollout import Rollout, Scored, completion_logprobs
from grpo_lab.policies.engine import UPDATE_FORWARDS
from grpo_lab.policies.model import GPT, GPTConfig
from grpo_lab.tasks import TASKS, Example, get_task
from grpo_lab.tokenizer import EOS, VOCAB_SIZE, encode
from grpo_lab.training.config import check_records, TrainConfig
from grpo_lab.training.step import Batch, grpo_objective


def policy(seed=0, block=32):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB_SIZE, block_size=block, n_layer=2, n_head=2, n_embd=32))


def base():
    from grpo_lab.policies.model import load_policy
    return load_policy("data/base_policy.safetensors")


def examples(name, n, seed=0):
    rng = random.Random(seed)
    return [get_task(name).make(rng) for _ in range(n)]


def gens(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


# ---- the guessing game and the tool syntax, by hand

def test_guess_number_feedback_state_and_reward():
    env = GuessNumber()
    assert env.reset(Example("g:10-17=", "13", "guess", fields={"lo": 10, "hi": 17}), 0) == ""
    assert env.state_key() == (10, 17)
    assert env.step("15") == ("<", 0.0, False) and env.state_key() == (10, 14)
    assert env.step("11") == (">", 0.0, False) and env.state_key() == (12, 14)
    assert env.step("x") == ("?", 0.0, False) and env.state_key() == (12, 14)
    assert env.step("16") == ("?", 0.0, False)           # outside what the feedback left
    obs, reward, done = env.step("13")
    assert (obs, done) == ("", True) and reward == pytest.approx(1 - 0.1 * 4)


def test_optimal_guesses_by_hand():
    # 8 numbers: depths 1, 2, 2, 3, 3, 3, 3, 4 under bisection -> 21 / 8
    assert optimal_guesses(1) == 1 and optimal_guesses(2) == 1.5
    assert optimal_guesses(8) == pytest.approx(21 / 8)
    assert optimal_guesses(4) == pytest.approx((1 + 2 + 2 + 3) / 4)


def test_tool_calls_errors_are_observations():
    assert parse_call("46") is None
    assert parse_call("?add:12,34") == ("add", ["12", "34"])
    assert call_tool(TOOLS, "?add:12,34") == "46"
    assert call_tool(TOOLS, "?add12") == "error: a call is ?name:args"
    assert call_tool(TOOLS, "?mul:2,3") == "error: no tool mul"
    assert call_tool(TOOLS, "?add:1") == "error: TypeError"        # a missing argument
    assert call_tool(TOOLS, "?add:a,1") == "error: ValueError"
    env = get_environment("add_tool").make()
    env.reset(Example("1+2+3=", "6", "add_tool"), 0)
    assert env.step("?add:1,2") == ("3", 0.0, False)
    assert env.step("6") == ("", 1.0, True)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="max_turns must be an int >= 1, got 0"):
        AgentSettings(max_turns=0)
    with pytest.raises(ValueError, match="unknown credit assignment 'nope'"):
        AgentSettings(credit="nope")
    with pytest.raises(ValueError, match="gamma must be in"):
        AgentSettings(gamma=1.5)


# ---- the rollout: masks, KV reuse == recompute

def test_episode_layout_and_masks():
    m = base()
    ep = sample_episodes(m, examples("add_retry", 3), get_environment("add_retry"), 4,
                         generator=gens(3), temperature=1.0)
    r = ep.scored.rollout
    assert r.completion_ids.shape[0] == 12 and r.loss_mask is not None
    assert bool((r.loss_mask <= r.completion_mask).all())
    # every row's real tokens contiguous from column 0, padding after
    lengths = r.completion_mask.sum(1)
    assert torch.equal(r.completion_mask, torch.arange(r.completion_mask.shape[1])[None] < lengths[:, None])
    for i, turns in enumerate(ep.turns):
        own = r.loss_mask[i].nonzero().flatten().tolist()
        assert own == [c for t in turns for c in range(t.start, t.end)] or ep.end[i] == "tokens"
        assert bool((r.logprobs[i][~r.loss_mask[i]] == 0).all())  # forced tokens: no log-prob
        assert len(turns) <= 3 and ep.end[i] in ("done", "turns", "tokens")
    # the G episodes of a prompt start from one state
    assert all(ep.turns[i][0].key == ep.turns[i - i % 4][0].key for i in range(12) if ep.turns[i])


def test_kv_reuse_across_turns_equals_recompute():
    m = base()
    env = get_environment("add_retry")
    exs = examples("add_retry", 3, seed=2)
    a = sample_episodes(m, exs, env, 4, generator=gens(3), temperature=1.0)
    b = sample_episodes(m, exs, env, 4, generator=gens(3), temperature=1.0, use_cache=False)
    ra, rb = a.scored.rollout, b.scored.rollout
    assert torch.equal(ra.completion_ids, rb.completion_ids)
    assert torch.equal(ra.loss_mask, rb.loss_mask) and a.end == b.end
    assert sum(len(t) for t in a.turns) > 12              # several turns were taken
    assert bool(((~ra.loss_mask) & ra.completion_mask).any())   # observations in the sequence
    # log-probs of a few units: float32 rounding of two summation orders
    assert torch.allclose(ra.logprobs, rb.logprobs, atol=1e-5, rtol=0)
    for forward in ("prompt_once", "completion", "packed", "all_positions"):  # the update's
        lp = completion_logprobs(m, ra, 1.0, forward=UPDATE_FORWARDS[forward])
        assert torch.allclose(lp[ra.loss_mask], ra.logprobs[ra.loss_mask], atol=1e-5, rtol=0)


def _hand_built_batch():
    """One prompt, two episodes: "g:1-4=" then 2<eos> [>] 3<eos>, and 3<eos> [<] 1<eos>."""
    ex = Example("g:1-4=", "3", "guess4", fields={"lo": 1, "hi": 4})
    p = encode(ex.prompt)
    rows = [[encode("2")[0], EOS, encode(">")[0], encode("3")[0], EOS],
            [encode("3")[0], EOS, encode("<")[0], encode("1")[0], EOS]]
    own = torch.tensor([[1, 1, 0, 1, 1]] * 2, dtype=torch.bool)
    r = Rollout(torch.tensor([p, p]), torch.ones(2, len(p), dtype=torch.bool),
                torch.tensor(rows), torch.ones(2, 5, dtype=torch.bool), torch.zeros(2, 5),
                torch.tensor([0, 0]), torch.tensor([True, False]), loss_mask=own)
    rewards = torch.tensor([0.9, 0.0])
    s = Scored([ex], r, rewards, {"env": rewards}, ["", ""])
    return s, own


@pytest.mark.parametrize("beta,entropy_coef", [(0.0, 0.0), (0.1, 0.01)])
def test_environment_tokens_get_exactly_zero_gradient(beta, entropy_coef):
    m = policy(2)
    m.train()
    s, own = _hand_built_batch()
    cfg = TrainConfig(objective="agent", task="guess4", kl={"beta": beta}, entropy_bonus={"coef": entropy_coef},
                      speed={"update_forward": "completion"}, eval_size=0, temperature=1.0)
    s.rollout.logprobs = completion_logprobs(m, s.rollout).detach().masked_fill(~own, 0.0)
    rows = {"ref": completion_logprobs(policy(3), s.rollout)} if beta else {}
    batch = Batch(s, torch.tensor([1.0, -1.0]), rows, 2, int(own.sum()), torch.tensor([0]), {})
    kept = {}
    hook = m.lm_head.register_forward_hook(lambda mod, i, out: kept.setdefault("logits", out))
    loss, _ = grpo_objective(m, batch, cfg)
    hook.remove()
    logits = kept["logits"]                                # (2, Tp + Tc, V): one forward
    grad, = torch.autograd.grad(loss, logits)
    assert logits.shape[1] == own.shape[1] + 1             # logits_to_keep = Tc + 1
    g = grad[:, :-1]                                       # (2, Tc, V): predicts completion j
    assert bool((g[~own] == 0).all())                      # the observation tokens: exactly 0
    assert bool((g[own].abs().sum(-1) > 0).all())          # every policy token: some gradient


def test_policy_mask_sets_the_normaliser_and_statistics():
    m = policy(2)
    s, own = _hand_built_batch()
    s.rollout.logprobs = completion_logprobs(m, s.rollout).detach().masked_fill(~own, 0.0)
    # per-token advantages with a large value on the observation's column: token_mean over
    # the 8 policy tokens at ratio 1 gives -(1 + 1 + 1 + 1) / 8 = -0.5; had the observation
    # counted, -(4 + 10) / 10 = -1.4
    A = torch.tensor([[1.0, 1.0, 10.0, 1.0, 1.0], [0.0] * 5])
    for aggregation, expected in (("token_mean", -0.5), ("seq_mean_token_mean", -0.5)):
        cfg = TrainConfig(objective="agent", task="guess4", kl={"beta": 0.0}, eval_size=0,
                          loss={"aggregation": aggregation}, temperature=1.0)
        batch = Batch(s, A, {}, 2, int(own.sum()), torch.tensor([0]), {})
        loss, shares = grpo_objective(m, batch, cfg)
        assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)   # terms of size 1
        assert shares["clip/ratio_mean"] == pytest.approx(1.0, abs=1e-6)


# ---- GiGPO, by hand from the paper's definitions (eq. 5-8)

def test_discounted_returns_by_hand():
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1.0, 2.0], 1.0) == [3.0, 2.0]


def test_gigpo_step_advantages_hand_worked():
    # one prompt, three episodes (gamma 0.5):
    #   A: s0 -> s1 -> success    rewards 0, 1       R = 0.5, 1
    #   B: s0 -> s2 (truncated)   rewards 0, 0       R = 0, 0
    #   C: s0 -> s1 -> s3 -> win  rewards 0, 0, 1    R = 0.25, 0.5, 1
    # step groups: s0 {A0 .5, B0 0, C0 .25}: mean .25, unbiased std .25 -> +1, -1, 0
    #              s1 {A1 1, C1 .5}: mean .75, std sqrt(.125) -> +-.25 / .353553 = +-.707107
    #              s2 {B1}, s3 {C2}: alone -> 0
    T = lambda k, r, a, b: Turn(k, r, a, b)                              # noqa: E731
    turns = [[T("s0", 0.0, 0, 2), T("s1", 1.0, 3, 5)],
             [T("s0", 0.0, 0, 2), T("s2", 0.0, 3, 5)],
             [T("s0", 0.0, 0, 2), T("s1", 0.0, 3, 5), T("s3", 1.0, 6, 8)]]
    pi = torch.tensor([0, 0, 0])
    assert {k: len(v) for k, v in step_groups(turns, pi).items()} == \
        {(0, "s0"): 3, (0, "s1"): 2, (0, "s2"): 1, (0, "s3"): 1}
    std = step_advantages(turns, pi, 0.5, "std")
    e = 1e-6
    assert std[0] == pytest.approx([0.25 / (0.25 + e), 0.25 / (math.sqrt(0.125) + e)], abs=1e-9)
    assert std[1] == pytest.approx([-0.25 / (0.25 + e), 0.0], abs=1e-9)
    assert std[2] == pytest.approx([0.0, -0.25 / (math.sqrt(0.125) + e), 0.0], abs=1e-9)
    none = step_advantages(turns, pi, 0.5, "none")
    assert none == [pytest.approx([0.25, 0.25]), pytest.approx([-0.25, 0.0]),
                    pytest.approx([0.0, -0.25, 0.0])]
    # eq. 8 on the tokens: A^E on every column, + omega A^S on each action's columns
    A_E = torch.tensor([0.5, -1.0, 0.5])
    A = gigpo_credit(A_E, turns, pi, 9, AgentSettings(credit="gigpo", omega=2.0, gamma=0.5,
                                                      step_norm="none"))
    assert A.shape == (3, 9)
    assert A[0].tolist() == pytest.approx([1.0, 1.0, 0.5, 1.0, 1.0] + [0.5] * 4)
    assert A[1].tolist() == pytest.approx([-1.5, -1.5] + [-1.0] * 7)
    assert A[2].tolist() == pytest.approx([0.5, 0.5, 0.5, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    assert CREDITS["episode"].fn(A_E, turns, pi, 9, None) is A_E


# ---- MT-GRPO, by hand (credit.py: A^O + lambda A^T on the intermediate turns)

def test_mtgrpo_turn_advantages_hand_worked():
    # prompt 0, three episodes of 2 turns (action columns [0, 2) and [3, 5), observation 2):
    #   A: rewards 1, 1     B: rewards 0, 0     C: rewards .5, 0
    #   turn group (0, position 0) {A 1, B 0, C .5}: mean .5, unbiased std
    #   sqrt((.25 + .25 + 0) / 2) = .5 -> A^T = +.5/(.5 + 1e-4), -.5/(.5 + 1e-4), 0
    #   the last turns (position 1) are in no group: A^T = 0
    # prompt 1, three episodes of 3, 1 and 2 turns:
    #   D: rewards .2, .4, 1    E: reward 1 (one turn: no intermediate turn)    F: .6, 1
    #   group (1, 0) {D .2, F .6}: mean .4, std sqrt(.04 + .04) = sqrt(.08) = .282843
    #     -> A^T = -.2/(.282843 + 1e-4) = -.706857 (D), +.706857 (F)
    #   group (1, 1) {D .4}: alone -> 0
    T = lambda r, a, b: Turn(None, r, a, b)                              # noqa: E731
    two = lambda r0, r1: [T(r0, 0, 2), T(r1, 3, 5)]                       # noqa: E731
    turns = [two(1.0, 1.0), two(0.0, 0.0), two(0.5, 0.0),
             [T(0.2, 0, 2), T(0.4, 3, 5), T(1.0, 6, 8)], [T(1.0, 0, 2)], two(0.6, 1.0)]
    pi = torch.tensor([0, 0, 0, 1, 1, 1])
    a, d = 0.5 / (0.5 + 1e-4), 0.2 / (math.sqrt(0.08) + 1e-4)
    assert d == pytest.approx(0.706857, abs=1e-6)
    adv = turn_advantages(turns, pi)
    expected = [[a, 0.0], [-a, 0.0], [0.0, 0.0], [-d, 0.0, 0.0], [0.0], [d, 0.0]]
    for got, want in zip(adv, expected):
        assert got == pytest.approx(want, abs=1e-12)
    # on the tokens, lambda = 0.5: A^O on every column, + lambda A^T on intermediate actions
    A_O = torch.tensor([1.0, -1.0, 0.0, 0.5, 0.25, -0.75])
    A = mtgrpo_credit(A_O, turns, pi, 9, AgentSettings(credit="mtgrpo", turn_coef=0.5))
    assert A.shape == (6, 9)
    h = 0.5 * a                                                           # .49990
    assert A[0].tolist() == pytest.approx([1 + h, 1 + h] + [1.0] * 7, abs=1e-6)
    assert A[1].tolist() == pytest.approx([-1 - h, -1 - h] + [-1.0] * 7, abs=1e-6)
    assert A[2].tolist() == pytest.approx([0.0] * 9, abs=1e-6)
    assert A[3].tolist() == pytest.approx([0.5 - d / 2] * 2 + [0.5] * 7, abs=1e-6)
    assert A[4].tolist() == pytest.approx([0.25] * 9, abs=1e-6)
    assert A[5].tolist() == pytest.approx([-0.75 + d / 2] * 2 + [-0.75] * 7, abs=1e-6)
    # lambda 0, or no reward before the last turn (guess, add_retry): the episode's credit
    zero = mtgrpo_credit(A_O, turns, pi, 9, AgentSettings(credit="mtgrpo", turn_coef=0.0))
    assert torch.equal(zero, A_O[:, None].expand(6, 9))
    last_only = [[Turn(None, 0.0, t.start, t.end) for t in row[:-1]] + row[-1:] for row in turns]
    same = mtgrpo_credit(A_O, last_only, pi, 9, AgentSettings(credit="mtgrpo", turn_coef=0.5))
    assert torch.equal(same, A_O[:, None].expand(6, 9))
    with pytest.raises(ValueError, match="turn_coef must be a number >= 0, got -1"):
        AgentSettings(credit="mtgrpo", turn_coef=-1)


def test_a_cut_action_is_no_turn_and_gets_the_episode_advantage():
    # credit.py: an action cut at max_action_tokens is no Turn. One prompt, three episodes,
    # columns [0, 2) the first action, 2 an observation, [3, 5) the second:
    #   A: tool turn rewarded .5, then an answer cut in [3, 5): turns [.5]: its only turn is
    #      its last, so no turn group; every column A^O (mtgrpo) or A^E + A^S on [0, 2) (gigpo)
    #   B: .0 then answer 1     C: 1. then answer 0
    #   turn group (0, position 0) = {B 0, C 1}: mean .5, std sqrt(.5) -> A^T = -+.5/(.7071+1e-4)
    #   step group "s" = {A .5, B .95, C 1} (gamma .95): mean .816667, unbiased std
    #   sqrt((.100278 + .017778 + .033611) / 2) = .275379 -> A^S(A) = -.316667 / .275380
    #   = -1.149928
    T = lambda k, r, a, b: Turn(k, r, a, b)                              # noqa: E731
    turns = [[T("s", 0.5, 0, 2)], [T("s", 0.0, 0, 2), T("b", 1.0, 3, 5)],
             [T("s", 1.0, 0, 2), T("c", 0.0, 3, 5)]]
    pi, A_O = torch.tensor([0, 0, 0]), torch.tensor([0.25, 0.5, -0.75])
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert turn_advantages(turns, pi) == [[0.0], [pytest.approx(-a), 0.0],
                                          [pytest.approx(a), 0.0]]
    A = mtgrpo_credit(A_O, turns, pi, 6, AgentSettings(credit="mtgrpo"))
    assert A[0].tolist() == [0.25] * 6                                    # the cut answer too
    assert A[1].tolist() == pytest.approx([0.5 - a] * 2 + [0.5] * 4, abs=1e-6)
    s = -(0.5 - 2.45 / 3) / (math.sqrt(((0.5 - 2.45 / 3) ** 2 + (0.95 - 2.45 / 3) ** 2
                                        + (1 - 2.45 / 3) ** 2) / 2) + 1e-6)
    assert s == pytest.approx(1.149928, abs=1e-6)
    A = gigpo_credit(A_O, turns, pi, 6, AgentSettings(credit="gigpo"))
    assert A[0].tolist() == pytest.approx([0.25 - s] * 2 + [0.25] * 4, abs=1e-6)


def _turn_reward_plugin():
    from pathlib import Path

    from grpo_lab.registry import load_plugins
    plugin = str(Path(__file__).resolve().parent / "plugins" / "second_turn_env.py")
    load_plugins(plugin)
    return plugin


def test_mtgrpo_trains_through_the_agent_objective(tmp_path):
    """Three steps of the agent objective on an environment with a turn reward: the step reads
    the environment's credit, "mtgrpo", each time; a finite loss each step; the weights moved."""
    from grpo_lab.policies.policy import load_policy_any
    from grpo_lab.training.config import preset
    from grpo_lab.training.trainer import train
    _turn_reward_plugin()
    seen = []
    real = agent_step.get_credit

    def spy(name):
        c = real(name)
        seen.append(name)
        return c
    agent_step.get_credit = spy
    try:
        cfg = preset("agent_cpu", task="turn_reward",
                     base_checkpoint="data/base_policy.safetensors", steps=3, prompts_per_step=4, group_size=4, eval_every=0, eval_size=0,
                     threads=1, time_budget_s=0.0, ckpt_every=3, out_dir=str(tmp_path / "run"))
        h = train(cfg, progress=False)
    finally:
        agent_step.get_credit = real
    assert seen == ["mtgrpo"] * 3
    losses = [r["loss/total"] for r in h if "loss/total" in r]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    trained = load_policy_any(tmp_path / "run" / "checkpoint.safetensors").state_dict()
    start = base().state_dict()
    assert any(not torch.equal(trained[k], start[k]) for k in start)  # the steps moved it


def test_a_study_compares_mtgrpo_with_episode_credit(tmp_path):
    """``grpo-lab study``'s arms select the credit by environment variant (``--arm mtgrpo
    task=turn_reward``): both arms run, paired by seed, and their updates differ."""
    from grpo_lab.cli import study_arms
    from grpo_lab.training.experiments import run_experiment
    plugin = _turn_reward_plugin()
    arms = study_arms([["episode", "task=turn_reward_episode"], ["mtgrpo", "task=turn_reward"]])
    assert arms == {"episode": {"task": "turn_reward_episode"}, "mtgrpo": {"task": "turn_reward"}}
    base_cfg = {"objective": "agent", "dynamic": {"sampling": False}, "kl": {"beta": 0.0},
                "lr": 3e-4, "temperature": 1.0, "prompts_per_step": 4, "group_size": 4, "steps": 2,
                "eval_every": 0, "eval_size": 0, "ckpt_every": 10, "threads": 1,
                "plugins": plugin}
    res = run_experiment(arms, seeds=(0,), base=base_cfg, processes=1, progress=False)
    runs = {r["strategy"]: r["history"] for r in res.runs}
    assert set(runs) == {"episode", "mtgrpo"}
    rows = {k: [r for r in h if "loss/total" in r] for k, h in runs.items()}
    assert [len(v) for v in rows.values()] == [2, 2]
    # step 0: the same prompts and episodes (the same start, seed 0), other advantages on
    # the first turns' tokens, so another gradient
    e, m = rows["episode"][0], rows["mtgrpo"][0]
    assert e["reward/mean"] == m["reward/mean"] and e["grad/norm"] != m["grad/norm"]


# ---- hostile environments

class _Hostile:
    mode = "raise"

    def reset(self, example, seed):
        return ""

    def step(self, action):
        if self.mode == "raise":
            raise KeyError("boom")
        if self.mode == "hang":
            while True:
                time.sleep(0.01)
        if self.mode == "huge":
            return "<" * 100000 + "\u00e9", 0.0, False
        return "not a tuple"

    def state_key(self):
        return 0


def _hostile(mode):
    cls = type(f"Hostile_{mode}", (_Hostile,), {"mode": mode})
    cls.__module__ = __name__
    name = f"hostile_{mode}"
    if name not in ENVIRONMENTS:
        def make_example(rng, _name=name):
            return Example(f"{rng.randrange(100)}+1=", "1", _name)
        make_example.__qualname__ = f"hostile_{mode}_examples"
        register_environment(name, cls, make_example, AgentSettings(max_turns=3),
                             answer_chars="0123456789", max_answer_len=1)
    return get_environment(name)


def test_environment_that_raises_is_named():
    with pytest.raises(EnvironmentFailed, match=r"environment 'hostile_raise': step\(\) on "
                                                r"action .* raised KeyError: 'boom'"):
        sample_episodes(base(), [Example("1+1=", "1", "x")], _hostile("raise"), 2)


def test_a_prompt_past_the_context_is_named_before_any_forward():
    model = base()
    long = "1+" * model.cfg.block_size + "1="               # 2 x block_size + 2 tokens
    with pytest.raises(ValueError, match=rf"environment 'guess': prompt '1\+1\+.*' is "
                                         rf"{2 * model.cfg.block_size + 2} tokens, past the "
                                         rf"model's block_size {model.cfg.block_size}"):
        sample_episodes(model, [Example("1+1=", "1", "x"), Example(long, "1", "x")],
                        get_environment("guess"), 2)


def test_environment_with_wrong_types_is_named():
    with pytest.raises(EnvironmentFailed, match=r"must return \(observation str, finite reward"):
        sample_episodes(base(), [Example("1+1=", "1", "x")], _hostile("types"), 2)


def _returning(name, *outs, settings=AgentSettings(max_turns=4)):
    """The environment ``name`` whose step on turn t (1, 2, ...) returns outs[t - 1] (a
    function of the action, or the value), the last one after that."""
    class Scripted(_Hostile):
        def reset(self, example, seed):
            self.turn = 0
            return ""

        def step(self, action):
            self.turn += 1
            out = outs[min(self.turn, len(outs)) - 1]
            return out(action) if callable(out) else out
    Scripted.__qualname__ = f"Scripted_{name}"
    ENVIRONMENTS.pop(name, None)
    if name not in TASKS:
        def make_example(rng, _name=name):
            return Example(f"{rng.randrange(100)}+1=", "1", _name)
        make_example.__qualname__ = f"{name}_examples"
        register_environment(name, Scripted, make_example, settings, answer_chars="0123456789",
                             max_answer_len=1)
    else:
        register_environment(name, Scripted, settings=settings)
    return get_environment(name)


@pytest.mark.parametrize("done", ["False", None, torch.tensor([True, False])],
                         ids=["str", "None", "tensor"])
def test_a_done_that_is_not_a_bool_is_named(done):
    """"False" is truthy (the episode would end); an array's truth value raises from torch."""
    env = _returning(f"done_{type(done).__name__}", ("x", 0.0, done))
    with pytest.raises(EnvironmentFailed, match=rf"environment 'done_{type(done).__name__}': "
                                                rf"step\(.*\) .*must return .*done bool\), got "
                                                rf"\('x', 0.0, {re.escape(repr(done))}"):
        sample_episodes(base(), [Example("1+1=", "1", "x")], env, 2, generator=gens(1))
    for ok in (True, 0, torch.tensor(False), __import__("numpy").bool_(True)):
        env = _returning("done_ok", ("x", 0.0, ok))
        ep = sample_episodes(base(), [Example("1+1=", "1", "x")], env, 2, generator=gens(1))
        assert set(ep.end) <= {"done" if ok else "turns", "tokens"}


def test_an_environment_failing_on_a_later_turn_names_the_turn(monkeypatch):
    def boom(action):
        raise KeyError("boom")
    env = _returning("fails_turn3", ("x", 0.0, False), ("y", 0.0, False), boom)
    with pytest.raises(EnvironmentFailed, match=r"environment 'fails_turn3': step\(\) on action "
                                                r".* at turn 3 raised KeyError: 'boom'"):
        sample_episodes(base(), [Example("1+1=", "1", "x")], env, 4, generator=gens(1))
    env = _returning("wrong_turn2", ("x", 0.0, False), ("y", "0.5", False))
    with pytest.raises(EnvironmentFailed, match=r"environment 'wrong_turn2': step\(.*\) at turn 2 "
                                                r"must return .*, got \('y', '0.5', False\)"):
        sample_episodes(base(), [Example("1+1=", "1", "x")], env, 4, generator=gens(1))
    monkeypatch.setattr(timelimit, "LIMIT_S", 0.3)
    env = _returning("hangs_turn2", ("x", 0.0, False), _hostile("hang").make().step)
    with pytest.raises(timelimit.UserCodeTimeout, match=r"environment 'hangs_turn2' step\(\) at "
                                                        r"turn 2 did not return"):
        sample_episodes(base(), [Example("1+1=", "1", "x")], env, 4, generator=gens(1))


def test_numpy_scalar_rewards_are_numbers_as_floats_are():
    """A reward computed with numpy (np.float32, np.int64) is taken, as a single-turn reward
    function's is; a tensor or numpy's bool is not a number there and is named."""
    np = __import__("numpy")
    env = _returning("numpy_reward", ("x", np.float32(0.5), True))
    ep = sample_episodes(base(), [Example("1+1=", "1", "x")], env, 2, generator=gens(1))
    assert [t.reward for row in ep.turns for t in row] == [0.5, 0.5]
    assert all(type(t.reward) is float for row in ep.turns for t in row)
    env = _returning("numpy_int_reward", ("x", np.int64(2), True))
    ep = sample_episodes(base(), [Example("1+1=", "1", "x")], env, 2, generator=gens(1))
    assert ep.scored.rewards.tolist() == [2.0, 2.0]
    for bad in (torch.tensor(0.5), np.bool_(True)):
        env = _returning("tensor_reward", ("x", bad, True))
        with pytest.raises(EnvironmentFailed, match=r"must return \(observation str, finite"):
            sample_episodes(base(), [Example("1+1=", "1", "x")], env, 2, generator=gens(1))


@pytest.mark.parametrize("rewards", [(1e300,), (2e38, 2e38)], ids=["one", "sum"])
def test_a_return_beyond_float32_is_named(rewards):
    """Each reward is a finite float, but the float32 return is inf: named, not handed on (the
    advantages' check would name a sample, not the environment)."""
    last = len(rewards) - 1
    env = _returning("huge_return", *[("x", r, t == last) for t, r in enumerate(rewards)])
    with pytest.raises(EnvironmentFailed, match=rf"environment 'huge_return': episode \d+'s turn "
                                                rf"rewards {re.escape(str(list(rewards)))} make a "
                                                rf"return of inf in float32"):
        sample_episodes(base(), [Example("1+1=", "1", "x")], env, 4, generator=gens(1))
    env = _returning("huge_return", *[("x", 1e30, t == last) for t in range(len(rewards))])
    ep = sample_episodes(base(), [Example("1+1=", "1", "x")], env, 4, generator=gens(1))
    assert torch.isfinite(ep.scored.rewards).all()            # large but finite: as before


def test_an_environment_constructor_or_metrics_that_fails_is_named():
    class Broken(_Hostile):
        def __init__(self):
            raise OSError("no such file: words.txt")

    class BadMetrics(_Hostile):
        def step(self, action):
            return "", 0.0, True

        def metrics(self):
            return 3
    for name, cls, message in (
            ("make_fails", Broken, r"make\(\) raised OSError: no such file: words.txt"),
            ("metrics_int", BadMetrics, r"metrics\(\) must return a dict .*, got 3")):
        settings = _returning(name, ("x", 0.0, True)).settings       # its task
        ENVIRONMENTS.pop(name)
        env = register_environment(name, cls, settings=settings)
        with pytest.raises(EnvironmentFailed, match=rf"environment '{name}': {message}"):
            sample_episodes(base(), [Example("1+1=", "1", "x")], env, 2, generator=gens(1))


def test_environment_that_hangs_stops_at_the_time_limit(monkeypatch):
    monkeypatch.setattr(timelimit, "LIMIT_S", 0.3)
    t = time.perf_counter()
    with pytest.raises(timelimit.UserCodeTimeout, match=r"environment 'hostile_hang' step\(\)"):
        sample_episodes(base(), [Example("1+1=", "1", "x")], _hostile("hang"), 2)
    assert time.perf_counter() - t < 5


def test_huge_observation_is_cut_and_unreadable_characters_dropped():
    env = _hostile("huge")
    ep = sample_episodes(base(), [Example("1+1=", "1", "x")], env, 2, generator=gens(1))
    stepped = sum(len(t) for t in ep.turns)
    cut_rows = [i for i, t in enumerate(ep.turns) if len(t) and ep.end[i] != "tokens" or len(t) > 1]
    assert ep.obs_cut >= 1 and ep.dropped_chars == ep.obs_cut    # one "é" per observation seen
    r = ep.scored.rollout
    obs = r.completion_mask & ~r.loss_mask                                 # (N, Tc)
    # no observation is longer than max_observation_tokens (8) in a row
    for i in range(2):
        run = 0
        for c in obs[i].tolist():
            run = run + 1 if c else 0
            assert run <= env.settings.max_observation_tokens
    assert stepped >= 1 and cut_rows


def test_training_stops_cleanly_on_a_raising_environment(tmp_path):
    from grpo_lab.training.trainer import train
    _hostile("raise")
    cfg = TrainConfig(objective="agent", task="hostile_raise", steps=2, prompts_per_step=2,
                      group_size=2, eval_size=0, out_dir=str(tmp_path / "run"), kl={"beta": 0.0})
    with pytest.raises(EnvironmentFailed, match="hostile_raise") as info:
        train(cfg, progress=False)
    assert "at step 0" in str(info.value.__notes__)


# ---- the objective's settings

def test_objectives_refuse_what_they_cannot_train():
    with pytest.raises(ValueError, match="task 'guess' is an environment .* objective='agent'"):
        check_records(TrainConfig(task="guess"))
    with pytest.raises(ValueError, match="objective='agent' trains on an environment: "
                                         "task='addition'"):
        check_records(TrainConfig(objective="agent", task="addition"))
    with pytest.raises(ValueError, match="loss.aggregation='dr_grpo'"):
        check_records(TrainConfig(objective="agent", task="guess", loss={"aggregation": "dr_grpo"}))
    with pytest.raises(ValueError, match="dynamic.sampling"):
        check_records(TrainConfig(objective="agent", task="guess", dynamic={"sampling": True}))
    with pytest.raises(ValueError, match="rollout='vllm'"):
        check_records(TrainConfig(objective="agent", task="guess", rollout="vllm", policy="hf",
                    base_checkpoint="data/hf_tiny", tis={"cap": 2.0}))


@pytest.mark.parametrize("objective", ["ppo", "supervised", "pretrain"])
def test_single_turn_objectives_refuse_an_environment_naming_it(objective):
    with pytest.raises(ValueError, match=f"task 'guess' is an environment .* train it with "
                                         f"objective='agent', not objective='{objective}'"):
        check_records(TrainConfig(objective=objective, task="guess"))


def test_vllm_rollout_with_the_agent_objective_names_both_values(capsys):
    # the objective is named first, whatever the policy: a toy policy is not told to turn hf
    for extra in ({}, {"policy": "hf", "base_checkpoint": "data/hf_tiny", "tis": {"cap": 2.0}}):
        with pytest.raises(ValueError, match="rollout='vllm' .* objective='agent' does not"):
            check_records(TrainConfig(objective="agent", task="guess", rollout="vllm", **extra))
    from grpo_lab.cli import main
    assert main(["train", "--objective", "agent", "--task", "guess", "--rollout", "vllm",
                 "--dynamic.sampling", "false"]) == 2
    assert "rollout='vllm'" in capsys.readouterr().err
    assert main(["train", "--objective", "ppo", "--task", "guess"]) == 2
    assert "objective='ppo'" in capsys.readouterr().err


def test_held_out_ranges_are_never_drawn_for_training():
    held = {e.prompt for e in TASKS["guess"].eval_fn()}
    assert len(held) == 9 and "g:3-10=" in held
    from grpo_lab.training.trainer import prompt_source
    cfg = TrainConfig(objective="agent", task="guess", eval_size=0)
    drawn = prompt_source(cfg, held)(random.Random(0), 500)
    assert not held & {e.prompt for e in drawn}


def test_train_from_the_command_line_raises_the_reward(tmp_path, capsys):
    """``grpo-lab train`` with an environment from a plugin: the reward of the second turn
    (after a masked observation) rises from the base's few percent."""
    import json
    from pathlib import Path

    from grpo_lab.cli import main
    plugin = str(Path(__file__).resolve().parent / "plugins" / "second_turn_env.py")
    out = tmp_path / "run"
    code = main(["train", "--plugin", plugin, "--objective", "agent", "--task", "second_turn",
                 "--dynamic.sampling", "false", "--steps", "30", "--prompts_per_step", "8",
                 "--group_size", "8", "--lr", "1e-3", "--kl.beta", "0", "--warmup_steps", "0",
                 "--lr_schedule", "constant", "--eval_size", "0", "--threads", "1",
                 "--out_dir", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    reward = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert len(reward) == 30
    first, last = sum(reward[:5]) / 5, sum(reward[-5:]) / 5
    assert first < 0.3 and last > first + 0.4, reward                 # measured: 0.07 -> 0.95
    assert all(r["episode/turns_mean"] <= 2 for r in rows if "episode/turns_mean" in r)


# ---- truncation, the warm-up, variants of an environment

class _NeverDone:
    def reset(self, example, seed):
        return ""

    def step(self, action):
        return "", 0.0, False

    def state_key(self):
        return 0


def _never_done(name, **settings):
    if name not in ENVIRONMENTS:
        def make_example(rng, _name=name):
            return Example(f"{rng.randrange(10)}+1=", "1", _name)
        make_example.__qualname__ = f"{name}_examples"
        register_environment(name, _NeverDone, make_example, AgentSettings(**settings),
                             answer_chars="0123456789", max_answer_len=1)
    return get_environment(name)


def test_truncation_by_turns_and_by_tokens_is_recorded():
    m = base()
    exs = [Example("1+1=", "1", "x"), Example("3+4=", "1", "x")]
    ep = sample_episodes(m, exs, _never_done("never_done", max_turns=2), 2, greedy=True)
    assert ep.end == ["turns"] * 4 and [len(t) for t in ep.turns] == [2] * 4
    assert not bool(ep.scored.rollout.stopped.any())
    text = ep.scored.texts[0]                              # two actions, no observation
    assert text.startswith("2|") and text.count("|") == 2 and "[" not in text
    ep = sample_episodes(m, exs, _never_done("never_done_1", max_action_tokens=1), 2,
                         greedy=True)
    assert ep.end == ["tokens"] * 4 and ep.turns == [[]] * 4    # a digit, no <eos> in 1 token
    assert ep.scored.rollout.policy_mask.sum(1).tolist() == [1] * 4
    # the block size: a prompt that leaves no room for an action's <eos>
    m.cfg.block_size, old = 6, m.cfg.block_size
    try:
        ep = sample_episodes(m, [Example("12+34=", "1", "x")], _never_done("never_done"), 1,
                             greedy=True)
    finally:
        m.cfg.block_size = old
    assert ep.end == ["tokens"] and ep.scored.rollout.completion_mask.sum() == 0


def test_random_player_expected_guesses_by_hand():
    from grpo_lab.agents.warmup import random_guesses
    # n = 2: the first guess is right half the time, else the second: 1.5
    assert random_guesses(1) == 1 and random_guesses(2) == 1.5
    # E(3) = 1 + ((0 + 2 E(2)) + (1 E(1) + 1 E(1)) + (2 E(2) + 0)) / 9 = 1 + (3 + 2 + 3) / 9
    assert random_guesses(3) == pytest.approx(1 + 8 / 9)


def test_warm_up_trains_on_the_players_tokens_only():
    from grpo_lab.agents.warmup import demo_batch, warm_up
    m = base()
    env = get_environment("guess")
    r = demo_batch(m, env, examples("guess", 4), random.Random(0))
    own, real = r.loss_mask, r.completion_mask
    assert bool((own <= real).all()) and bool((real & ~own).any())   # feedback in the sequence
    assert bool((r.completion_ids[own & (r.completion_ids == EOS)] == EOS).any())
    obs = r.completion_ids[real & ~own].tolist()
    assert set(obs) <= set(encode("<>?"))                         # only feedback is masked
    losses = warm_up(m, env, lambda rng, n: examples("guess", n, rng.randrange(10 ** 6)), 30,
                     batch=32, lr=2e-3)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3, losses


def test_an_environment_variant_under_another_name():
    from grpo_lab.agents.environments import with_settings
    v = with_settings("guess", "guess_gigpo_test", credit="gigpo", omega=0.5)
    assert v.settings.credit == "gigpo" and v.settings.max_turns == 5 and v.make is GuessNumber
    assert get_environment("guess").settings.credit == "episode"
    ex = TASKS["guess_gigpo_test"].make(random.Random(0))
    assert ex.task == "guess_gigpo_test" and ex.prompt.startswith("g:")
    assert {e.task for e in TASKS["guess_gigpo_test"].eval_fn()} == {"guess_gigpo_test"}


def test_a_variant_under_a_taken_name_is_refused():
    """A variant named like another environment replaced its class and kept the other's
    prompts; named like a single-turn task, it drew that task's prompts."""
    from grpo_lab.agents.environments import with_settings
    for taken in ("calculator", "addition"):
        before = ENVIRONMENTS.get(taken)
        with pytest.raises(ValueError, match=rf"task '{taken}' is already registered "
                                             rf"\(grpo_lab\..*\); pick another name"):
            with_settings("guess", taken, credit="gigpo")
        assert ENVIRONMENTS.get(taken) is before
    v = with_settings("guess", "guess_gigpo_test", credit="gigpo")       # re-run: replaced
    assert with_settings("guess", "guess_gigpo_test", omega=0.5).settings.omega == 0.5
    assert v.settings.credit == "gigpo"


def test_agent_step_is_the_same_on_2_processes(tmp_path):
    """The episode step on 2 processes computes what 1 does: each rank samples its slice of
    the prompts with their own generators and reset seeds, the returns are gathered before
    the group baseline, GiGPO's step groups stay inside a rank (a prompt's G episodes)."""
    import json

    from pathlib import Path

    from grpo_lab.policies.policy import load_policy_any
    from grpo_lab.registry import load_plugins
    from grpo_lab.training.trainer import spawn_train, train
    plugin = str(Path(__file__).resolve().parent / "plugins" / "gigpo_variant.py")
    load_plugins(plugin)                                   # every rank loads it too

    def cfg(out):
        return TrainConfig(objective="agent", task="add_retry_gigpo", prompts_per_step=5,
                           group_size=4, steps=3, lr=3e-4, warmup_steps=0, adam_eps=1e-6,
                           kl={"beta": 0.0}, loss={"aggregation": "token_mean"}, eval_size=0, ckpt_every=3,
                           time_budget_s=0.0, threads=1, out_dir=str(out),
                           plugins=plugin)
    one = train(cfg(tmp_path / "one"), progress=False)
    spawn_train([cfg(tmp_path / "two")], 2, run_timeout_s=300)
    a = load_policy_any(tmp_path / "one" / "checkpoint.safetensors").state_dict()
    b = load_policy_any(tmp_path / "two" / "checkpoint.safetensors").state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0, msg=k)
    two = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    for x, y in zip(one[1:], two[1:]):
        for k in ("reward/mean", "adv/var", "completion/mean_len"):
            assert x[k] == pytest.approx(y[k], abs=1e-9), k


# ---- the warm-up from the command line; resume of an agent run

def test_warmup_from_the_command_line_equals_the_library_call(tmp_path, capsys):
    """``grpo-lab warmup`` writes exactly the policy ``warm_up`` gives with the same seed,
    held-out prompts excluded; bad values are one-line errors naming them."""
    import json

    from grpo_lab.agents.warmup import warm_up
    from grpo_lab.cli import main
    from grpo_lab.policies.model import load_policy
    from grpo_lab.tasks import sample_examples
    out = tmp_path / "warm.safetensors"
    assert main(["warmup", "--task", "guess4", "--steps", "3", "--batch", "8", "--seed", "5",
                 "--out", str(out), "--threads", "1"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["steps"] == 3 and said["held_out"] == 36 and set(said["after"]) == {
        "success", "turns"}
    m = base()
    held = {e.prompt for e in TASKS["guess4"].eval_fn()}
    losses = warm_up(m, get_environment("guess4"),
                     lambda rng, n: sample_examples([get_task("guess4")], n, rng, held), 3, batch=8,
                     seed=5)
    assert said["loss_first"] == round(losses[0], 4) and said["loss_last"] == round(losses[-1], 4)
    written, mine = load_policy(out).state_dict(), m.state_dict()
    assert all(torch.equal(written[k], mine[k]) for k in mine)
    assert not torch.equal(mine["wte.weight"], base().state_dict()["wte.weight"])
    for argv, named in ((["--task", "guess", "--steps", "0"], "steps must be an int >= 1, got 0"),
                        (["--task", "guess", "--lr", "-1"], "lr must be a positive number, got -1"),
                        (["--task", "add_retry"], "'add_retry' has no demo player"),
                        (["--task", "addition"], "unknown environment 'addition'")):
        assert main(["warmup", "--out", str(tmp_path / "x.safetensors"), *argv]) == 2
        assert named in capsys.readouterr().err
    assert not (tmp_path / "x.safetensors").exists()


@pytest.mark.parametrize("credit", ["episode", "gigpo"])
def test_agent_resume_continues_exactly(tmp_path, credit):
    """An agent run killed during step 4 and resumed from its step-2 checkpoint logs the same
    steps and ends with the same weights as one never stopped (as test_trainer's)."""
    from grpo_lab.agents.environments import with_settings
    from grpo_lab.policies.policy import load_policy_any
    from grpo_lab.training.config import preset
    from grpo_lab.training.trainer import train
    task = "add_retry" if credit == "episode" else "add_retry_gigpo"
    if task not in ENVIRONMENTS:
        with_settings("add_retry", task, credit=credit)

    def cfg(d):
        return preset("agent_cpu", task=task, base_checkpoint="data/base_policy.safetensors",
                      steps=6, ckpt_every=3, prompts_per_step=4, group_size=4, eval_every=3,
                      eval_size=8, threads=1, out_dir=str(tmp_path / d))

    full = train(cfg("a"), progress=False)

    def die(m, policy):                  # killed during step 4: the checkpoint holds steps 0-2
        if m["step"] == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg("b"), progress=False, on_step=die)
    resumed = train(cfg("b"), resume=True, progress=False)
    keys = ["loss/total", "reward/mean", "grad/norm", "episode/turns_mean", "adv/abs_mean"]
    rows = lambda h: [[r["step"]] + [r[k] for k in keys] for r in h if "loss/total" in r]  # noqa: E731
    assert rows(full) == rows(resumed) and len(rows(full)) == 6
    assert any(r[3] > 0 for r in rows(full))                   # the steps moved the policy
    evals = lambda h: [(r["step"], r["eval/accuracy"]) for r in h if "eval/accuracy" in r]  # noqa: E731
    assert evals(full) == evals(resumed)
    pa = load_policy_any(tmp_path / "a" / "checkpoint.safetensors").state_dict()
    pb = load_policy_any(tmp_path / "b" / "checkpoint.safetensors").state_dict()
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
