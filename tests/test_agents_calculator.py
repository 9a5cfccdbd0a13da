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
                              base_checkpoint="data/hf_tiny", dynamic_sampling=False))
    with pytest.raises(ValueError, match="answer_format='number'"):
        check_records(TrainConfig(objective="agent", task="calculator", policy="hf",
                                  base_checkpoint="data/hf_tiny", dynamic_sampling=False,
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
