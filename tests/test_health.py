"""health.py: the "nothing is being learned" findings fire on the histories that show them."""
from grpo_lab.algorithm import health
from grpo_lab.algorithm.health import diagnose, report_lines, timeline

CFG = {"reward_weights": {"accuracy": 1.0, "format": 0.5}, "max_new_tokens": 24,
       "prompts_per_step": 8, "dynamic": {"sampling": True, "max_draws": 4}}


def steps(n, **metrics):
    base = {"reward/mean": 0.5, "group/zero_std_frac": 0.2, "completion/stopped_frac": 1.0,
            "policy/entropy": 1.0}
    return [{"step": i, **base, **{k: (v(i) if callable(v) else v) for k, v in metrics.items()}}
            for i in range(n)]


def codes(history, cfg=CFG):
    return {f.code for f in diagnose(history, cfg)}


def test_a_healthy_run_has_no_findings():
    h = steps(60, **{"reward/mean": lambda i: 0.2 + 0.01 * i})
    assert codes([{"step": -1, "eval/accuracy": 0.1}] + h) == set()
    assert codes(h[:5] + [{"step": 5}]) == set()                     # too early to tell


def test_a_nan_metric_is_no_finding():
    h = steps(60, **{"reward/mean": lambda i: 0.2 + 0.01 * i, "group/zero_std_frac": float("nan"),
                     "completion/stopped_frac": float("nan")})
    assert codes(h) == set()                       # NaN >= 0.8 and NaN < 0.5 are both False


def test_constant_zero_reward_says_the_reward_never_fires():
    h = steps(60, **{"reward/mean": 0.0, "group/zero_std_frac": 1.0})
    found = {f.code: f.message for f in diagnose(h, CFG)}
    assert set(found) == {"equal_rewards", "flat_reward"}
    assert "the reward never fires" in found["equal_rewards"]
    assert "100% of groups had equal rewards" in found["equal_rewards"]
    assert "nothing is being learned" in found["flat_reward"]


def test_constant_full_reward_says_too_easy_and_mixed_says_groups_agree():
    solved = diagnose(steps(20, **{"reward/mean": 1.5, "group/zero_std_frac": 0.9}), CFG)
    assert "everything is solved" in solved[0].message and "too easy" in solved[0].message
    agree = diagnose(steps(20, **{"reward/mean": 0.7, "group/zero_std_frac": 0.85}), CFG)
    assert "raise group_size or temperature" in agree[0].message
    assert "turn on dynamic.sampling" not in agree[0].message          # CFG has it on already
    off = diagnose(steps(20, **{"reward/mean": 0.7, "group/zero_std_frac": 0.85}), {})
    assert "raise group_size or temperature, or turn on dynamic.sampling." in off[0].message


def test_all_truncated_completions_say_raise_max_new_tokens():
    h = steps(20, **{"completion/stopped_frac": 0.0})
    found = diagnose(h, CFG)
    assert [f.code for f in found] == ["truncated"]
    assert "100% of completions were cut at max_new_tokens=24" in found[0].message
    assert "raise max_new_tokens" in found[0].message
    assert codes(steps(20, **{"completion/stopped_frac": 0.6})) == set()


def test_entropy_collapse_and_dynamic_sampling_running_out():
    h = steps(30, **{"policy/entropy": lambda i: 1.0 if i < 10 else 0.05})
    assert "entropy_collapse" in codes(h)
    message = next(f.message for f in diagnose(h, CFG) if f.code == "entropy_collapse")
    assert "fell to 0.050 nats per token (from 1.000)" in message
    # the levers it names carry the SmolLM2 studies' intervals, and say where clip-higher acts
    assert "[-0.01, +0.09]" in message and "[-0.15, +0.14]" in message and "mu > 1" in message
    h = steps(20, **{"sample/topped_up": lambda i: 3 if i % 2 else 0})
    found = {f.code: f.message for f in diagnose(h, CFG)}
    assert "dynamic sampling ran out of draws in 5 of the last 10 steps" in \
        found["dynamic_sampling_exhausted"]
    assert "3.0 of 8 prompts" in found["dynamic_sampling_exhausted"]


