"""A user's step variant with a setting, in one file outside the package: a reward bonus of
``weight`` x the completion's length, its own settings block (``cfg.length_bonus.weight``,
``--length_bonus.weight 0.1``, ``{"length_bonus": {"weight": 0.1}}``) that checks itself."""
from dataclasses import dataclass

from grpo_lab.algorithm.variants import register_variant


@dataclass
class LengthBonus:
    """A reward bonus for length (a test's variant: reward hacking made easy)."""
    weight: float = 0.0
    """Added to each reward per completion token (0 = off)."""

    def check(self, cfg):
        if not 0 <= self.weight <= 1:
            raise ValueError(f"length_bonus.weight must be in [0, 1], got {self.weight}")


def length_bonus(cfg, s, rows, max_len):
    """weight x the completion's length added to its reward, logged as reward/length_bonus."""
    bonus = cfg.length_bonus.weight * s.rollout.completion_mask.sum(1).float()    # (N_r,)
    return s._replace(rewards=s.rewards + bonus, parts={**s.parts, "length_bonus": bonus})


def kept_length(cfg, t, weight):
    """The mean completion length over the loss's rows, from the objective's side."""
    return {"bonus/len_mean": float(t.mask.sum(1).float().mean())}


register_variant("length_bonus", lambda cfg: cfg.length_bonus.weight != 0, settings=LengthBonus,
                 shape_rewards=length_bonus, stats=kept_length,
                 stat_keys=lambda cfg: ("bonus/len_mean",))
