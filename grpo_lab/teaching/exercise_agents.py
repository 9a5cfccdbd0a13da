"""The agents exercise (lesson 13): write an environment, and the loss of a multi-turn episode.

``check_environment(cls)``: the learner's class plays the hot/cold game (``HotCold``, the
reference below): a secret digit, each action a guess; the observation is ``h`` (hot: the guess
is within 1 of the secret), ``c`` (cold) or ``?`` (not one digit: an observation, never an
exception); the right guess ends the episode with 1 - 0.1 per wrong guess before it. The state
key is the digits still possible: two episodes that learned the same thing by different guesses
stand in the same state (GiGPO's anchor states), so the check compares which states share a key,
not the keys' values.

``check_agent_loss(fn)``: ``fn(logp, old_logp, advantages, completion_mask, loss_mask) -> loss``,
the clipped GRPO surrogate (eps 0.2, no KL) averaged over each episode's **policy** tokens, then
over episodes (seq-mean-token-mean), against ``loss.grpo_loss`` with ``loss_mask``. The classic
bug, training on the environment's tokens (``completion_mask``), fails with its hint.
"""
from __future__ import annotations

from typing import Callable

import torch

from grpo_lab.algorithm.loss import grpo_loss
from grpo_lab.tasks import Example
from grpo_lab.teaching.exercise_harness import (NOT_WRITTEN, Failure, call, check_against, fmt,
                                                report, require_function)

TURN_COST = 0.1


class HotCold:
    """The reference hot/cold environment (module docstring)."""

    def reset(self, example: Example, seed: int) -> str:
        self.secret, self.wrong = int(example.answer), 0
        self.possible = set(range(10))
        return ""

    def step(self, action: str):
        if len(action) != 1 or not action.isdigit():
            self.wrong += 1
            return "?", 0.0, False
        g = int(action)
        if g == self.secret:
            return "", 1.0 - TURN_COST * self.wrong, True
        self.wrong += 1
        hot = abs(g - self.secret) <= 1
        self.possible = {d for d in self.possible if d != g and (abs(d - g) <= 1) == hot}
        return ("h" if hot else "c"), 0.0, False

    def state_key(self):
        return tuple(sorted(self.possible))


ENV_CASES = [  # (what it shows, secret, actions)
    ("a first guess right", 4, ["4"]),
    ("cold, then hot, then right", 4, ["8", "3", "4"]),
    ("hot, hot, right", 7, ["6", "8", "7"]),
    ("a malformed action, then right", 2, ["x", "2"]),
    ("two digits at once", 5, ["55", "5"]),
    ("cold 0 then cold 9", 4, ["0", "9"]),
    ("cold 9 then cold 0 (the same digits left)", 4, ["9", "0"]),
    ("cold 0 then cold 8", 4, ["0", "8"]),
    ("cold at distance 2", 4, ["6", "4"]),
    ("cold 1", 5, ["1", "5"]),
    ("cold 0 then cold 1 (the digits cold 1 alone leaves)", 5, ["0", "1", "5"]),
]


def _play(cls, secret: int, actions: list[str]):
    """-> (reset's observation, [(key before, (obs, reward, done))], final key) or the hint."""
    env, err = call(cls)
    if err:
        return None, err
    first, err = call(env.reset, Example("h:", str(secret), "hot_cold"), 0)
    if err:
        return None, err
    steps = []
    for a in actions:
        key, err = call(env.state_key)
        if err:
            return None, err
        out, err = call(env.step, a)
        if err:
            return None, err
        steps.append((key, out))
    key, err = call(env.state_key)
    return ((first, steps, key), None) if not err else (None, err)