def test_a_sampler_drifting_from_the_trainer_is_named_and_a_constant_gap_is_not():
    # the stale vLLM LM head: 5e-6 per token at step 0, then 3e-3 once updates are pushed
    stale = steps(20, **{"sample/logprob_gap": lambda i: 5e-6 if i == 0 else 3e-3})
    (f,) = [f for f in diagnose(stale, CFG) if f.code == "sampler_drift"]
    assert "3.0e-03 nats per token" in f.message and "5.0e-06 at the first step" in f.message
    assert "sampler_drift" not in codes(steps(20, **{"sample/logprob_gap": 1e-2}))  # a dtype gap
    assert "sampler_drift" not in codes(steps(20, **{                     # float rounding only
        "sample/logprob_gap": lambda i: 1e-7 if i == 0 else 5e-6}))


def test_timeline_and_report_name_the_steps_covered():
    h = steps(30, **{"completion/stopped_frac": lambda i: 1.0 if i < 15 else 0.0})
    row = timeline(h, CFG)["truncated"]
    # the 10-step mean drops below 0.5 once 6 of the last 10 steps are truncated: step 20
    assert (row["first"], row["last"], row["steps"]) == (20, 29, 10)
    lines = report_lines(h, CFG)
    assert lines[0] == "## Is anything being learned?"
    assert "**truncated** (steps 20-29, 10 checks)" in lines[2]
    assert report_lines(steps(30), CFG) == []
    assert health.max_reward(CFG) == 1.5


def test_the_trainer_says_it_on_a_constant_reward_and_the_report_lists_it(tmp_path, monkeypatch,
                                                                         capsys):
    from grpo_lab.tasks.rewards import REWARDS
    from grpo_lab.training.config import preset, to_dict
    from grpo_lab.training.report import write_report
    from grpo_lab.training.trainer import train

    monkeypatch.setitem(REWARDS, "never", lambda c, e, s: [0.0] * len(c))
    cfg = preset("quick", steps=12, eval_size=8, eval_every=0, threads=1, out_dir=str(tmp_path),
                 reward_weights={"never": 1.0}, dynamic={"sampling": True, "max_draws": 2})
    history = train(cfg, progress=True)
    got = capsys.readouterr()
    err = got.out + got.err                       # the bar on stderr, the findings on stdout
    assert "equal_rewards: 100% of groups had equal rewards" in err
    assert "the reward never fires" in err
    assert "dynamic_sampling_exhausted: dynamic sampling ran out of draws in 10 of the last 10" in err
    steps_ = [h for h in history if h["step"] >= 0]
    assert all(h["sample/topped_up"] == 8 and h["sample/draws"] == 2 for h in steps_)
    md = write_report(history, tmp_path, to_dict(cfg)).read_text()
    assert "**equal_rewards** (steps 9-11, 3 checks)" in md
    assert "## Samples (greedy, held-out)" in md and "| step -1 | step 11 |" in md


def test_every_setting_a_finding_names_is_a_train_flag():
    """The settings the findings tell a user to change, as `grpo-lab train --help` spells them
    (no abbreviation is accepted): snake_case and dotted names, and the single words named."""
    import re

    from grpo_lab.cli import build_parser
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    flags = {s[2:] for a in train._actions for s in a.option_strings}
    histories = [steps(60, **{"reward/mean": 0.0, "group/zero_std_frac": 1.0}),
                 steps(20, **{"reward/mean": 1.5, "group/zero_std_frac": 0.9}),
                 steps(20, **{"reward/mean": 0.7, "group/zero_std_frac": 0.85}),
                 steps(20, **{"completion/stopped_frac": 0.0}),
                 steps(30, **{"policy/entropy": lambda i: 1.0 if i < 10 else 0.05}),
                 steps(20, **{"sample/topped_up": lambda i: 3 if i % 2 else 0}),
                 steps(20, **{"sample/logprob_gap": lambda i: 5e-6 if i == 0 else 3e-3})]
    found = {f.code: f.message for h in histories for f in diagnose(h, CFG)}
    assert set(found) == {c.__name__ for c in health.CHECKS}            # every finding read
    named = {n for m in found.values()
             for n in re.findall(r"\b[a-z][a-z0-9]*(?:[._][a-z0-9]+)+\b", m)} - set(found)
    assert named - {"samples.jsonl"} <= flags, named - flags
    assert {"clip.eps_high", "kl.beta", "tis.cap", "dynamic.max_draws"} <= named
    assert {"lr", "temperature", "mu", "rollout"} <= flags
