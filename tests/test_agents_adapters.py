"""agents/adapters.py: OpenEnv environments and TextArena games as grpo_lab environment records.
The OpenEnv tests need ``openenv-core``, the TextArena ones ``textarena`` as well (the extra
``grpo_lab[openenv]``); each skips, naming the package, where it is not installed. What needs
neither (registering without the packages, the error when one is missing) runs everywhere."""
import random
import sys

import pytest
import torch

from grpo_lab.agents import step as agent_step  # noqa: F401 (registers the objective)
from grpo_lab.agents.adapters import (OpenEnvAdapter, register_openenv, register_textarena_guess,
                                      textarena_environment)
from grpo_lab.agents.environments import EnvironmentFailed, env_key, env_reset, env_step
from grpo_lab.tasks import TASKS, Example

OPENENV = "openenv-core is not installed (pip install -e '.[openenv]')"
TEXTARENA = "textarena is not installed (pip install -e '.[openenv]')"


def needs_openenv():
    return pytest.importorskip("openenv.core.env_server.interfaces", reason=OPENENV)


def needs_textarena():
    needs_openenv()
    return pytest.importorskip("textarena", reason=TEXTARENA)


EX = Example("c:3=", "3", "oe_count")


def test_registering_needs_neither_package_and_making_an_episode_names_the_extra(monkeypatch):
    env = register_textarena_guess()
    assert TASKS["ta_guess"].eval_fn()[0].prompt == "g:3-10="
    assert len(TASKS["ta_guess"].eval_fn()) == 72
    from grpo_lab.agents import adapters
    monkeypatch.setattr(adapters, "_textarena_classes", adapters._textarena_classes.__wrapped__)
    monkeypatch.setitem(sys.modules, "textarena", None)          # as if not installed
    monkeypatch.setitem(sys.modules, "openenv", None)
    monkeypatch.setitem(sys.modules, "openenv.core", None)
    monkeypatch.setitem(sys.modules, "openenv.core.env_server", None)
    monkeypatch.setitem(sys.modules, "openenv.core.env_server.interfaces", None)
    with pytest.raises(ImportError, match=r"openenv-core is not installed: pip install openenv-core "
                                          r"\(in a checkout: pip install -e \"\.\[openenv\]\"\)"):
        env.make()


def counter_env():
    """An OpenEnv environment written as OpenEnv's template writes one: count up to the
    target the reset's kwargs give; reward 1 when the message is the target."""
    interfaces = needs_openenv()
    from openenv.core.env_server.types import Action, Observation, State

    class CountAction(Action):
        message: str

    class CountObservation(Observation):
        said: str = ""

    class CountEnv(interfaces.Environment):
        def __init__(self):
            super().__init__()
            self._state = State(step_count=0)

        def reset(self, seed=None, episode_id=None, target=3, **kw) -> CountObservation:
            self.target, self.n = target, 0
            self._state = State(step_count=0)
            return CountObservation(said="go", done=False, reward=None)

        def step(self, action: CountAction, timeout_s=None, **kw) -> CountObservation:
            self._state.step_count += 1
            self.n += 1
            hit = action.message == str(self.target)
            return CountObservation(said=str(self.n), done=hit, reward=1.0 if hit else None)

        @property
        def state(self):
            return self._state

    return CountEnv, CountAction, CountObservation


def test_an_openenv_environment_through_the_adapter_with_its_defaults():
    CountEnv, _, _ = counter_env()
    inst = OpenEnvAdapter(CountEnv())
    ex = Example("c:3=", "3", "oe_count", fields={"reset_kwargs": {"target": 2}})
    assert inst.reset(ex, seed=0) == "go" and inst.state_key() == ("go",)
    assert inst.step("1") == ("1", 0.0, False)               # reward None -> 0
    assert inst.state_key() == ("go", "1", "1")                # the transcript so far
    assert inst.step("2") == ("2", 1.0, True)


def test_the_adapter_asks_for_action_of_and_text_of_where_it_cannot_tell():
    interfaces = needs_openenv()
    from openenv.core.env_server.types import Action, Observation, State

    class TwoFields(Action):
        a: str
        b: str

    class TwoTexts(Observation):
        x: str = ""
        y: str = ""

    class Env(interfaces.Environment):
        def reset(self, seed=None, episode_id=None, **kw) -> TwoTexts:
            return TwoTexts()

        def step(self, action: TwoFields, timeout_s=None, **kw) -> TwoTexts:
            return TwoTexts()

        @property
        def state(self):
            return State()

    with pytest.raises(ValueError, match=r"TwoFields has 2 required str fields \(\['a', 'b'\]\)"
                                         r": pass action_of"):
        OpenEnvAdapter(Env())
    inst = OpenEnvAdapter(Env(), action_of=lambda t: TwoFields(a=t, b=t))
    with pytest.raises(ValueError, match=r"TwoTexts has 2 str fields \(\['x', 'y'\]\): pass "
                                         r"text_of"):
        inst.reset(EX, 0)


