"""Countdown's verifier: a parser, never eval; valid, invalid, wrong numbers, hostile input."""
import random
from fractions import Fraction

import pytest

from grpo_lab.tasks import countdown
from grpo_lab.tasks.countdown import ExpressionError, evaluate, last_expression, verify
from grpo_lab.tasks.rewards import REWARDS
from grpo_lab.tasks import Example
from grpo_lab.tasks.instruct import render

SOLUTION = "(3 + 5) * 8"          # numbers 3, 5, 8; target 64


def test_evaluate_by_hand():
    assert evaluate("(3 + 5) * 8") == (Fraction(64), [3, 5, 8])
    assert evaluate("8 - 5 - 3") == (Fraction(0), [8, 5, 3])              # left to right
    assert evaluate("2 + 3 * 4") == (Fraction(14), [2, 3, 4])             # precedence
    assert evaluate("7 / 2 * 2") == (Fraction(7), [7, 2, 2])              # exact fractions
    assert evaluate("3 × 4 ÷ 2")[0] == 6


@pytest.mark.parametrize("expr, ok", [
    ("(3+5)*8", True), ("8*(5+3)", True), ("8 * (3 + 5)", True),
    ("3+5*8", False),                 # right numbers, wrong value
    ("(3+5)*8*1", False),             # a number that was not given
    ("(3+3)*8", False),               # a number used twice, one missing
    ("64", False), ("8*8", False),    # not the given numbers
    ("(3+5)*", False), ("((3+5)*8", False), ("3+5)*8", False),
    ("", False), (None, False), ("import os", False), ("__import__('os')", False),
    ("3**5", False), ("-3+5*8", False),
])
def test_verify_valid_invalid_and_wrong_numbers(expr, ok):
    assert verify(expr, SOLUTION) is ok


def test_hostile_inputs_are_refused_cheaply():
    deep = "(" * 5000 + "3" + ")" * 5000
    assert not verify(deep, "3")
    with pytest.raises(ExpressionError, match="longer than"):
        evaluate(deep)
    with pytest.raises(ExpressionError, match="nested parentheses"):
        evaluate("(" * 17 + "3" + ")" * 17)
    assert evaluate("(" * 16 + "3" + ")" * 16)[0] == 3
    with pytest.raises(ExpressionError, match="more than 6 digits"):
        evaluate("9" * 100 + "*9")                        # no big-number arithmetic
    with pytest.raises(ExpressionError, match="longer than"):
        evaluate("9" * 1000 + "*9")
    with pytest.raises(ExpressionError, match="division by zero"):
        evaluate("8 / (5 - 5)")
    assert not verify("8 / (3 - 3) * 5", "(3 + 5) * 8")
    assert not verify("9*9*9*9*9*9*9*9", SOLUTION)         # big but finite: just wrong


def test_reading_an_expression_from_free_text():
    assert last_expression("I think (3+5)*8 = 64") == "(3+5)*8"
    assert last_expression("no maths") is None
    ex = render(Example("Using the numbers 3, 5 and 8 ... equals 64.", SOLUTION, "countdown"),
                "tags")
    comps = ["<answer>8 * (3 + 5)</answer>", "So (3+5)*8 = 64", "<answer>64</answer>"]
    assert REWARDS["accuracy"](comps, [ex] * 3, [True] * 3) == [1.0, 1.0, 0.0]
    assert REWARDS["format"](comps, [ex] * 3, [True] * 3) == [1.0, 0.0, 1.0]


def test_generated_puzzles_are_solvable_by_their_stored_solution():
    rng = random.Random(0)
    for _ in range(200):
        ex = countdown.make(rng)
        numbers, target = countdown.numbers_and_target(ex.answer)
        assert 3 <= len(numbers) <= 4 and 1 <= target <= 200
        assert f"equals {target}." in ex.prompt
        assert all(str(n) in ex.prompt for n in numbers)
        assert verify(ex.answer, ex.answer)
    held = countdown.eval_examples()
    assert len(held) == 200 == len({e.prompt for e in held}) and held == countdown.eval_examples()


@pytest.mark.parametrize("expr, said", [("3#4", "'#' at 1"), ("3 # 4", "'#' at 2"),
                                        ("  3 +   @", "'@' at 6")])
def test_a_stray_character_is_named_not_the_space_before_it(expr, said):
    with pytest.raises(ExpressionError, match=f"unexpected character {said}$"):
        evaluate(expr)
