"""The experiment harness: intervals and paired differences by hand, targets on a synthetic
history, parallel runs equal to sequential ones, clear errors, a table that renders."""
import math

import matplotlib
import pytest

from grpo_lab.training.experiments import (Results, difference_sentence, mean_ci, metric_info,
                                           run_experiment, run_metrics, steps_to_target,
                                           time_to_target)

matplotlib.use("Agg")

TINY = {"steps": 3, "prompts_per_step": 4, "group_size": 4, "eval_every": 2, "eval_size": 10,
        "ckpt_every": 10}
STRATEGIES = {"by_prompt": {}, "random": {"grouping": "random", "group": {"k": 2}}}


def history(accs, seconds, draws=None):
    """A synthetic history: step -1 then one row per step with an evaluation."""
    rows = []
    for i, (a, t) in enumerate(zip(accs, seconds)):
        rows.append({"step": i - 1, "eval/accuracy": a, "time/elapsed_s": t,
                     **({} if i == 0 else {"group/zero_std_frac": 0.5 * i, "adv/var": 1.0,
                                           **({"sample/draws": draws} if draws else {})})})
    return rows


def test_mean_ci_by_hand():
    # values 1, 2, 3: mean 2, sd 1, half-width t(0.975, 2) / sqrt(3) = 4.3027 * 0.57735 = 2.4841
    m, lo, hi = mean_ci([1, 2, 3])
    assert m == 2
    assert (hi - lo) / 2 == pytest.approx(4.302653 / math.sqrt(3), abs=1e-5)
    assert (hi - lo) / 2 == pytest.approx(2.48414, abs=1e-4)
    # Bonferroni for 7 comparisons: t(1 - 0.05/14, 2) = 11.7687, half-width 6.7947
    m, lo, hi = mean_ci([1, 2, 3], level=1 - 0.05 / 7)
    assert (hi - lo) / 2 == pytest.approx(11.768678 / math.sqrt(3), abs=1e-5)
    assert mean_ci([5, 5])[1:] == (5, 5)            # no spread, no width
    assert math.isnan(mean_ci([0.4])[1])            # one value: no interval


def test_time_to_target_and_run_metrics_by_hand():
    h = history([0.50, 0.55, 0.62, 0.61], [0.0, 1.5, 3.0, 4.5])
    assert time_to_target(h, 0.60) == (2, 3.0)      # step 1 evaluated -> 2 steps trained
    assert time_to_target(h, 0.50) == (0, 0.0)      # the base already has it
    assert time_to_target(h, 0.70) == (None, None)
    m = run_metrics(h, target=0.6)
    assert m["eval/accuracy"] == 0.61 and m["eval/gain"] == pytest.approx(0.11)
    assert m["group/zero_std_frac"] == pytest.approx((0.5 + 1.0 + 1.5) / 3)
    # interpolated: 0.55 after 1 step, 0.62 after 2 -> 1 + (0.60 - 0.55) / (0.62 - 0.55) = 1.714
    assert m["target/steps"] == pytest.approx(1 + 0.05 / 0.07) and "sample/draws" not in m
    assert "target/seconds" not in m                   # wall-clock is not a paired measure
    assert steps_to_target(h, 0.50) == 0.0 and steps_to_target(h, 0.70) is None
    assert steps_to_target(h, 0.62) == pytest.approx(2.0)       # reached exactly at step 2
    # one task's accuracy of a mixed run: 0.10 at the base, 0.40 after 8 steps -> 25% after 4
    fam = [{"step": -1, "eval/accuracy/max": 0.10}, {"step": 0, "reward/mean": 0.1},
           {"step": 7, "eval/accuracy/max": 0.40}]
    assert steps_to_target(fam, 0.25, "eval/accuracy/max") == pytest.approx(4.0)
    with pytest.raises(ValueError, match=r"'eval/accuracy/mx'.*\['eval/accuracy/max'\]"):
        steps_to_target(fam, 0.25, "eval/accuracy/mx")  # a misspelt task is not "never reached"


