"""A two-turn environment with a turn reward, as a plugin (MT-GRPO's setting, arXiv
2505.11821: a rewarded tool turn, then the answer): the first action earns 0.5 if it is an
even number (the "call" this environment accepts; the base policy writes one in about half of
its episodes, so the turn reward varies within a group) and hears "ok" (masked); the second
earns 1 if it is "7".
Registered with MT-GRPO's credit as ``turn_reward`` and with episode-level credit as
``turn_reward_episode`` (tests/test_agents.py trains both and a study compares them)."""
import random

from grpo_lab.agents.environments import AgentSettings, register_environment, with_settings
from grpo_lab.tasks import Example


class TurnReward:
    def reset(self, example, seed):
        self.turn = 0
        return ""

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return "ok", 0.5 * float(action.isdigit() and int(action) % 2 == 0), False
        return "", float(action == "7"), True

    def state_key(self):
        return self.turn


def turn_reward_examples(rng: random.Random) -> Example:
    a, b = rng.randrange(100), rng.randrange(100)
    return Example(f"{a}+{b}=", "7", "turn_reward")


register_environment("turn_reward", TurnReward, turn_reward_examples,
                     AgentSettings(max_turns=2, max_action_tokens=4, max_observation_tokens=2,
                                   credit="mtgrpo", turn_coef=1.0),
                     answer_chars="0123456789", max_answer_len=1)
with_settings("turn_reward", "turn_reward_episode", credit="episode")
