"""Countdown: reach a target number with the given numbers and + - * /, verified by a parser.

The task of TinyZero (Pan et al. 2025) and the Countdown-Tasks sets: "Using the numbers 3, 5
and 8, each exactly once, with + - * / and parentheses, make 64" -> ``(3 + 5) * 8``. Many
expressions are right, so the reward cannot compare strings: ``verify`` parses the model's
expression with a small recursive-descent parser, evaluates it in exact fractions and checks
that it uses exactly the given numbers and equals the target. Python's ``eval`` is never
used: a completion is untrusted text.

The parser's grammar (integers only; no unary minus, no powers, no names):

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"

Limits keep hostile text cheap: at most ``MAX_CHARS`` characters, ``MAX_DEPTH`` nested
parentheses, integers of at most ``MAX_DIGITS`` digits (so ``9...9`` with a thousand digits
is refused before any arithmetic), and a division by zero makes the expression invalid.
"x" and "×" read as "*", "÷" as "/".

A reference solution is stored as the example's answer (it uses every number once), so the
numbers and the target are read back from it: no extra fields, the held-out set is the
usual JSONL of prompt, answer, task.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from fractions import Fraction

from grpo_lab.tasks.answers import AnswerKind, tail
from grpo_lab.tasks import Example, distinct_examples, register_task

MAX_CHARS, MAX_DEPTH, MAX_DIGITS = 200, 16, 6
TOKEN = re.compile(r"\s*(\d+|[-+*/()])")
SYNONYMS = str.maketrans({"x": "*", "×": "*", "÷": "/", "−": "-"})


class ExpressionError(ValueError):
    """The text is not an expression this parser accepts (the message says why)."""


def tokenize(text: str) -> list[str]:
    text = text.translate(SYNONYMS).strip()
    if len(text) > MAX_CHARS and len("".join(text.split())) > MAX_CHARS:
        raise ExpressionError(f"expression longer than {MAX_CHARS} characters (spaces not counted)")
    out, pos = [], 0
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if m is None:
            pos += len(text[pos:]) - len(text[pos:].lstrip())              # past the spaces
            raise ExpressionError(f"unexpected character {text[pos]!r} at {pos}")
        tok = m.group(1)
        if tok.isdigit() and len(tok) > MAX_DIGITS:
            raise ExpressionError(f"number {tok[:12]}... has more than {MAX_DIGITS} digits")
        out.append(tok)
        pos = m.end()
    if not out:
        raise ExpressionError("empty expression")
    return out


def evaluate(text: str) -> tuple[Fraction, list[int]]:
    """Parse and evaluate -> (exact value, the integers used, in order); ExpressionError on
    anything outside the grammar, too deep, too long, or a division by zero."""
    toks, i = tokenize(text), 0
    numbers: list[int] = []

    def peek():
        return toks[i] if i < len(toks) else None

    def take():
        nonlocal i
        i += 1
        return toks[i - 1]

    def expr(depth):
        v = term(depth)
        while peek() in ("+", "-"):
            v = v + term(depth) if take() == "+" else v - term(depth)
        return v

    def term(depth):
        v = factor(depth)
        while peek() in ("*", "/"):
            op, w = take(), factor(depth)
            if op == "/" and w == 0:
                raise ExpressionError("division by zero")
            v = v * w if op == "*" else v / w
        return v

    def factor(depth):
        tok = peek()
        if tok is None:
            raise ExpressionError("expression ends early")
        if tok == "(":
            if depth >= MAX_DEPTH:
                raise ExpressionError(f"more than {MAX_DEPTH} nested parentheses")
            take()
            v = expr(depth + 1)
            if peek() != ")":
                raise ExpressionError("unclosed parenthesis")
            take()
            return v
        if tok.isdigit():
            numbers.append(int(take()))
            return Fraction(numbers[-1])
        raise ExpressionError(f"unexpected {tok!r}")

    value = expr(0)
    if i != len(toks):
        raise ExpressionError(f"unexpected {toks[i]!r} after the expression")
    return value, numbers


def verify(expression: str | None, solution: str) -> bool:
    """``expression`` uses exactly the numbers of ``solution`` (each once) and has its value."""
    if expression is None:
        return False
    want, want_numbers = evaluate(solution)
    try:
        got, numbers = evaluate(expression)
    except ExpressionError:
        return False
    return Counter(numbers) == Counter(want_numbers) and got == want


EXPRESSION = re.compile(r"[\d\s+\-*/×÷()]+")
OPERATION = re.compile(r"\d\s*[-+*/×÷]\s*[\d(]")


def last_expression(text: str) -> str | None:
    """The last run of expression characters holding an operator ("so (3+5)*8 = 64" ->
    "(3+5)*8"), or None: what a model wrote when it used no wrapper. Linear in the text: each
    maximal run is matched once (no backtracking: 10,000 spaces or parentheses cost
    microseconds), and only the last ``answers.TAIL_CHARS`` characters are read."""
    for run in reversed(EXPRESSION.findall(tail(text))):
        if OPERATION.search(run):
            return run.strip()
    return None


def numbers_and_target(solution: str) -> tuple[list[int], int]:
    value, numbers = evaluate(solution)
    return numbers, int(value)


def make(rng: random.Random, n_numbers: tuple[int, int] = (3, 4)) -> Example:
    """A target reachable from 3 or 4 numbers 1-25: a random expression tree over them whose
    value is a whole number in 1..200 (redrawn otherwise)."""
    while True:
        nums = [rng.randint(1, 25) for _ in range(rng.randint(*n_numbers))]
        parts = [str(n) for n in nums]
        while len(parts) > 1:                          # join two random parts with an op
            a, b = rng.sample(range(len(parts)), 2)
            op = rng.choice("+-*/")
            joined = f"({parts[a]} {op} {parts[b]})"
            parts = [p for k, p in enumerate(parts) if k not in (a, b)] + [joined]
        solution = parts[0][1:-1]
        try:
            value, _ = evaluate(solution)
        except ExpressionError:
            continue
        if value.denominator == 1 and 1 <= value <= 200:
            break
    shown = sorted(nums)
    prompt = (f"Using the numbers {', '.join(map(str, shown[:-1]))} and {shown[-1]}, each "
              f"exactly once, with + - * / and parentheses, write an expression that equals "
              f"{int(value)}.")
    return Example(prompt, solution, "countdown", fields={"numbers": shown, "target": int(value)})


def eval_examples(n: int = 200, seed: int = 4321) -> list[Example]:
    """The held-out set: ``n`` distinct seeded puzzles (the same list on every call)."""
    return distinct_examples(make, n, random.Random(f"countdown-eval-{seed}"))


register_task("countdown", make, "0123456789+-*/() ", 40, eval_fn=eval_examples,
              description="reach a target with 3-4 numbers and + - * / (instruct formats only)",
              alphabet=None, answer_kind=AnswerKind("expression", last_expression, verify))