def test_rows_compare_and_tables_by_hand():
    runs = [{"strategy": s, "seed": seed, "history": history([0.5, a], [0, 2.0])}
            for s, accs in {"a": [0.60, 0.70, 0.80], "b": [0.58, 0.66, 0.78]}.items()
            for seed, a in enumerate(accs)]
    res = Results(runs, target=0.65)
    row = next(r for r in res.rows() if r["strategy"] == "a" and r["metric"] == "eval/gain")
    assert row["mean"] == pytest.approx(0.2) and row["n"] == 3
    assert (row["ci_high"] - row["ci_low"]) / 2 == pytest.approx(2.48414 * 0.1, abs=1e-5)
    steps = next(r for r in res.rows() if r["strategy"] == "b" and r["metric"] == "target/steps")
    # seed 0 (0.58) never got there; 0.5 -> 0.66 in 1 step: 0.15 / 0.16; 0.5 -> 0.78: 0.15 / 0.28
    assert steps["n"] == 2 and steps["values"] == pytest.approx([0.9375, 0.15 / 0.28])
    # paired differences a - b: 0.02, 0.04, 0.02 -> mean 0.02667, sd 0.011547,
    # half-width 4.302653 * 0.011547 / sqrt(3) = 0.028685 -> [-0.0020, 0.0554]: includes 0
    d = res.compare("a", "b", "eval/accuracy")
    assert d["values"] == pytest.approx([0.02, 0.04, 0.02])
    assert d["mean"] == pytest.approx(0.026667, abs=1e-6)
    assert d["ci_high"] - d["mean"] == pytest.approx(0.028685, abs=1e-5)
    assert not d["excludes_zero"] and "includes 0" in difference_sentence(d)
    html, md = res._repr_html_(), res.to_markdown()
    assert "<table>" in html and "0.700 ± 0.248" in html
    assert md.splitlines()[0].startswith("| strategy | eval/accuracy | eval/gain")
    assert "| 0.7 (2/3) |" in md            # b: 2 of 3 seeds reached it; 2 values: no interval
    short = Results(runs[:5], target=0.65)      # b's seed 2 failed: 2 of the legend's 3 seeds
    assert "over 3 seeds" in short._legend()
    assert "| b | 0.620 (2/3) |" in short.to_markdown()    # (0.58 + 0.66) / 2, no interval
    with pytest.raises(ValueError, match="'c'"):
        res.compare("c", "a")
    with pytest.raises(ValueError, match="'accuracy'"):
        res.compare("a", "b", "accuracy")