def test_a_registered_openenv_environment_whose_step_raises_is_named():
    CountEnv, CountAction, _ = counter_env()

    class Broken(CountEnv):
        def step(self, action: CountAction, timeout_s=None, **kw):
            raise KeyError("oops")

    env = register_openenv("oe_broken", Broken, lambda rng: Example("c:3=", "3", "oe_broken"),
                           answer_chars="0123456789", max_answer_len=1)
    inst = env.make()
    assert env_reset(env, inst, EX, 0) == "go"
    with pytest.raises(EnvironmentFailed, match=r"environment 'oe_broken': step\(\) on action "
                                                r"'1' raised KeyError: 'oops'"):
        env_step(env, inst, "1")


def test_textarena_guess_the_number_through_the_adapter():
    needs_textarena()
    env = register_textarena_guess()
    held = TASKS["ta_guess"].eval_fn()
    ex = held[3]                                   # g:3-10=, reset seed 3 pinned
    a, b = env.make(), env.make()
    state = random.getstate()
    assert env_reset(env, a, ex, seed=99) == ""    # the instructions are not the toy's to read
    assert random.getstate() == state              # the caller's global random left alone
    env_reset(env, b, ex, seed=12345)              # the example's seed wins over the run's
    secret = a.env.game.game_number
    assert secret == b.env.game.game_number and 3 <= secret <= 10
    assert env_key(env, a) == (3, 10)
    low = 3 if secret != 3 else 4                  # a wrong guess: the hint says which way
    obs, r, done = env_step(env, a, str(low))
    assert (obs, r, done) == ((">" if secret > low else "<"), 0.0, False)
    assert env_key(env, a) == ((low + 1, 10) if secret > low else (3, low - 1))
    assert env_step(env, a, "x") == ("?", 0.0, False)          # invalid: a warning first
    assert env_step(env, b, str(secret)) == ("", 1.0, True)    # the right number: 1, over
    # a second invalid move ends the game with TextArena's percentage completion:
    # 1 - |last guess - secret| / (10 - 3)
    obs, r, done = env_step(env, a, "y")
    assert done and obs == "" and r == pytest.approx(1 - abs(low - secret) / 7)


def test_textarena_games_reset_from_a_seed_whatever_the_global_random_does():
    needs_textarena()
    secrets = []
    for noise in (0, 1):
        random.seed(noise)
        g = textarena_environment("GuessTheNumber-v0", min_number=1, max_number=1000)
        secrets.append([g.reset(seed=s) and g.game.game_number for s in (5, 6, 7)])
    assert secrets[0] == secrets[1] and len(set(secrets[0])) == 3


def test_the_toy_trains_on_textarena_through_the_adapter(tmp_path):
    """A short run of objective "agent" on ta_guess: episodes go through TextArena, the
    observations' tokens are masked, the loss and the metrics are finite."""
    needs_textarena()
    from grpo_lab.agents.episodes import sample_episodes
    from grpo_lab.policies.model import load_policy
    from grpo_lab.training.config import preset
    from grpo_lab.training.trainer import train
    register_textarena_guess()
    torch.manual_seed(0)
    policy = load_policy("data/base_policy.safetensors")
    ex = TASKS["ta_guess"].eval_fn()[:2]
    from grpo_lab.agents.environments import get_environment
    ep = sample_episodes(policy, ex, get_environment("ta_guess"), 3,
                         generator=[torch.Generator().manual_seed(i) for i in range(2)])
    r = ep.scored.rollout
    assert bool((r.completion_mask & ~r.loss_mask).any())      # hints were fed, masked
    for row, turns in zip(range(len(ep.turns)), ep.turns):   # policy tokens = the actions'
        assert int(r.loss_mask[row].sum()) == sum(t.end - t.start for t in turns)
    cfg = preset("agent_cpu", task="ta_guess", base_checkpoint="data/base_policy.safetensors",
                 steps=2, prompts_per_step=2, group_size=4, eval_every=2, eval_size=8,
                 out_dir=str(tmp_path / "run"), time_budget_s=0.0, threads=1, ckpt_every=10 ** 6)
    h = train(cfg, progress=False)
    rows = [x for x in h if "reward/mean" in x]
    assert len(rows) == 2 and all(x["loss/total"] == x["loss/total"] for x in rows)
    assert any("eval/accuracy" in x for x in h)
