"""The calculator environment (agents/calculator.py): parsing, errors as observations, the
reward read from the whole episode; the agent objective on an HF policy (data/hf_tiny)."""
from __future__ import annotations

import random

import pytest
import torch

from grpo_lab.agents import step as agent_step  # noqa: F401 (the environments, "agent")
from grpo_lab.agents.calculator import Calculator, calculate, held_out
from grpo_lab.agents.environments import get_environment, tool_metrics
from grpo_lab.agents.episodes import sample_episodes
from grpo_lab.tasks import get_task
from grpo_lab.training.config import TrainConfig, check_records


@pytest.mark.parametrize("action,result", [
    ("964 * 59 =", "56876"), ("To find it: 964 x 59 =", "56876"), ("**964 × 59 =", "56876"),
    ("\\[ 964 \\times 59 =", "56876"), ("964 times 59 =", "56876"), ("Step 1. 964 * 59 =", "56876"),
    ("(12 + 3) / 5 =", "3"), ("1,234 * 2 =", "2468"), ("2/3 =", "0.666667")])
def test_calculate_reads_what_the_model_writes(action, result):
    assert calculate(action) == result


@pytest.mark.parametrize("action", ["x =", "=", "56876 =", "1/0 =", "((((((1 =",
                                    "9" * 200 + " * 2 =", "2 ** 99999 =", "964 by 59 ="])
def test_malformed_calls_are_error_observations_without_digits(action):
    out = calculate(action)
    assert out.startswith("error: ") and not any(c.isdigit() for c in out)


def test_episode_reward_reads_the_tools_result():
    ex = held_out("calculator")[0]                       # What is 190 times 20? -> 3800
    env = Calculator()
    env.reset(ex, 0)
    assert env.step("190 * 20 =") == (" 3800", 0.0, False)
    assert env.step("x =") == (" error: no expression before the equals sign", 0.0, False)
    assert env.step("So the answer is 3800.") == ("", 1.0, True)
    assert env.metrics() == {"calls": 2, "well_formed": 1}
    assert tool_metrics([env.metrics(), {"calls": 0, "well_formed": 0}]) == {
        "call_rate": 0.5, "calls_per_episode": 1.0, "well_formed": 0.5}


def test_held_out_is_fixed_and_distinct():
    a, b = held_out("calculator"), held_out("calculator")
    assert a == b and len({e.prompt for e in a}) == 100
    assert all(int(e.answer) == e.fields["a"] * e.fields["b"] for e in a)


def test_agent_objective_takes_hf_and_refuses_an_answer_format():
    check_records(TrainConfig(objective="agent", task="calculator", policy="hf",
                              base_checkpoint="data/hf_tiny", dynamic={"sampling": False}))
    with pytest.raises(ValueError, match="answer_format='number'"):
        check_records(TrainConfig(objective="agent", task="calculator", policy="hf",
                                  base_checkpoint="data/hf_tiny", dynamic={"sampling": False},
                                  answer_format="number"))


def test_hf_episodes_kv_reuse_equals_recompute():
    from grpo_lab.policies.hf import load_hf_policy
    torch.set_num_threads(1)
    m = load_hf_policy("data/hf_tiny")
    env = get_environment("add_retry")
    rng = random.Random(2)
    exs = [get_task("add_retry").make(rng) for _ in range(3)]
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(3)]   # noqa: E731
    a = sample_episodes(m, exs, env, 4, generator=gens(), temperature=1.0)
    b = sample_episodes(m, exs, env, 4, generator=gens(), temperature=1.0, use_cache=False)
    ra, rb = a.scored.rollout, b.scored.rollout
    assert torch.equal(ra.completion_ids, rb.completion_ids) and a.end == b.end
    assert bool(((~ra.loss_mask) & ra.completion_mask).any())   # observations in the sequence
    assert torch.allclose(ra.logprobs, rb.logprobs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("mask", ["loss_mask", "completion_mask"])
def test_hf_environment_tokens_get_exactly_zero_gradient(mask):
    """The toy's zero-gradient test (tests/test_agents.py) on the HF path: sampled episodes of
    data/hf_tiny, the agent loss's gradient with respect to the logits. With the loss mask the
    rows that predict the environment's tokens get exactly 0 and every policy token some; on
    the completion mask instead (the classic bug) the environment's tokens get gradient too."""
    from dataclasses import replace

    from grpo_lab.algorithm.rollout import Scored, completion_logprobs
    from grpo_lab.policies.hf import load_hf_policy
    from grpo_lab.training.step import Batch, grpo_objective
    torch.set_num_threads(1)
    m = load_hf_policy("data/hf_tiny")
    rng = random.Random(2)
    exs = [get_task("add_retry").make(rng) for _ in range(3)]
    ep = sample_episodes(m, exs, get_environment("add_retry"), 4, temperature=1.0,
                         generator=[torch.Generator().manual_seed(i) for i in range(3)])
    r = ep.scored.rollout
    own, real = r.loss_mask, r.completion_mask                            # (12, Tc) x2
    env_tokens = real & ~own
    assert bool(env_tokens.any())                                         # observations in it
    m.train()
    lp = completion_logprobs(m, r).detach()                               # (12, Tc) ratio 1
    r = replace(r, logprobs=lp.masked_fill(~real, 0.0),
                loss_mask=own if mask == "loss_mask" else None)
    s = Scored(ep.scored.examples, r, ep.scored.rewards, ep.scored.parts, ep.scored.texts)
    cfg = TrainConfig(objective="agent", task="add_retry", policy="hf",
                      base_checkpoint="data/hf_tiny", dynamic={"sampling": False},
                      kl={"beta": 0.0}, speed={"update_forward": "completion"}, eval_size=0,
                      temperature=1.0)
    A = torch.tensor([1.0, -1.0] * 6)                                     # (12,) none zero
    batch = Batch(s, A, {}, 12, int(r.policy_mask.sum()), torch.arange(3), {})
    kept = {}

    def keep(mod, inputs, out):                            # returns None: the output stays
        kept.setdefault("logits", out[0])
    hook = m.register_forward_hook(keep)
    loss, _ = grpo_objective(m, batch, cfg)
    hook.remove()
    logits = kept["logits"]                                # (12, Tc + 1, V): one forward
    assert logits.shape[:2] == (12, own.shape[1] + 1)      # logits_to_keep = Tc + 1
    grad, = torch.autograd.grad(loss, logits)
    g = grad[:, :-1]                                       # (12, Tc, V): predicts column j
    size = g.abs().sum(-1)                                 # (12, Tc)
    assert bool((size[own] > 0).all())                     # every policy token: some gradient
    assert bool((size[~real] == 0).all())                  # padding: none either way
    if mask == "loss_mask":
        assert bool((g[env_tokens] == 0).all())            # the environment's: exactly 0
    else:
        assert bool((size[env_tokens] > 0).all())          # the bug: trained on them too