def test_end_metrics_by_hand_and_a_saved_study_reads_back(tmp_path):
    # 7 trained steps: the _end metrics average the last END_STEPS = 5 (steps 2..6); a step
    # without a right completion has no len_right and is not counted as 0
    h = [{"step": -1, "eval/accuracy": 0.2, "eval/format": 0.0}]
    for i in range(7):
        h.append({"step": i, "reward/mean": 0.1 * i, "policy/entropy": 1.0 - 0.1 * i,
                  "completion/len_wrong": 20.0 + i,
                  **({"completion/len_right": 10.0 + i} if i % 2 else {})})
    h.append({"step": 6, "eval/accuracy": 0.5, "eval/format": 0.25})
    m = run_metrics(h)
    assert m["eval/format"] == 0.25 and m["eval/gain"] == pytest.approx(0.3)
    assert m["policy/entropy_end"] == pytest.approx((0.8 + 0.7 + 0.6 + 0.5 + 0.4) / 5)
    assert m["completion/len_wrong_end"] == pytest.approx((22 + 23 + 24 + 25 + 26) / 5)
    assert m["completion/len_right_end"] == pytest.approx((13 + 15) / 2)     # steps 3 and 5
    res = Results([{"strategy": "a", "seed": s, "history": h, "findings": ["x"]}
                   for s in range(3)], target=0.4, grid=[0, 6])
    res.save(tmp_path / "study.json", keys={"eval/accuracy", "policy/entropy"})
    back = Results.load(tmp_path / "study.json")
    assert (back.target, back.grid, back.runs[0]["findings"]) == (0.4, [0, 6], ["x"])
    assert back.runs[0]["history"][1] == {"step": 0, "reward/mean": 0.0, "policy/entropy": 1.0}
    assert back.compare("a", "a", "policy/entropy_end")["values"] == [0.0, 0.0, 0.0]
    # differences against a reference: b's eval/accuracy is a's + 0.1, 0.2, 0.3 -> mean 0.2,
    # sd 0.1: t = 0.2 / (0.1 / sqrt 3) = 3.46 < 4.303, so the interval holds 0; what 3 seeds
    # find 80% of the time at that spread: 3.264 sd (power.py) = 0.3264, a rough figure; at
    # the sd's 95% upper bound on 2 df, 0.1 * sqrt(2 / chi2(0.05, 2) = 0.10259) = 0.44154:
    # 3.264 * 0.44154 = 1.4412, the figure stated. No primary declared: a lead, no verdict
    runs = [{"strategy": name, "seed": s, "history": [
        {"step": -1, "eval/accuracy": 0.2}, {"step": 0, "eval/accuracy": 0.5 + d * (s + 1)}]}
        for name, d in (("a", 0.0), ("b", 0.1)) for s in range(3)]
    (d,) = Results(runs).differences("a", ["eval/accuracy"])
    assert (d["a"], d["b"]) == ("b", "a") and d["mean"] == pytest.approx(0.2)
    assert d["detectable_rough"] == pytest.approx(0.3264, abs=1e-3)
    assert d["detectable"] == pytest.approx(1.4412, abs=1e-3) and d["sd"] == pytest.approx(0.1)
    assert d["role"] == "lead" and d["sentence"] == (
        "lead: b - a on eval/accuracy: +0.200 [-0.048, +0.448] over 3 paired seeds, interval "
        "includes 0; 80% power for 1.44 at the sd's 95% upper bound (rough, at the observed "
        "sd: 0.326).")
    # differences at float rounding of the values (1e-8 on 0.5) get no verdict, however
    # consistent their sign: two arms that computed the same numbers in another order
    runs = [{"strategy": name, "seed": s,
             "history": [{"step": 0, "eval/accuracy": 0.5 + d * (s + 1)}]}
            for name, d in (("a", 0.0), ("b", 1e-8)) for s in range(3)]
    (d,) = Results(runs).differences("a", ["eval/accuracy"])
    assert d["rounding"] and not d["excludes_zero"] and d["detectable"] is None
    assert "float rounding" in d["sentence"] and d["verdict"] == "float rounding: no difference"


def test_per_task_accuracy_is_a_metric_of_a_mixture_run(tmp_path):
    # a run of several tasks logs eval/accuracy/<task> at each evaluation: the last one is the
    # run's value; b - a on "max" is 0.1, 0.2, 0.3 (mean 0.2), on "addition" 0 every seed
    runs = [{"strategy": name, "seed": s, "history": [
        {"step": -1, "eval/accuracy": 0.2, "eval/accuracy/max": 0.3, "eval/accuracy/addition": 0.1},
        {"step": 9, "eval/accuracy": 0.5, "eval/accuracy/max": 0.6 + d * (s + 1),
         "eval/accuracy/addition": 0.4}]}
        for name, d in (("a", 0.0), ("b", 0.1)) for s in range(3)]
    assert run_metrics(runs[0]["history"])["eval/accuracy/max"] == 0.6
    res = Results(runs)
    res.save(tmp_path / "mix.json", keys={"eval/accuracy"})       # per-task accuracies kept
    assert Results.load(tmp_path / "mix.json").per_run() == res.per_run()
    d_max, d_add = res.differences("a", ["eval/accuracy/max", "eval/accuracy/addition"])
    assert d_max["mean"] == pytest.approx(0.2) and d_max["n"] == 3
    assert d_add["values"] == [0.0, 0.0, 0.0]
    assert metric_info("eval/accuracy/max") == (
        "held-out greedy accuracy on the max examples at the last evaluation", ".3f")
    with pytest.raises(ValueError, match="eval/accuracy/<task>"):
        res.compare("b", "a", "eval/accuracy/")


