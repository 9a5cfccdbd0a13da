"""Checks for learners' implementations, with hints (the workshop's exercises).

Each ``check_*(fn)`` runs the learner's function on hand-picked cases (the edge cases a
teacher would ask about) and on seeded random cases, compares it with the library's own
implementation, prints a short verdict and returns True or False, so a cell can assert it:

    check_advantages(fn)            fn(rewards (N,), group_ids (N,)) -> advantages (N,)
                                    against advantages.grpo_advantages
    check_grpo_loss(fn)             fn(logp, old_logp, ref_logp (N, T), advantages (N,),
                                       mask (N, T), eps=0.2, beta=0.04) -> loss ()
                                    against loss.grpo_loss (seq_mean_token_mean)
    check_grouper(fn, strategy)     fn(batch: PromptBatch, k, seed=0) -> ids (B,)
                                    against grouping.GROUPERS[strategy]
    check_topk_error_feedback(fn)   fn(grad (n,), residual (n,), k) -> (indices (k,),
                                       values (k,), new_residual (n,))
                                    against distributed.compression.sparsify
    check_gspo_ratio(fn)            fn(logp, old_logp, mask (N, T)) -> s (N,)
                                    against loss.sequence_ratio (GSPO)
    check_kl_estimators(fn)         fn(logp, ref_logp) -> (k1, k2, k3), each logp's shape
                                    against loss.KL_ESTIMATORS
    check_environment(cls)          cls() with reset / step / state_key: the hot/cold game
                                    against exercise_agents.HotCold
    check_agent_loss(fn)            fn(logp, old_logp, advantages (N,), completion_mask,
                                       loss_mask (N, T)) -> loss () over the policy's tokens
                                    against loss.grpo_loss with loss_mask

A failed check names the case, shows expected against got, and gives a hint. Each call of the
learner's function has a time limit (``TIME_LIMIT_S``): an infinite loop fails the check
with a hint instead of hanging the cell. The hint comes
from matching the learner's output with the usual mistakes (population std, clip on the wrong
side, KL sign, no error feedback, ...), each computed here as a variant of the reference.
Only the first failing case is shown: one thing to fix at a time.

This module gathers the checks; each lives in a module of its own idea:
``exercise_harness`` (calling the learner's function under the time limit, comparing,
picking the mistake, the verdict), ``exercise_advantages``, ``exercise_loss`` (the GRPO loss,
GSPO's ratio, the KL estimators), ``exercise_grouper``, ``exercise_topk`` and ``exercise_agents`` (an environment, the
masked loss of an episode). Setting
``exercises.TIME_LIMIT_S`` sets the limit the checks read (``exercise_harness.TIME_LIMIT_S``).
"""
from __future__ import annotations

import sys
import types

from grpo_lab.teaching import exercise_harness
from grpo_lab.teaching.exercise_agents import (AGENT_LOSS_MISTAKES, check_agent_loss,
                                               check_environment)
from grpo_lab.teaching.exercise_advantages import ADVANTAGE_MISTAKES, check_advantages
from grpo_lab.teaching.exercise_grouper import check_grouper
from grpo_lab.teaching.exercise_harness import NOT_WRITTEN, Failure
from grpo_lab.teaching.exercise_loss import (GSPO_MISTAKES, KL_MISTAKES, LOSS_MISTAKES, check_gspo_ratio,
                                             check_grpo_loss, check_kl_estimators)
from grpo_lab.teaching.exercise_topk import check_topk_error_feedback

__all__ = ["ADVANTAGE_MISTAKES", "AGENT_LOSS_MISTAKES", "CHECKS", "Failure", "GSPO_MISTAKES", "KL_MISTAKES",
           "LOSS_MISTAKES", "NOT_WRITTEN", "TIME_LIMIT_S", "check_advantages", "check_grouper",
           "check_grpo_loss", "check_gspo_ratio", "check_kl_estimators",
           "check_topk_error_feedback", "check_environment", "check_agent_loss"]

CHECKS = {"advantages": check_advantages, "grpo_loss": check_grpo_loss,
          "grouper": check_grouper, "topk_error_feedback": check_topk_error_feedback,
          "gspo_ratio": check_gspo_ratio, "kl_estimators": check_kl_estimators,
          "environment": check_environment, "agent_loss": check_agent_loss}


class _Exercises(types.ModuleType):
    """``exercises.TIME_LIMIT_S`` reads and sets ``exercise_harness.TIME_LIMIT_S``, the one
    limit every check reads (so ``exercises.TIME_LIMIT_S = 30`` in a notebook still works)."""

    @property
    def TIME_LIMIT_S(self) -> float:
        return exercise_harness.TIME_LIMIT_S

    @TIME_LIMIT_S.setter
    def TIME_LIMIT_S(self, seconds: float) -> None:
        exercise_harness.TIME_LIMIT_S = seconds


sys.modules[__name__].__class__ = _Exercises
