"""Two-turn environments, as a plugin.

``second_turn``: any first action hears "ok" (two observation tokens, masked); the second action
earns 1 if it is "7". The base policy writes "7" there in a few percent of episodes, so GRPO has
a signal at once (tests/test_agents.py trains it from the command line).

``turn_reward`` (MT-GRPO's setting, arXiv 2505.11821: a rewarded tool turn, then the answer): the
same, but the first action earns 0.5 if it is an even number (the "call" this environment
accepts; the base policy writes one in about half of its episodes, so the turn reward varies
within a group). Registered with MT-GRPO's credit, and with episode-level credit as
``turn_reward_episode`` (tests/test_agents.py trains both and a study compares them)."""
import random

from grpo_lab.agents.environments import AgentSettings, register_environment, with_settings
from grpo_lab.tasks import Example


class SecondTurn:
    first_reward = 0.0            # paid for an even number as the first action

    def reset(self, example, seed):
        self.turn = 0
        return ""

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return "ok", self.first_reward * float(action.isdigit() and int(action) % 2 == 0), False
        return "", float(action == "7"), True

    def state_key(self):
        return self.turn


class TurnReward(SecondTurn):
    first_reward = 0.5


def examples_of(task: str):
    def examples(rng: random.Random) -> Example:
        a, b = rng.randrange(100), rng.randrange(100)
        return Example(f"{a}+{b}=", "7", task)
    return examples


TWO_TURNS = dict(max_turns=2, max_action_tokens=4, max_observation_tokens=2)
register_environment("second_turn", SecondTurn, examples_of("second_turn"),
                     AgentSettings(**TWO_TURNS), answer_chars="0123456789", max_answer_len=1)
register_environment("turn_reward", TurnReward, examples_of("turn_reward"),
                     AgentSettings(**TWO_TURNS, credit="mtgrpo", turn_coef=1.0),
                     answer_chars="0123456789", max_answer_len=1)
with_settings("turn_reward", "turn_reward_episode", credit="episode")
