"""Instruct answers (answers.py, instruct.py, word_problems.py): extraction on hand-written
completions, the format check, truncation, the rewards, rendering and config errors."""
import random
from fractions import Fraction

import pytest

from grpo_lab.tasks import answers
from grpo_lab.tasks.answers import extract, follows_format, is_correct
from grpo_lab.training.config import TrainConfig
from grpo_lab.tasks.instruct import render, render_all
from grpo_lab.tasks import REWARDS, Example, load_eval, weighted_reward
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
    total, _ = weighted_reward(comps, rows, {"accuracy": 1.0, "format": 0.5}, stopped)
    assert total.tolist() == [1.0, 1.5, 0.5, 1.0]
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
        TrainConfig(answer_format="tags")
    with pytest.raises(ValueError, match="task 'countdown' is written for instruct models"):
        TrainConfig(task="countdown")
    with pytest.raises(ValueError, match="unknown answer format 'xml'"):
        TrainConfig(policy="hf", base_checkpoint="data/hf_tiny", answer_format="xml")
    cfg = TrainConfig(policy="hf", base_checkpoint="data/hf_tiny", answer_format="boxed",
                      task="word_problems,countdown,addition")
    assert cfg.max_new_tokens == 64
