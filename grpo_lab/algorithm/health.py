""""Nothing is being learned", said in words: the signs of a run that trains without signal.

GRPO's gradient is the advantage-weighted log-prob gradient; a group whose G rewards are
equal has advantages 0 and adds nothing (DeepSeekMath eq. 3; DAPO, Yu et al. 2025, sec. 3.2,
filters such groups). The loop logs the numbers that show it (``group/zero_std_frac``,
``completion/stopped_frac``, ``reward/mean``, ``policy/entropy``, ``sample/topped_up``);
``diagnose`` reads them over the last steps and says what is wrong and the likely cause:

  * ``equal_rewards``: most groups have equal rewards. The reward never fires (mean near 0:
    the completions never match the answer or the requested format), everything is solved
    (near the maximum: too easy), or each group agrees with itself (low temperature, small G).
  * ``truncated``: most completions are cut at max_new_tokens (raise it; ask for shorter
    answers).
  * ``flat_reward``: the reward's running mean has not moved for many steps.
  * ``entropy_collapse``: the policy samples (almost) one token per position, so a group's
    completions are copies.
  * ``dynamic_sampling_exhausted``: dynamic sampling ran out of draws and topped the batch up
    with prompts whose groups carry no signal.
  * ``sampler_drift``: the sampler's log-probs (``sample/logprob_gap``, logged with
    ``tis.cap`` > 0) moved away from the trainer's after the first step: the sampler is not
    running the weights the trainer updates (a stale copy: vLLM's packed LM head did this
    before ``vllm_rollout.repack_tied_head``). A constant gap (another dtype) is not drift.

The trainer shows the active findings on its progress bar (and prints each the first time it
fires); the report lists every finding of the run with the steps it covered
(``timeline``). Thresholds are module constants: heuristics, stated, not tuned per task.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import mean
from typing import Callable, NamedTuple

WINDOW = 10              # steps a finding looks back over
EQUAL_FRAC = 0.8         # equal_rewards: mean group/zero_std_frac at least this
STOPPED_FRAC = 0.5       # truncated: mean completion/stopped_frac below this
FLAT_WINDOW = 50         # flat_reward: steps the running mean must stay within ...
FLAT_RANGE = 0.02        # ... this fraction of the largest possible reward
ENTROPY_FLOOR = 0.02     # entropy_collapse: nats per token, or ...
ENTROPY_DROP = 0.1       # ... below this fraction of the first steps' entropy
NEVER_FIRES, SOLVED = 0.05, 0.95   # equal_rewards' cause: mean reward / largest reward
GAP_GROWTH = 20.0        # sampler_drift: the last steps' mean gap at least this times step 0's ...
GAP_FLOOR = 1e-4         # ... and above this (nats per token; float32 vLLM vs the trainer: 5e-6,
                         # BENCHMARKS.md section 21; its stale LM head: 5e-4 - 4e-3)
# what entropy_collapse advises, with what the SmolLM2 studies measured (BENCHMARKS.md
# section 19, 3 seeds each, paired): the sampling temperature sets the sampled entropy at once;
# the KL term and clip-higher did not measurably hold it
ENTROPY_LEVERS = ("raise temperature or lower lr. On SmolLM2 the KL term (kl.beta 0.04) kept "
                  "+0.04 nats [-0.01, +0.09] more after 30 steps, and clip-higher (clip.eps_high "
                  "0.28 vs 0.2) -0.01 [-0.15, +0.14] after 12 steps at mu 2: neither told apart "
                  "from noise with 3 seeds (BENCHMARKS.md section 19); clip.eps_high acts only "
                  "with mu > 1 (at mu 1 every ratio is 1 and no clip binds).")


@dataclass(frozen=True)
class Finding:
    code: str             # equal_rewards | truncated | flat_reward | entropy_collapse | ...
    message: str          # one sentence: what is seen, the likely cause, what to try


def _values(steps: list[dict], key: str) -> list[float]:
    return [h[key] for h in steps if h.get(key) is not None]


def max_reward(cfg: dict) -> float:
    """The largest weighted reward (each reward function gives at most 1)."""
    return sum(w for w in (cfg.get("reward_weights") or {"accuracy": 1.0}).values() if w > 0) or 1.0


def _train_steps(history: list[dict]) -> list[dict]:
    return [h for h in history if h.get("step", -1) >= 0 and "reward/mean" in h]


class Seen(NamedTuple):
    """What a check reads: the last WINDOW training steps, the run's first 5, the config."""
    last: list[dict]
    steps: list[dict]      # up to the last FLAT_WINDOW + 5
    first: list[dict]
    cfg: dict
    top: float             # the largest possible reward (max_reward)