def _step_hint(a: str, want, got) -> str:
    if not (isinstance(got, tuple) and len(got) == 3):
        return "step returns a tuple (observation str, reward float, done bool)"
    if got[0] != want[0]:
        if {got[0], want[0]} == {"h", "c"}:
            return "hot means |guess - secret| <= 1 ('h'); farther is cold ('c')"
        if want[0] == "?":
            return (f"{a!r} is not one digit: the observation '?' (an action the policy wrote "
                    f"wrong is feedback, never a crash), and it counts as a wrong guess")
        return "the observation is 'h', 'c', '?' or '' (the episode ended)"
    if got[2] != want[2]:
        return "the right guess ends the episode (done True); any other action does not"
    if abs(float(got[1]) - want[1]) > 1e-9:
        return ("the reward is 0 until the right guess, then 1 - 0.1 per wrong guess before "
                "it (malformed actions count as wrong)")
    return "compare your step with the docstring"


def check_environment(cls: Callable) -> bool:
    """Your hot/cold environment class (``reset(example, seed)``, ``step(action)``,
    ``state_key()``) against ``HotCold`` on scripted episodes."""
    require_function("check_environment", cls)
    failure, keys = None, []
    for case, secret, actions in ENV_CASES:
        want, _ = _play(HotCold, secret, actions)
        got, err = _play(cls, secret, actions)
        name = f"'{case}' (secret {secret}, actions {actions})"
        if err:
            if err != NOT_WRITTEN and ("x" in actions or "55" in actions):
                err = (f"{err}; a malformed action is an observation '?', never an exception: "
                       f"check the action is one digit before int(...)")
            failure = Failure(name, "no error", "an error", err)
            break
        if got[0] != want[0]:
            failure = Failure(name + ": reset", repr(want[0]), repr(got[0]),
                              "reset returns the first observation: '' (nothing to say yet)")
            break
        bad = next((n for n, (w, g) in enumerate(zip(want[1], got[1])) if w[1] != g[1]), None)
        if bad is not None:
            w, g = want[1][bad][1], got[1][bad][1]
            failure = Failure(f"{name}: step({actions[bad]!r})", repr(w), repr(g),
                              _step_hint(actions[bad], w, g))
            break
        for n in range(len(actions) + 1):
            wk = want[1][n][0] if n < len(actions) else want[2]
            gk = got[1][n][0] if n < len(actions) else got[2]
            keys.append((f"{name} after {actions[:n]}", wk, gk))
    if failure is None:
        try:
            for a, wa, ga in keys:
                hash(ga)
                for b, wb, gb in keys:
                    if (wa == wb) != (ga == gb):
                        same = "the same" if wa == wb else "different"
                        failure = Failure(f"state_key: {a} and {b}", f"{same} keys",
                                          f"{ga!r} and {gb!r}",
                                          "the key is what the feedback has taught, not the "
                                          "history: the digits still possible, e.g. "
                                          "tuple(sorted(possible)); two episodes that learned "
                                          "the same thing by other guesses share a key"
                                          if wa == wb else
                                          "states that leave different digits possible need "
                                          "different keys")
                        break
                if failure is not None:
                    break
        except TypeError:
            failure = Failure("state_key", "a hashable key", "an unhashable one",
                              "return a tuple or a frozenset, not a list or a set")
    return report("check_environment", failure, len(ENV_CASES), "grpo_lab's HotCold")


# ---------------------------------------------------------------- the masked loss
def _agent_variant(kind: str, logp, old_logp, A, completion_mask, loss_mask):
    """The right loss, or one usual mistake (``kind``), written out."""
    ratio, A = torch.exp(logp - old_logp), A[:, None]                     # (N, T), (N, 1)
    per_tok = -torch.min(ratio * A, ratio.clamp(0.8, 1.2) * A)            # (N, T)
    if kind == "no_clip":
        per_tok = -ratio * A
    m = completion_mask if kind == "completion_mask" else loss_mask       # (N, T)
    n = completion_mask if kind == "normaliser" else m
    if kind == "token_mean":
        return (per_tok * m).sum() / m.sum()
    return ((per_tok * m).sum(1) / n.sum(1).clamp(min=1)).mean()


