"""Credit assignment for multi-turn episodes: how an episode's rewards become the advantage of
each policy token. Records in ``CREDITS``, one signature, chosen by the environment's
``AgentSettings.credit``:

    fn(episode_adv (N,), turns (N,) lists of Turn, prompt_index (N,), Tc, settings)
        -> advantages (N,) or (N, Tc)

``episode_adv`` is the lab's group-relative advantage of each episode's return (the run's
grouper and estimator: ``advantages.grouped_advantages``), computed on the global batch.
A turn is an action the environment stepped (``episodes.Turn``): an action cut at
``max_action_tokens`` (the episode's end "tokens") is none, so under every credit its tokens
get the episode's advantage alone, and the turn before it is the episode's last (mtgrpo gives
it no A^T); an episode that ended before its first action has no turns.

  * ``episode``: every policy token of an episode gets its episode's advantage (GRPO applied
    to whole episodes: the baseline TRL's environment mode and verl's multi-turn GRPO train).
  * ``gigpo``: GiGPO (Feng et al. 2025, arXiv 2505.10978), eq. 8: A = A^E + omega * A^S. The
    step advantage A^S of the action taken at turn t of episode i:
        R_t^i = sum_{k >= t} gamma^(k-t) r_k^i                 (eq. 5, discounted step return)
        step group of (i, t) = the turns, among the G episodes of i's prompt, taken from a
            state with the same state key (eq. 6, anchor states; compared exactly)
        A^S = (R_t^i - mean(group)) / F_norm(group)            (eq. 7)
    F_norm is the group's unbiased std plus 1e-6 (``step_norm="std"``, the paper's and
    verl-agent's "mean_std_norm") or 1 (``"none"``, verl-agent's default "mean_norm"). A step
    group of one turn has A^S = 0 (verl-agent: its mean is its own return). A group of equal
    returns gets the rounding of their computed mean, as verl-agent's code does (kept, to agree
    with it bit for bit): about 1e-10 for returns of everyday size (three of 0.1: -1.4e-11),
    but three returns of 1e30 give A^S = -0.816 each. Every token of the
    turn's action gets A^S; the observation tokens are masked anyway.
  * ``mtgrpo``: MT-GRPO (Zeng et al. 2025, arXiv 2505.11821), turn-level credit. The paper's
    episodes have two turns (a tool call, then the answer): the tool turn's tokens get
    A^O + lambda A^T, the answer's get A^O, with A^O the group-normalised outcome reward and
    A^T the group-normalised turn reward, both over the G episodes of the prompt. That is the
    authors' code (``mt_grpo_env_trainer.py``, ``advantage_est="aae"``: the outcome advantage
    plus ``turn_advantage_coef`` x the turn advantage before the first tool result); the
    normaliser there is (x - mean) / (unbiased std + 1e-4). Beyond two turns, here:
        A^O_i = episode_adv[i]                   (the run's estimator on the episode return)
        turn-level group of (i, t) = turn t of each of the prompt's G episodes, where turn t
            is not that episode's last turn (the intermediate turns at position t)
        A^T_{i,t} = (r_t^i - mean(group)) / (std(group) + 1e-4)   (unbiased std)
        tokens of turn t of episode i: A^O_i + lambda A^T_{i,t} if t is intermediate, else A^O_i
    lambda is ``AgentSettings.turn_coef`` (the code's default: 1). A turn-level group of one
    turn has A^T = 0 (its own mean), as GiGPO's step groups.
    Both rewards come from ``Turn.reward``: turn t's reward r_t^i is its turn reward; the
    outcome is the episode's return, sum_t r_t^i (what the run's grouper and
    estimator read for every credit, so arms differ only in the credit). Where only the last
    turn is rewarded (guess, add_retry, second_turn) the return is the last turn's reward, the
    paper's outcome R^O, every A^T is 0 and mtgrpo equals episode (tests/test_agents.py).
    Deviations: (1) where intermediate turns are rewarded, A^O reads them too (the code's
    outcome reward leaves them out; its baseline GRPO-MR's merged reward does not); (2) A^O
    is the run's estimator (by default "grpo", eps 1e-4: the code's normaliser) over the run's
    groups;
    (3) an episode with no intermediate turn gets A^O on its tokens and is in no turn group
    (the code scores every episode's turn reward, 0 for one that made no tool call, and gives
    one with no tool result the merged reward's advantage); (4) groups by position t, which
    the paper's two-turn episodes never needed.

Deviations from verl-agent's ``core_gigpo.py``: A^E is the lab's estimator over the lab's
groups (the paper's eq. 3 with the std: the default estimator "grpo", whose eps is 1e-4), per
episode; verl-agent's default computes the episode mean and std over its step rows (each
episode weighted by its number of steps, ``compute_mean_std_cross_steps``), adds 1e-6, takes
the std out of A^E as well as A^S in its mode "mean_norm" (here ``step_norm="none"`` is A^S's
alone; ``advantage="mean_centred"`` is A^E's), and gives a prompt with one episode A^E = its
return (here 0). The step returns, step groups and A^S agree with it bit for bit
(tests/test_gigpo_reference.py, which transcribes its code). Step groups are formed
within a prompt's G episodes as in both; since a rank holds all G episodes of its prompts,
A^S needs no exchange between ranks.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch

from grpo_lab.registry import check_new, lookup

STEP_EPS = 1e-6                   # verl-agent's epsilon in step_norm_reward
STEP_NORMS = ("std", "none")      # AgentSettings.step_norm's values (F_norm of eq. 7)
TURN_EPS = 1e-4                   # MT-GRPO's code: (x - mean) / (std + 1e-4)


@dataclass(frozen=True)
class Credit:
    name: str
    fn: Callable
    description: str = ""


CREDITS: dict[str, Credit] = {}


def register_credit(name: str, fn: Callable, description: str = "") -> Credit:
    """Add a credit assignment (``AgentSettings(credit=name)``) -> its record."""
    check_new(CREDITS, "credit assignment", name, fn, lambda c: c.fn)
    CREDITS[name] = Credit(name, fn, description)
    return CREDITS[name]


def get_credit(name: str) -> Credit:
    return lookup(CREDITS, name, "credit assignment", "register your own with register_credit")


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """[r_0, ..., r_T] -> [R_0, ..., R_T], R_t = r_t + gamma R_{t+1} (GiGPO eq. 5)."""
    out, running = [], 0.0
    for r in reversed(rewards):
        running = r + gamma * running
        out.append(running)
    return out[::-1]


def step_groups(turns: list, prompt_index: torch.Tensor) -> dict:
    """(prompt, state key) -> [(row, turn)]: GiGPO's anchor-state step groups (eq. 6)."""
    groups = defaultdict(list)
    for i, row in enumerate(turns):
        for t, turn in enumerate(row):
            groups[(int(prompt_index[i]), turn.key)].append((i, t))
    return dict(groups)