def diagnose(history: list[dict], cfg: dict | None = None,
             first: list[dict] | None = None) -> list[Finding]:
    """Findings on the last steps of ``history`` (the trainer's metrics dicts; ``cfg`` the
    run's config as a dict, for the reward scale and the names of the knobs): each of
    ``CHECKS`` in turn, once WINDOW steps exist. Only the last FLAT_WINDOW + 5 steps and the
    first 5 are read: ``first`` gives those when ``history`` is only the run's tail (the
    trainer passes a tail, so a check costs the same every step)."""
    steps = _train_steps(history[-(FLAT_WINDOW + 5):])
    if len(steps) < WINDOW:
        return []
    first = _train_steps(history[:10])[:5] if first is None else first
    seen = Seen(steps[-WINDOW:], steps, first, cfg or {}, max_reward(cfg or {}))
    return [f for check in CHECKS if (f := check(seen)) is not None]


def equal_rewards(s: Seen) -> Finding | None:
    zero = _values(s.last, "group/zero_std_frac")
    if not (zero and mean(zero) >= EQUAL_FRAC):           # (NaN: no finding, as before)
        return None
    reward = mean(_values(s.last, "reward/mean"))
    seen = f"{mean(zero):.0%} of groups had equal rewards over the last {WINDOW} steps"
    if reward <= NEVER_FIRES * s.top:
        why = (f"the reward never fires (mean {reward:.3f}): the completions never match "
               f"the answer or the requested format; read samples.jsonl, ask for a format "
               f"the model can produce (answer_format), weight a format reward, or train "
               f"an easier task")
    elif reward >= SOLVED * s.top:
        why = (f"everything is solved (mean {reward:.3f} of {s.top:g}): the task is too easy "
               f"for this policy; train a harder one")
    else:                 # dynamic.sampling on already: dynamic_sampling_exhausted says more
        why = ("each prompt's completions agree with each other: raise group_size or "
               "temperature" + ("" if (s.cfg.get("dynamic") or {}).get("sampling") else
                                ", or turn on dynamic.sampling"))
    return Finding("equal_rewards", f"{seen}: {why}.")


def truncated(s: Seen) -> Finding | None:
    stopped = _values(s.last, "completion/stopped_frac")
    if not (stopped and mean(stopped) < STOPPED_FRAC):
        return None
    limit = s.cfg.get("max_new_tokens") or "the task's default"
    return Finding("truncated", f"{1 - mean(stopped):.0%} of completions were cut at "
                   f"max_new_tokens={limit} over the last {WINDOW} steps: raise "
                   f"max_new_tokens or ask for a shorter answer (a cut completion "
                   f"scores as its answer format says).")


def flat_reward(s: Seen) -> Finding | None:
    if len(s.steps) < FLAT_WINDOW:
        return None
    reward = _values(s.steps[-FLAT_WINDOW:], "reward/mean")
    run = [mean(reward[i - WINDOW:i]) for i in range(WINDOW, len(reward) + 1)]   # running mean
    if not (run and max(run) - min(run) < FLAT_RANGE * s.top):
        return None
    return Finding("flat_reward", f"the reward's {WINDOW}-step mean stayed within "
                   f"{max(run) - min(run):.3f} over the last {FLAT_WINDOW} steps "
                   f"(at {run[-1]:.3f}): nothing is being learned; see the other "
                   f"findings, or raise lr.")


