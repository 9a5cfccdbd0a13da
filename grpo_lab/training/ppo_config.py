"""``PPOConfig``: the critic and GAE settings of objective="ppo" (``TrainConfig.ppo``,
``--ppo.gamma``), apart from ppo.py so that building a config does not load the PPO objective;
``ppo.critic`` is looked up in ppo.CRITICS when a run is checked (config.check_records).
"""
from __future__ import annotations

from dataclasses import dataclass

from grpo_lab.registry import fields_finite, fields_nonnegative


@dataclass
class PPOConfig:
    """objective="ppo": the critic and GAE (``TrainConfig.ppo``; ``--ppo.FIELD`` on the command
    line)."""
    gamma: float = 1.0
    """Discount of GAE (1.0: an outcome reward counts fully at every token)."""
    gae_lambda: float = 0.95
    """GAE's lambda (0: one-step TD advantages, 1: Monte Carlo returns - V)."""
    vf_coef: float = 0.5
    """Weight of the value loss added to the policy loss."""
    vf_clip: float = 0.2
    """The value loss's clip range around the rollout's values (PPO2)."""
    critic: str = "head"
    """"head", a value head on the policy's hidden states (shared body), or "network", a
    second GPT from base_checkpoint with its own value head (the classic RLHF critic, as big
    as the policy: twice the parameters and optimizer state)."""
    vf_lr: float = 0.0
    """The critic's AdamW learning rate, its own parameter group, with lr's warm-up and
    schedule (0: lr). A critic starting from zero usually wants more than lr."""

    def __post_init__(self):
        fields_finite(self, "gamma", "gae_lambda", "vf_coef", "vf_clip", "vf_lr")
        fields_nonnegative(self, "vf_coef", "vf_clip", "vf_lr")
        if not (0 <= self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise ValueError(f"need ppo.gamma and ppo.gae_lambda in [0, 1], "
                             f"got {self.gamma}, {self.gae_lambda}")