def step_advantages(turns: list, prompt_index: torch.Tensor, gamma: float,
                    step_norm: str = "std") -> list[list[float]]:
    """Each turn's step advantage A^S (eq. 7) -> (N,) lists, one value per turn."""
    lookup(STEP_NORMS, step_norm, "step_norm")
    returns = [discounted_returns([t.reward for t in row], gamma) for row in turns]
    out = [[0.0] * len(row) for row in turns]
    for members in step_groups(turns, prompt_index).values():
        R = torch.tensor([returns[i][t] for i, t in members], dtype=torch.float64)   # (n,)
        if len(R) < 2:
            continue                                   # its own mean: A^S = 0
        adv = R - R.mean()
        if step_norm == "std":
            adv = adv / (R.std() + STEP_EPS)                                # unbiased std
        for (i, t), a in zip(members, adv.tolist()):
            out[i][t] = a
    return out


def episode_credit(episode_adv, turns, prompt_index, Tc: int, settings) -> torch.Tensor:
    return episode_adv                                                     # (N,)


def gigpo_credit(episode_adv, turns, prompt_index, Tc: int, settings) -> torch.Tensor:
    A = episode_adv[:, None].repeat(1, Tc).float()                         # (N, Tc) A^E
    step = step_advantages(turns, prompt_index, settings.gamma, settings.step_norm)
    for i, row in enumerate(turns):
        for t, turn in enumerate(row):
            A[i, turn.start:turn.end] += settings.omega * step[i][t]      # eq. 8
    return A


def turn_advantages(turns: list, prompt_index: torch.Tensor) -> list[list[float]]:
    """Each turn's turn-level advantage A^T (MT-GRPO, module docstring) -> (N,) lists, one
    value per turn; 0 on each episode's last turn and in a group of one."""
    groups = defaultdict(list)                     # (prompt, position) -> [(row, turn)]
    for i, row in enumerate(turns):
        for t in range(len(row) - 1):              # the intermediate turns
            groups[(int(prompt_index[i]), t)].append((i, t))
    out = [[0.0] * len(row) for row in turns]
    for members in groups.values():
        r = torch.tensor([turns[i][t].reward for i, t in members], dtype=torch.float64)  # (n,)
        if len(r) < 2:
            continue                                   # its own mean: A^T = 0
        adv = (r - r.mean()) / (r.std() + TURN_EPS)                         # unbiased std
        for (i, t), a in zip(members, adv.tolist()):
            out[i][t] = a
    return out


def mtgrpo_credit(episode_adv, turns, prompt_index, Tc: int, settings) -> torch.Tensor:
    A = episode_adv[:, None].repeat(1, Tc).float()                         # (N, Tc) A^O
    turn = turn_advantages(turns, prompt_index)
    for i, row in enumerate(turns):
        for t, tr in enumerate(row[:-1]):                                  # intermediate turns
            A[i, tr.start:tr.end] += settings.turn_coef * turn[i][t]      # A^O + lambda A^T
    return A


register_credit("episode", episode_credit,
                "every policy token gets its episode's group-relative advantage")
register_credit("gigpo", gigpo_credit,
                "GiGPO: the episode's advantage + omega x the anchor-state step advantage")
register_credit("mtgrpo", mtgrpo_credit,
                "MT-GRPO: the episode's advantage + lambda x the turn-level advantage on "
                "intermediate turns")