def test_parallel_equals_sequential_and_plots(tmp_path):
    # one thread each way: sequential runs would otherwise get cores // 1 threads, and a matmul
    # split over 2 threads sums in another order (loss/total 1.08e-7 against 1.53e-7 at step 0
    # on an AMD EPYC: a near-zero loss, rounding of its terms)
    kw = dict(seeds=(0, 1), base={**TINY, "threads": 1}, progress=False)
    par = run_experiment(STRATEGIES, processes=2, **kw)
    seq = run_experiment(STRATEGIES, processes=1, **kw)
    assert [(r["strategy"], r["seed"]) for r in par.runs] == \
        [("by_prompt", 0), ("by_prompt", 1), ("random", 0), ("random", 1)]
    keys = ["reward/mean", "loss/total", "eval/accuracy", "adv/var"]
    for a, b in zip(par.runs, seq.runs):
        assert len(a["history"]) == 4                           # step -1 and 3 steps
        assert [[h.get(k) for k in keys] for h in a["history"]] == \
            [[h.get(k) for k in keys] for h in b["history"]]
    assert par.runs[0]["history"] != par.runs[1]["history"]  # seeds differ
    fig = par.plot("eval/accuracy")
    assert len(fig.axes[0].lines) == 2
    fig.savefig(tmp_path / "curves.png")
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_bad_strategy_names_itself():
    with pytest.raises(ValueError, match="strategy 'oops'.*grouping"):
        run_experiment({"ok": {}, "oops": {"grouping": "no_such_grouper"}}, base=TINY,
                       progress=False)
    with pytest.raises(ValueError, match="strategy 'typo'"):
        run_experiment({"typo": {"groupin": "random"}}, base=TINY, progress=False)
    with pytest.raises(ValueError, match="seed"):
        run_experiment({"s": {"seed": 3}}, base=TINY, progress=False)


def two_seed_results(a_accs, b_accs):
    return Results([{"strategy": s, "seed": seed, "history": history([0.5, acc], [0, 2.0])}
                    for s, accs in {"a": a_accs, "b": b_accs}.items()
                    for seed, acc in enumerate(accs)])


def test_no_verdict_from_two_seeds_or_a_zero_width_interval():
    # two seeds whose differences are identical (+0.1, +0.1): mean_ci gives [0.1, 0.1], which
    # "excludes 0" on paper; notebook 06's quick mode (seeds (0, 1)) met exactly this
    d = two_seed_results([0.6, 0.7], [0.5, 0.6]).compare("a", "b")
    assert d["n"] == 2 and d["ci_low"] == pytest.approx(0.1) == d["ci_high"]
    text = difference_sentence(d)
    assert "too few seeds to tell" in text and "real difference" not in text
    assert not d["excludes_zero"]
    # two seeds with a spread: t(0.975, 1) = 12.706, still no verdict
    d = two_seed_results([0.6, 0.9], [0.5, 0.6]).compare("a", "b")
    assert "too few seeds to tell" in difference_sentence(d) and not d["excludes_zero"]
    # three seeds, identical differences: a zero-width interval is no verdict either
    d = Results([{"strategy": s, "seed": seed, "history": history([0.5, acc], [0, 2.0])}
                 for s, accs in {"a": [0.6, 0.7, 0.8], "b": [0.5, 0.6, 0.7]}.items()
                 for seed, acc in enumerate(accs)]).compare("a", "b")
    assert d["n"] == 3 and d["ci_high"] - d["ci_low"] == pytest.approx(0, abs=1e-12)
    assert "zero-width" in difference_sentence(d) and not d["excludes_zero"]
    # three seeds that differ (+0.1, +0.2, +0.15 -> mean 0.15, sd 0.05, half-width
    # 4.302653 * 0.05 / sqrt(3) = 0.1242 -> [0.026, 0.274]): a verdict
    d = Results([{"strategy": s, "seed": seed, "history": history([0.5, acc], [0, 2.0])}
                 for s, accs in {"a": [0.6, 0.8, 0.8], "b": [0.5, 0.6, 0.65]}.items()
                 for seed, acc in enumerate(accs)]).compare("a", "b")
    assert d["ci_low"] == pytest.approx(0.15 - 0.12421, abs=1e-4)
    assert "a real difference" in difference_sentence(d) and d["excludes_zero"]
    assert "too few seeds to tell" in difference_sentence({**d, "n": 1})


