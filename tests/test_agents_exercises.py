"""The agents exercise's checks (lesson 13): a right environment and a right masked loss pass;
each usual mistake fails with its own hint (training on the environment's tokens first); a stub
fails with 'not written yet'."""
import pytest
import torch

from grpo_lab.teaching import exercises as ex
from grpo_lab.teaching.exercise_agents import HotCold


def verdict(check, fn, capsys):
    ok = check(fn)
    return ok, capsys.readouterr().out


def per_token(logp, old, A):
    r = torch.exp(logp - old)
    return -torch.min(r * A[:, None], r.clamp(0.8, 1.2) * A[:, None])


def loss(logp, old, A, comp, own):
    return ((per_token(logp, old, A) * own).sum(1) / own.sum(1)).mean()


LOSS_WRONG = [
    (lambda l, o, A, c, m: loss(l, o, A, c, c), "you train on the environment's tokens"),
    (lambda l, o, A, c, m: ((per_token(l, o, A) * m).sum(1) / c.sum(1)).mean(),
     "length normaliser counts"),
    (lambda l, o, A, c, m: (per_token(l, o, A) * m).sum() / m.sum(), "seq-mean-token-mean"),
    (lambda l, o, A, c, m: ((-torch.exp(l - o) * A[:, None] * m).sum(1) / m.sum(1)).mean(),
     "clip the ratio"),
]


class HistoryKey(HotCold):
    def reset(self, example, seed):
        self.seen = ()
        return super().reset(example, seed)

    def step(self, action):
        self.seen += (action,)
        return super().step(action)

    def state_key(self):
        return self.seen


class Crashes(HotCold):
    def step(self, action):
        int(action)
        return super().step(action)


class Swapped(HotCold):
    def step(self, action):
        obs, r, d = super().step(action)
        return {"h": "c", "c": "h"}.get(obs, obs), r, d


class NoCost(HotCold):
    def step(self, action):
        obs, r, d = super().step(action)
        return obs, (1.0 if d else r), d


class ListKey(HotCold):
    def state_key(self):
        return sorted(self.possible)


def test_right_answers_pass(capsys):
    assert verdict(ex.check_agent_loss, loss, capsys)[0]
    assert verdict(ex.check_environment, HotCold, capsys)[0]


@pytest.mark.parametrize("fn, hint", LOSS_WRONG)
def test_each_loss_mistake_fails_with_its_hint(fn, hint, capsys):
    ok, out = verdict(ex.check_agent_loss, fn, capsys)
    assert not ok and hint in out, out


@pytest.mark.parametrize("cls, hint", [(HistoryKey, "not the history"),
                                       (Crashes, "never an exception"),
                                       (Swapped, "hot means |guess - secret| <= 1"),
                                       (NoCost, "1 - 0.1 per wrong guess"),
                                       (ListKey, "not a list or a set")])
def test_each_environment_mistake_fails_with_its_hint(cls, hint, capsys):
    ok, out = verdict(ex.check_environment, cls, capsys)
    assert not ok and hint in out, out


def test_hot_cold_by_hand():
    from grpo_lab.tasks import Example
    env = HotCold()
    assert env.reset(Example("h:", "4", "hot_cold"), 0) == ""
    assert env.step("8") == ("c", 0.0, False) and env.state_key() == (0, 1, 2, 3, 4, 5, 6)
    assert env.step("3") == ("h", 0.0, False) and env.state_key() == (2, 4)
    assert env.step("x") == ("?", 0.0, False)
    assert env.step("4") == ("", pytest.approx(0.7), True)


def test_stubs_and_non_functions(capsys):
    def stub(*a):
        raise NotImplementedError()

    class Stub:
        def reset(self, example, seed):
            raise NotImplementedError()

        def step(self, action):
            raise NotImplementedError()

        def state_key(self):
            raise NotImplementedError()
    for check, f in ((ex.check_agent_loss, stub), (ex.check_environment, Stub)):
        ok, out = verdict(check, f, capsys)
        assert not ok and "hint: not written yet" in out, out
        with pytest.raises(TypeError, match="got int 42"):
            check(42)