AGENT_LOSS_MISTAKES = [
    ("completion_mask", "you train on the environment's tokens: completion_mask is 1 on the "
     "observations too (the model reads them, it did not write them). Mask the loss, and count "
     "the tokens, with loss_mask: the policy's own tokens"),
    ("normaliser", "the length normaliser counts the environment's tokens: divide each "
     "episode's sum by its policy tokens, loss_mask.sum(1), not completion_mask.sum(1)"),
    ("token_mean", "seq-mean-token-mean: average each episode over its own policy tokens, then "
     "average the episodes (you divided by all the batch's tokens at once)"),
    ("no_clip", "clip the ratio to [0.8, 1.2] and take the min of ratio * A and "
     "clip(ratio) * A"),
]


def _loss_cases():
    t = lambda x: torch.tensor(x, dtype=torch.float64)                    # noqa: E731
    # one episode: action (2 tokens), observation (1), action (2); padding after
    cases = [("'on-policy, one episode of 2 turns'",
              (t([[-0.5, -1.0, -3.0, -0.2, -0.7, 0.0]]), t([[-0.5, -1.0, -3.0, -0.2, -0.7, 5.0]]),
               t([1.0]), t([[1, 1, 1, 1, 1, 0]]), t([[1, 1, 0, 1, 1, 0]]))),
             ("'the observation's ratio is 3 (it must not count)'",
              (t([[-0.5, -1.0, -3.0 + 1.0986, -0.2]]), t([[-0.5, -1.0, -3.0, -0.2]]),
               t([-1.0]), t([[1, 1, 1, 1]]), t([[1, 1, 0, 1]])))]
    gen = torch.Generator().manual_seed(0)
    for i in range(3):
        N, T = 2 + i, 6 + i
        old = -torch.rand(N, T, generator=gen, dtype=torch.float64) * 3
        logp = old + torch.randn(N, T, generator=gen, dtype=torch.float64) * 0.4
        comp = (torch.arange(T)[None] < torch.randint(3, T + 1, (N, 1), generator=gen)).double()
        own = comp * (torch.rand(N, T, generator=gen) > 0.4).double()
        own[:, 0] = 1.0                                          # every episode acts first
        A = torch.randn(N, generator=gen, dtype=torch.float64)
        cases.append((f"random #{i + 1} (N={N}, T={T})", (logp, old, A, comp, own)))
    return cases


def check_agent_loss(fn: Callable) -> bool:
    """Your ``fn(logp, old_logp, advantages, completion_mask, loss_mask) -> loss ()``: the
    clipped surrogate (eps 0.2) over the policy's tokens, seq-mean-token-mean, against
    ``loss.grpo_loss(logp, old_logp, advantages, loss_mask)``; then its gradient on the
    environment's tokens must be exactly 0."""
    require_function("check_agent_loss", fn)
    cases = _loss_cases()
    ok = check_against("check_agent_loss", fn, cases,
                       lambda a: grpo_loss(a[0], a[1], a[2], a[4])[0].detach(),
                       AGENT_LOSS_MISTAKES, _agent_variant, "grpo_lab.algorithm.loss.grpo_loss",
                       "loss = mean over episodes of sum_t(-min(r A, clip(r, 0.8, 1.2) A) * "
                       "loss_mask) / loss_mask.sum(1)")
    if not ok:
        return False
    name, args = cases[-1]
    logp = args[0].clone().requires_grad_(True)
    got, err = call(fn, logp, *[a.clone() for a in args[1:]])
    env_tokens = (args[3] > 0) & (args[4] == 0)
    if err is None and torch.is_tensor(got) and got.requires_grad:
        got.backward()
    grad = logp.grad
    if err or grad is None or bool((grad[env_tokens] != 0).any()):
        print(f"FAIL check_agent_loss: case {name}: d loss / d logp on the environment's tokens\n"
              f"   expected exactly 0\n   got      "
              f"{fmt(grad[env_tokens]) if grad is not None else 'no gradient'}\n   hint: "
              + (err or "keep the loss a torch expression of logp, and multiply by loss_mask "
                 "(not a mask that is 0.0001 on observations): an observation's tokens must "
                 "take exactly zero gradient"))
        return False
    return True
