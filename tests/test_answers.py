"""Instruct answers (answers.py, instruct.py, word_problems.py): extraction on hand-written
completions, the format check, truncation, the rewards, rendering and config errors."""
import json
import random
from fractions import Fraction
from pathlib import Path

import pytest

from grpo_lab.tasks import answers
from grpo_lab.tasks.answers import extract, follows_format, is_correct
from grpo_lab.training.config import check_records, TrainConfig
from grpo_lab.tasks.instruct import render, render_all
from grpo_lab.tasks.rewards import REWARDS, resolve_rewards, weighted_reward
from grpo_lab.tasks import Example
from grpo_lab.tasks.task_data import load_eval
from grpo_lab.tasks.word_problems import eval_examples, make, operations


@pytest.mark.parametrize("text, want", [
    ("The answer is 42.", "42"),
    ("<answer>42</answer>", "42"),
    ("\\boxed{42}", "42"),
    ("-7", "-7"),
    ("17 + 25 = 42. So 3 apples cost 12.", "12"),         # several numbers: the last
    ("no number here", None),
    ("", None),
    ("12-7 is 5", "5"),                                    # a minus after a digit is an operator
    ("x = -7", "-7"),
    ("It is 1,000 in total", "1,000"),
    ("<answer>3</answer> and later 99", "3"),              # the tags win over the last number
    ("<answer>1</answer> no, <answer>2</answer>", "2"),    # the last pair
    ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),     # braces matched
    ("\\boxed{7 and never closed", "7"),                   # an unclosed box: last number
    ("SmolLM2 says hi", None),                             # a digit inside a word is no number
])
def test_extract_hand_written_answers(text, want):
    assert extract(text) == want


def test_numbers_compare_by_value():
    assert answers.same_number("42.0", "42") and answers.same_number("1,000", "1000")
    assert answers.same_number("$42.", "42")
    assert answers.as_number("3/4") == Fraction(3, 4)
    assert not answers.same_number("41", "42") and not answers.same_number(None, "42")
    assert not answers.same_number("4 2", "42")            # two numbers are not one
    assert answers.same_text(" 0 1 2 3 ", "0123") and not answers.same_text("123", "0123")


def test_a_comma_group_of_four_digits_is_no_thousands_separator():
    """"12,3456" read as 12,345 (a number the text does not hold: the comma group stopped inside
    the digit run), so "1,0000" was the right answer to 1000; now a group is exactly three
    digits and the text holds the numbers 12 and 3456."""
    assert answers.as_number("12,3456") is None                 # two numbers are not one
    assert answers.last_number("It is 12,3456") == "3456"
    assert not answers.same_number("1,0000", "1000")
    assert answers.as_number("1,234,567.5") == Fraction(2469135, 2)


def test_format_checks_the_requested_format_and_needs_a_stop():
    assert follows_format("17 + 25 = 42, so <answer>42</answer>", True, "tags")
    assert not follows_format("<answer>42</answer>", False, "tags")          # cut off
    assert not follows_format("<answer>42</answer> I hope that helps", True, "tags")
    assert not follows_format("<answer></answer>", True, "tags")
    assert not follows_format("<answer>4</answer><answer>2</answer>", True, "tags")
    assert follows_format("Thus $\\boxed{42}$.", True, "boxed")
    assert not follows_format("\\boxed{42} \\boxed{43}", True, "boxed")
    assert follows_format(" 42.", True, "number") and not follows_format("It is 42", True, "number")
    with pytest.raises(ValueError, match="unknown answer format 'xml'"):
        follows_format("x", True, "xml")


def test_truncated_completions_count_only_through_a_closed_wrapper():
    # tags and boxed count a finished answer the model kept talking after; the last number
    # of a cut-off text is only where it stopped
    assert is_correct("<answer>46</answer> and then I went", False, "tags", "addition", "46")
    assert not is_correct("12 + 34 = 46 and then", False, "tags", "addition", "46")
    assert is_correct("12 + 34 = 46", True, "tags", "addition", "46")
    assert not is_correct("<answer>46</answer>", False, "number", "addition", "46")