def test_a_nan_value_is_named_as_such_not_as_identical_differences():
    # seed 1 of "a" ended with eval/accuracy NaN: the differences are +0.1, NaN, +0.15, the
    # interval NaN; can_tell refuses it as it refuses a zero-width one, and the reason given
    # was "identical differences, a zero-width interval" (and "no spread" as the verdict)
    res = Results([{"strategy": s, "seed": seed, "history": history([0.5, acc], [0, 2.0])}
                   for s, accs in {"a": [0.6, math.nan, 0.8], "b": [0.5, 0.6, 0.65]}.items()
                   for seed, acc in enumerate(accs)], primary={"a": "a", "b": "b",
                                                               "metric": "eval/accuracy"})
    d = res.compare("a", "b")
    assert d["n"] == 3 and math.isnan(d["mean"]) and not d["excludes_zero"]
    text = difference_sentence(d)
    assert "a paired difference is NaN or infinite" in text and "zero-width" not in text
    assert "NaN or infinite" in res.primary_test()["sentence"]
    (lead,) = Results(res.runs).differences("b", ["eval/accuracy"])
    assert lead["verdict"] == "not a number" and lead["detectable"] is None


def test_a_target_never_reached_is_named_censored_in_the_comparison_not_dropped_silently():
    # target 0.7, evaluations at 0 and 1 steps: "a" reaches it on seeds 0 and 1 (0.5 -> 0.8:
    # 0 + 0.2 / 0.3 * 1 = 0.667 steps) and never on seed 2; "b" reaches it on every seed
    # (0.5 -> 0.9: 0.2 / 0.4 * 1 = 0.5 steps). Seed 2 has no difference of steps: it is
    # censored, and the sentence says so (it was only "2 paired seed(s)")
    res = Results([{"strategy": s, "seed": seed, "history": history([0.5, acc], [0, 2.0])}
                   for s, accs in {"a": [0.8, 0.8, 0.6], "b": [0.9, 0.9, 0.9]}.items()
                   for seed, acc in enumerate(accs)], target=0.7)
    d = res.compare("a", "b", "target/steps")
    assert d["n"] == 2 and d["censored"] == 1
    assert d["mean"] == pytest.approx(0.2 / 0.3 - 0.5)
    assert ("a - b on target/steps: +0.167 [+0.167, +0.167] over 2 paired seeds (1 more where "
            "an arm never reached the target, censored and left out of the difference): "
            "too few seeds to tell") in difference_sentence(d)
    assert res.compare("a", "b")["censored"] == 0            # eval/accuracy: nothing censored


def test_loading_a_file_that_is_no_study_names_the_file(tmp_path):
    # the samples stored beside a study (data/studies/*_samples.json) gave KeyError: 'runs'
    path = tmp_path / "x_samples.json"
    path.write_text('{"grpo": {"first_step": 7}}')
    with pytest.raises(ValueError, match="x_samples.json is not a study written by Results.save"):
        Results.load(path)


def test_two_seed_table_shows_no_interval_and_repr_is_short():
    res = two_seed_results([0.6, 0.7], [0.5, 0.6])
    md, html = res.to_markdown(), res._repr_html_()
    assert "±" not in md and "0.650" in md                  # the mean, no "± 0.000"
    assert "too few seeds to tell" in html
    text = repr(res)
    assert text.startswith("Results(2 strategies x 2 seeds [0, 1], 4 runs")
    assert "time/elapsed_s" not in text and len(text.splitlines()) < 10


def test_time_budget_is_refused_not_ignored():
    with pytest.raises(ValueError, match="time_budget_s=30.*steps"):
        run_experiment({"a": {}}, base={**TINY, "time_budget_s": 30}, progress=False)
    with pytest.raises(ValueError, match="strategy 'b' sets time_budget_s"):
        run_experiment({"b": {"time_budget_s": 5.0}}, base=TINY, progress=False)


def test_failing_run_names_strategy_and_seed():
    # a valid config that fails inside train(): an eval set larger than the held-out file
    with pytest.raises(RuntimeError, match="strategy 'big', seed 1"):
        run_experiment({"big": {"eval_size": 10**6}}, seeds=(1,), base=TINY, processes=1,
                       progress=False)
