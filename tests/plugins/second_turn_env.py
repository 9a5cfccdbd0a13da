"""A two-turn environment, as a plugin: any first action hears "ok" (two observation tokens,
masked); the second action earns 1 if it is "7". The base policy writes "7" there in a few
percent of episodes, so GRPO has a signal at once (tests/test_agents.py trains it from the
command line)."""
import random

from grpo_lab.agents.environments import AgentSettings, register_environment
from grpo_lab.tasks import Example


class SecondTurn:
    def reset(self, example, seed):
        self.turn = 0
        return ""

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return "ok", 0.0, False
        return "", float(action == "7"), True

    def state_key(self):
        return self.turn


def second_turn_examples(rng: random.Random) -> Example:
    a, b = rng.randrange(100), rng.randrange(100)
    return Example(f"{a}+{b}=", "7", "second_turn")


register_environment("second_turn", SecondTurn, second_turn_examples,
                     AgentSettings(max_turns=2, max_action_tokens=4, max_observation_tokens=2),
                     answer_chars="0123456789", max_answer_len=1)