def test_instruct_rewards_by_hand_and_the_toy_unchanged():
    ex = render(Example("12+34=", "46", "addition"), "tags")
    assert ex.prompt == "What is 12 + 34? " + answers.FORMATS["tags"].instruction
    assert (ex.answer, ex.task, ex.fmt) == ("46", "addition", "tags")
    comps = ["12 + 34 = 46.", "<answer>46</answer>", "<answer>45</answer>", "<answer>46</answer>"]
    stopped = [True, True, True, False]
    rows = [ex] * 4
    assert REWARDS["accuracy"](comps, rows, stopped) == [1.0, 1.0, 0.0, 1.0]
    assert REWARDS["format"](comps, rows, stopped) == [0.0, 1.0, 1.0, 0.0]
    assert REWARDS["partial"](comps, rows, stopped) == [1.0, 1.0, 0.5, 1.0]
    # the gated format: only the right answer in tags (the wrapped wrong one gets nothing)
    assert REWARDS["format_if_correct"](comps, rows, stopped) == [0.0, 1.0, 0.0, 0.0]
    total, _ = weighted_reward(comps, rows, resolve_rewards({"accuracy": 1.0, "format": 0.5}),
                               stopped)
    assert total.tolist() == [1.0, 1.5, 0.5, 1.0]
    weights = {"accuracy": 1.0, "format_if_correct": 0.5}
    total, _ = weighted_reward(comps, rows, resolve_rewards(weights), stopped)
    assert total.tolist() == [1.0, 1.5, 0.0, 1.0]
    toy = Example("12+34=", "46", "addition")
    assert render(toy, "raw") is toy                      # the toy's format, untouched
    assert REWARDS["accuracy"](["46", "<answer>46</answer>"], [toy] * 2, [True] * 2) == [1.0, 0.0]


def test_every_toy_family_renders_a_question_and_scores_its_answer():
    for task, wrapped in [("addition", "<answer>{}</answer>"), ("sort", "<answer>{}</answer>"),
                          ("reverse", "<answer>{}</answer>"), ("count", "The count is {}."),
                          ("compare", "<answer>{}</answer>"), ("max", "\\boxed{{{}}}"),
                          ("min", "It is {}")]:
        for ex in render_all(load_eval(task)[:5], "tags"):
            assert ex.prompt.endswith("tags.") and "=" != ex.prompt[-1]
            assert REWARDS["accuracy"]([wrapped.format(ex.answer)], [ex], [True]) == [1.0], ex


def test_word_problems_are_right_and_held_out():
    rng = random.Random(0)
    exs = [make(rng) for _ in range(300)]
    assert {operations(e) for e in exs} == {1, 2, 3}
    for e in exs:
        assert int(e.answer) >= 0 and e.prompt.endswith("?")
    ex = Example("Mia has 12 marbles. She buys 7 more. She gives 5 to a friend. How many "
                 "marbles does Mia have now?", "14", "word_problems")
    assert operations(ex) == 2
    held = eval_examples()
    assert len(held) == 200 and held == eval_examples()                  # seeded
    # the stories this generator makes: check a few by re-reading the numbers
    for e in held[:50]:
        import re
        nums = [int(n) for n in re.findall(r"\d+", e.prompt)]
        if " packs of " not in e.prompt and " shares " not in e.prompt:
            x = nums[0]
            for sentence, n in zip(e.prompt.split(". ")[1:], nums[1:]):
                x = x + n if " more" in sentence else x - n
            assert str(x) == e.answer, e


