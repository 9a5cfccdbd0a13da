"""The quick environment: ``guess_digit``, the guessing game on one-digit ranges, which the toy
learns in about a minute of a laptop CPU (warm-up, then GRPO: lesson 13's quick mode).

Why not ``guess`` (games.py)? Its ranges are two-digit numbers (``g:23-30=``), and keeping track
of what the feedback leaves possible is two-digit arithmetic the 240k-parameter toy learns
slowly: 1500 warm-up steps and 1000 GRPO steps (about 3 minutes) to 0.93 held out
(bench/RESULTS_agents.md), and ``guess4`` (ranges of 4, still two digits) sits near 0.5-0.6
after a 150-step warm-up and 150 GRPO steps (measured while writing this module). Here every
number is one character: ``g:2-6=`` names the range 2..6 of the digits 0-9, the secret is one
digit of it, the feedback ``<`` / ``>`` / ``?`` and the reward are the guessing game's
(``games.GuessNumber``: 1 - 0.1 per wrong guess; 0 for an episode still going after its
turns). Ranges are 3 to 7 digits wide and the policy has 3 turns: bisection always wins
(``optimal_guesses(7)`` = 2.43 guesses, at most 3), the warm-up's random player
(``random_consistent_guess``) sometimes needs 4 and loses, so GRPO has two things to learn:
to win more often and in fewer guesses.

Held out: one range of each width (``HELD_OUT``), every secret of it (25 episodes), never drawn
for training (the other 25 ranges are). ``warm_start`` is the supervised warm-up
(warmup.py) from the toy's base policy, written to a checkpoint that ``preset("agent_cpu",
task="guess_digit", base_checkpoint=...)`` trains from; ``sampled_eval`` measures a policy as
GRPO sees it (temperature 1, G episodes per held-out example, seeded).
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

from grpo_lab.agents.environments import AgentSettings, get_environment, register_environment
from grpo_lab.agents.games import GuessNumber, random_consistent_guess
from grpo_lab.tasks import TASKS, Example

WIDTHS = (3, 4, 5, 6, 7)
RANGES = tuple((lo, lo + w - 1) for w in WIDTHS for lo in range(0, 11 - w))
"""Every range of 3-7 digits inside 0-9: 8 + 7 + 6 + 5 + 4 = 30."""
HELD_OUT = ((4, 6), (1, 4), (3, 7), (0, 5), (2, 8))
"""One range per width, held out with each of its secrets (3 + 4 + 5 + 6 + 7 = 25 examples)."""
TRAIN_RANGES = tuple(r for r in RANGES if r not in HELD_OUT)


def _example(lo: int, hi: int, secret: int) -> Example:
    return Example(f"g:{lo}-{hi}=", str(secret), "guess_digit", fields={"lo": lo, "hi": hi})


def guess_digit_examples(rng: random.Random) -> Example:
    """Guess a digit in a range of 3-7 digits with higher/lower feedback."""
    lo, hi = rng.choice(TRAIN_RANGES)
    return _example(lo, hi, rng.randint(lo, hi))


def guess_digit_held_out() -> list[Example]:
    return [_example(lo, hi, s) for lo, hi in HELD_OUT for s in range(lo, hi + 1)]


register_environment("guess_digit", GuessNumber, guess_digit_examples,
                     demo=random_consistent_guess,
                     settings=AgentSettings(max_turns=3, max_action_tokens=2,
                                            max_observation_tokens=1),
                     answer_chars="0123456789", max_answer_len=1, eval_fn=guess_digit_held_out,
                     description="guess a digit in a range of 3-7 with higher/lower feedback "
                                 "(the toy learns it in about a minute)")


def warm_start(env_name: str, steps: int, out: str | Path, seed: int = 0, batch: int = 64,
               base: str | Path = "data/base_policy.safetensors"):
    """The toy's base policy warmed up on ``env_name``'s demonstrations for ``steps`` steps of
    ``batch`` episodes (warmup.warm_up, held-out prompts excluded), saved to ``out`` ->
    (policy, losses)."""
    from grpo_lab.agents.warmup import warm_up
    from grpo_lab.paths import resolve_path
    from grpo_lab.policies.model import load_policy, save_policy
    from grpo_lab.tasks import sample_examples
    env = get_environment(env_name)
    held = {e.prompt for e in TASKS[env_name].eval_fn()}
    policy = load_policy(resolve_path(base))
    losses = warm_up(policy, env, lambda rng, n: sample_examples([TASKS[env_name]], n, rng, held),
                     steps, batch=batch, seed=seed)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_policy(policy, out)
    return policy, losses


@torch.no_grad()
def sampled_eval(policy, env_name: str, G: int = 8, seed: int = 0) -> dict:
    """``G`` episodes at temperature 1 per held-out example of ``env_name`` (generator i seeded
    ``seed + i``) -> success (share of episodes won), turns (mean policy turns, all episodes),
    return (mean episode return), episodes (how many)."""
    from grpo_lab.agents.episodes import sample_episodes
    held = TASKS[env_name].eval_fn()
    ep = sample_episodes(policy, held, get_environment(env_name), G, temperature=1.0,
                         generator=[torch.Generator().manual_seed(seed + i)
                                    for i in range(len(held))])
    won = [e == "done" and float(r) > 0 for e, r in zip(ep.end, ep.scored.rewards)]
    n = len(won)
    return {"success": sum(won) / n, "turns": sum(len(t) for t in ep.turns) / n,
            "return": float(ep.scored.rewards.mean()), "episodes": n}