def entropy_collapse(s: Seen) -> Finding | None:
    ent, ent0 = _values(s.last, "policy/entropy"), _values(s.first, "policy/entropy")
    if len(ent) < WINDOW or not ent0:
        return None
    start, now = mean(ent0), mean(ent)
    if not (now < ENTROPY_FLOOR or (start > 0.2 and now < ENTROPY_DROP * start)):
        return None
    return Finding("entropy_collapse", f"the policy's entropy fell to {now:.3f} "
                   f"nats per token (from {start:.3f}): it samples one answer, so "
                   f"groups have nothing to compare; {ENTROPY_LEVERS}")


def dynamic_sampling_exhausted(s: Seen) -> Finding | None:
    short = [h for h in s.last if h.get("sample/topped_up")]
    dynamic = s.cfg.get("dynamic") or {}                  # the saved config's block
    if not dynamic.get("sampling") or len(short) * 2 < len(s.last):
        return None
    n = mean(h["sample/topped_up"] for h in short)
    return Finding("dynamic_sampling_exhausted", f"dynamic sampling ran out of draws in "
                   f"{len(short)} of the last {len(s.last)} steps: {n:.1f} of "
                   f"{s.cfg.get('prompts_per_step', '?')} prompts per step were topped up "
                   f"with equal-reward groups after dynamic.max_draws="
                   f"{dynamic.get('max_draws', '?')} rollouts; see equal_rewards' "
                   f"cause, or raise dynamic.max_draws.")


def sampler_drift(s: Seen) -> Finding | None:
    gap, gap0 = _values(s.last, "sample/logprob_gap"), _values(s.first[:1], "sample/logprob_gap")
    if len(gap) < WINDOW or not gap0:
        return None
    start, now = gap0[0], mean(gap)
    if not (now > GAP_FLOOR and now > GAP_GROWTH * start):
        return None
    return Finding("sampler_drift", f"the sampler's log-probs differ from the "
                   f"trainer's by {now:.1e} nats per token over the last {WINDOW} "
                   f"steps, against {start:.1e} at the first step: the sampler is "
                   f"not running the weights being trained (a stale copy; with "
                   f"rollout='vllm', check that every updated weight reaches "
                   f"vLLM); TIS corrects only up to tis.cap.")


CHECKS: tuple[Callable[[Seen], Finding | None], ...] = (
    equal_rewards, truncated, flat_reward, entropy_collapse, dynamic_sampling_exhausted,
    sampler_drift)
"""The findings in the order they are reported: one function each, (Seen) -> Finding | None."""


def timeline(history: list[dict], cfg: dict | None = None) -> dict[str, dict]:
    """Every finding of the run: code -> {"first": step, "last": step, "steps": count,
    "message": its latest message}, ``diagnose`` replayed after each step."""
    out: dict[str, dict] = {}
    steps = _train_steps(history)
    for n in range(WINDOW, len(steps) + 1):
        for f in diagnose(steps[max(0, n - FLAT_WINDOW - 5):n], cfg, steps[:5]):
            row = out.setdefault(f.code, {"first": steps[n - 1]["step"], "steps": 0})
            row.update(last=steps[n - 1]["step"], message=f.message, steps=row["steps"] + 1)
    return out


def report_lines(history: list[dict], cfg: dict | None = None) -> list[str]:
    """Markdown lines for the report: each finding with the steps it covered, or none."""
    lines = [f"- **{code}** (steps {row['first']}-{row['last']}, {row['steps']} checks): "
             f"{row['message']}" for code, row in timeline(history, cfg).items()]
    return ["## Is anything being learned?", "", *lines, ""] if lines else []