def test_config_errors_name_the_combination():
    with pytest.raises(ValueError, match="answer_format='tags' .* needs policy='hf'"):
        check_records(TrainConfig(answer_format="tags"))
    with pytest.raises(ValueError, match="task 'countdown' is written for instruct models"):
        check_records(TrainConfig(task="countdown"))
    with pytest.raises(ValueError, match="unknown answer format 'xml'"):
        check_records(TrainConfig(policy="hf", base_checkpoint="data/hf_tiny", answer_format="xml"))
    cfg = TrainConfig(policy="hf", base_checkpoint="data/hf_tiny", answer_format="boxed",
                      task="word_problems,countdown,addition")
    assert cfg.max_new_tokens == 64


@pytest.mark.parametrize("text, value", [
    ("\\boxed{\\frac{3}{4}}", Fraction(3, 4)),
    ("so the answer is $\\dfrac{-1}{2}$", Fraction(-1, 2)),
    ("\\boxed{6 \\times 7}", Fraction(42)),
    ("\\boxed{2 \\cdot 3 \\cdot 4}", Fraction(24)),
    ("It is \u22127.", Fraction(-7)),                       # the Unicode minus sign
    ("It costs $.25 each", Fraction(1, 4)),                # a leading-dot decimal
    ("The answer is 42. That took 3 steps.", Fraction(42)),  # the stated answer, not the last
    ("The final answer is: **17**, from 3 tries", Fraction(17)),
    ("Answer: -5 (checked twice)", Fraction(-5)),
    ("3.25 is the result", Fraction(13, 4)),               # not ".25" out of "3.25"
])
def test_answers_read_the_forms_graders_read(text, value):
    assert answers.as_number(extract(text)) == value


@pytest.mark.parametrize("text, value", [
    ("The answer is 20 + 22 = 42.", Fraction(42)),         # the result, never the first operand
    ("The answer is 2*21 = 42", Fraction(42)),
    ("The answer is $6 \\times 7 = 42$.", Fraction(42)),
    ("The answer is: 1,000 + 24 = 1,024.", Fraction(1024)),
    ("The answer is 20 plus 22, which is 42.", Fraction(42)),
    ("The answer is 12-7=5", Fraction(5)),
    ("The answer is 42 units, which is 2 more than before.", Fraction(42)),   # one number stated
    ("The answer is 2.5.", Fraction(5, 2)),                # a decimal point ends no sentence
    ("The answer is $6 \\times 7$.", Fraction(42)),       # a product, as in a box
    ("The answer is 20 + 22.", None),                      # a sum with no result: no single number
    ("Final Answer: 33 +", None),                          # stated, unfinished: not the 33
    ("The answer is... 42", Fraction(42)),
    ("The answer is 3 + 14. That means the answer should be 15.", Fraction(15)),
    ("the answer is actually \\boxed{}: 121.", Fraction(121)),  # an empty box answers nothing
])
def test_a_stated_expression_reads_as_its_result(text, value):
    assert answers.as_number(extract(text)) == value


LABELS = Path(__file__).resolve().parents[1] / "data" / "answer_labels.jsonl"
KNOWN_MISSES = {          # the corpus rows the reader gets wrong, and why (bench/bench_answer_reader.py)
    "The answer is an explanation of sugar.": "no answer is stated; the last-number rule reads 2",
    "14 / 63 simplifies to 4.\n\nSo the": "'answer:' before a numbered list reads the list's 1",
    "each friend can get is 0.84 x ": "no answer is stated; the last-number rule reads 0.84",
}


def test_the_reader_reads_what_the_hand_labels_say():
    """data/answer_labels.jsonl: every row but the known misses is read as labelled, and each
    known miss is still a miss (a reader that improves updates this list)."""
    rows = [json.loads(line) for line in LABELS.read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 74
    misses = {r["text"] for r in rows
              if answers.as_number(extract(r["text"])) != answers.as_number(r["label"] or "")}
    known = {t for t in misses if any(t.endswith(k) for k in KNOWN_MISSES)}
    assert misses == known and len(known) == len(KNOWN_MISSES), sorted(misses - known)


def test_the_tail_cut_never_splits_a_number_or_hides_a_well_formed_answer():
    long_number = "9" * 5000 + "12345"
    assert answers.tail(long_number) == ""                 # cut inside a number: no partial "345"
    assert answers.last_number("x" * 10_000 + " so 46") == "46"
    reasoning = "Let me think. " * 2000                    # 28,000 characters before the answer
    for text in ("12 + 34 = 46.", "<answer>46</answer>", "\\boxed{46}", "The answer is 46. Done."):
        assert extract(reasoning + text) == extract(text)
    # wrappers are found anywhere, however long the text after them
    assert extract("<answer>46</answer>" + " blah" * 5000) == "46"


HOSTILE = {                              # what a model in a repetition loop writes
    "open tags": "<answer>", "boxes": "\\boxed{", "parentheses": "(", "spaces": " ",
    "braces": "{", "number list": "1,", "newlines": "\n",
}


def _hostile(name: str, n: int) -> list[str]:
    unit = HOSTILE[name]
    body = (unit * (n // len(unit) + 1))[:n]
    texts = [body + "\\boxed{", "<answer>" + body + "</answer>", body, "\\boxed{" + body]
    return texts[:1] if n >= 1_000_000 else texts


def _every_reader(text: str) -> None:
    from grpo_lab.tasks import countdown, instruct  # noqa: F401  (registers the task kinds)
    for task, ans in (("addition", "46"), ("countdown", "3 + 5")):
        for fmt in answers.FORMATS:
            is_correct(text, True, fmt, task, ans)
            is_correct(text, False, fmt, task, ans)
            follows_format(text, True, fmt)
    countdown.verify(countdown.last_expression(text), "3 + 5")
    answers.last_word(text)


@pytest.mark.parametrize("name", sorted(HOSTILE) + ["random"])
def test_every_reader_is_linear_on_hostile_text(name):
    """Before the linear readers: 4,000 characters of repeated \\boxed{ took 0.8 s and the time
    grew ~4x a doubling (1 MB: hours). All readers together (~14 calls) measured 0.01 / 0.03 /
    0.11 / 0.76 s at 1k / 10k / 100k / 1 MB of repeated \\boxed{ on a loaded core; the bounds
    are ~5x that, and a quadratic reader exceeds them by orders of magnitude from 100k on."""
    import random as _random
    import string
    import time
    limits = {1_000: 0.05, 10_000: 0.1, 100_000: 0.5, 1_000_000: 4.0}   # seconds, all readers
    for n, limit in limits.items():
        if name == "random":
            rng = _random.Random(n)
            texts = ["".join(rng.choices(string.printable, k=n))]
        else:
            texts = _hostile(name, n)
        for text in texts:
            best = min(_timed(text, time) for _ in range(1 if n >= 1_000_000 else 3))
            bound = limit + 100 * _linear_pass_s(text, time)     # a busy machine: slow, not red
            assert best < bound, f"{name}, {n:,} characters: {best:.3f} s (bound {bound:.2f} s)"


def _linear_pass_s(text, time) -> float:
    """The calibration: one linear regex scan of the same text, timed now (best of 3). The
    readers' ~14 calls cost about 15-40 such scans; a quadratic reader costs n of them."""
    import re
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        re.findall(r"\d+|\w+|\S", text)
        best = min(best, time.perf_counter() - t0)
    return best


def _timed(text, time):
    t0 = time.perf_counter()
    _every_reader(text)
    return time.perf_counter() - t0


def test_one_extraction_of_16k_hostile_characters_takes_under_50_ms():
    import time
    from grpo_lab.tasks.countdown import last_expression
    for name in sorted(HOSTILE):
        for text in _hostile(name, 16_000):
            for fallback in (answers.final_number, last_expression):
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    extract(text, fallback)
                    best = min(best, time.perf_counter() - t0)
                bound = 0.05 + 20 * _linear_pass_s(text, time)      # 20 scans of it, timed now
                assert best < bound, f"{name}: {best * 1000:.1f} ms (bound {bound * 1000:.0f} ms)"
