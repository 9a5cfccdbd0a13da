"""The calculator: arithmetic an instruct model cannot do in its head, with a tool it can reach.

``calculator``: "What is 964 times 59?" (a 3-digit number times a 2-digit one, asked in
words). SmolLM2-135M-Instruct gets about none of these right on its own (measured:
bench/RESULTS_calculator.md). The call syntax is one the model already writes: an
arithmetic expression closed by ``=`` (``964 * 59 =``). ``AgentSettings.stop`` "=" ends the
action at the first token holding "=", the environment computes the expression before it and
its result is forced into the sequence as the observation (`` 56876``), as nanochat's
``Engine`` forces its calculator's output; the model then goes on and ends its answer with
<eos>. Why not a tag: asked with a system prompt that describes ``<calc>EXPR</calc>`` and
shows one example, the base wrote the tag in 0 of 64 samples, and an expression closed by
"=" in 4-7 of 64 (scratch probe, temperature 1): a reward that never fires teaches nothing.

Episode: every action holding "=" is a call (the stop makes "=" the action's last token);
its observation is the result, or ``error: ...`` for what is not a calculation (``x =``,
words, a division by zero); the episode goes on. An action ended by <eos> is the answer: the
reward is 1 when the answer reader (``tasks.answers.extract``: a stated answer, else the last
number) finds the right product in the episode's whole text (the actions and the tool's
results, what a reader of the reply sees), else 0; the episode ends. An episode cut by turns
or tokens gets 0. The state key is the number of calls made (GiGPO's anchor states).

``metrics()`` reports the calls and the well-formed ones (``environments.tool_metrics``:
the call rate and the well-formed share the step logs as ``tool/...``).

``calculator_plain``: the same questions with no tool (every action is the answer, "="
stops nothing): the base's accuracy without the calculator.

Held out: ``HELD_OUT`` = 100 questions drawn from a fixed seed, never drawn for training.
"""
from __future__ import annotations

import ast
import operator
import random
import re
from fractions import Fraction

from grpo_lab.agents.environments import AgentSettings, register_environment
from grpo_lab.tasks import Example, distinct_examples
from grpo_lab.tasks.answers import extract, same_number

HELD_OUT = 100
MAX_EXPRESSION_CHARS = 80
CALL = "="

WORDS = (                                       # how the model writes an operation -> Python's
    (re.compile(r"\\times|\\cdot|[×·]|\bmultiplied by\b|\btimes\b", re.I), "*"),
    (re.compile(r"(?<=\d)\s*[xX]\s*(?=\d)"), "*"),
    (re.compile(r"\\div|÷|\bdivided by\b|\bover\b", re.I), "/"),
    (re.compile(r"\bplus\b", re.I), "+"),
    (re.compile(r"\bminus\b|\u2212", re.I), "-"),
    (re.compile(r"(?<=\d),(?=\d{3}\b)"), ""),   # 1,234 -> 1234
)
TRAILING = re.compile(r"[0-9.+\-*/()\s]*$")    # the expression: what is left before "="
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.Div: operator.truediv}


def _value(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("not a calculation")


def calculate(action: str) -> str:
    """The text before the last "=" of ``action`` -> its value as text, or ``"error: ..."``
    (never raises). Reads ``964 * 59``, ``964 x 59``, ``964 × 59``, ``964 \\times 59``,
    ``964 times 59``, ``(12 + 3) / 5``; needs one operation at least (a lone number is not a
    calculation); a result that is not whole is written with up to 6 decimals. The error
    texts hold no digits (the answer reader reads numbers)."""
    head = action.rpartition(CALL)[0] if CALL in action else action
    for pattern, op in WORDS:
        head = pattern.sub(op, head)
    expr = TRAILING.search(head).group(0).strip().lstrip("*/+)").strip()
    while expr.count("(") > expr.count(")") and expr.startswith("("):
        expr = expr[1:].strip()                  # "(as in (12 * 3 =": the unclosed opening
    if not re.search(r"\d", expr):
        return "error: no expression before the equals sign"
    if len(expr) > MAX_EXPRESSION_CHARS:
        return "error: expression too long"
    tree = None                                  # the longest tail that parses ("1. 2 * 3")
    for start in [0] + [m.end() for m in re.finditer(r"\s+", expr)]:
        try:
            tree = ast.parse(expr[start:], mode="eval").body
            break
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    if not isinstance(tree, ast.BinOp):
        return "error: not a calculation"
    try:
        value = _value(tree)
    except ZeroDivisionError:
        return "error: division by zero"
    except (ValueError, TypeError, RecursionError, MemoryError, OverflowError):
        return "error: not a calculation"
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


class Calculator:
    """One episode with the calculator (module docstring)."""
    calls_tool = True                           # False: every action is the answer

    def reset(self, example: Example, seed: int) -> str:
        self.example, self.text, self.calls, self.well_formed = example, "", 0, 0
        return ""

    def step(self, action: str):
        self.text += (" " if self.text else "") + action      # actions come stripped
        if self.calls_tool and CALL in action:
            self.calls += 1
            result = calculate(action)
            self.well_formed += not result.startswith("error:")
            obs = " " + result
            self.text += obs
            return obs, 0.0, False
        return "", float(same_number(extract(self.text), self.example.answer)), True

    def state_key(self):
        return self.calls

    def metrics(self) -> dict:
        return {"calls": self.calls, "well_formed": self.well_formed}


class PlainAnswer(Calculator):
    """The same question without the tool: the first action is the answer."""
    calls_tool = False


def _question(rng: random.Random, task: str) -> Example:
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    return Example(f"What is {a} times {b}?", str(a * b), task, fields={"a": a, "b": b})


def calculator_examples(rng: random.Random) -> Example:
    """A 3-digit number times a 2-digit one, asked in words; the calculator answers "... =" ."""
    return _question(rng, "calculator")


def calculator_plain_examples(rng: random.Random) -> Example:
    """The calculator's questions with no tool."""
    return _question(rng, "calculator_plain")


def held_out(task: str) -> list[Example]:
    """``HELD_OUT`` distinct questions from the seed "calculator-held-out" (both tasks: the
    same questions)."""
    return distinct_examples(lambda rng: _question(rng, task), HELD_OUT,
                             random.Random("calculator-held-out"))


TOOL = AgentSettings(max_turns=3, max_action_tokens=64, max_observation_tokens=12, stop=CALL)
"""Three turns (a call, the answer, one spare), 64 tokens an action: SmolLM2 writes a
sentence of preamble before ``964 * 59 =`` and one after the result."""

register_environment("calculator", Calculator, calculator_examples, TOOL,
                     description="3-digit x 2-digit products asked in words, with a calculator "
                                 "called by writing the expression and '='",
                     answer_chars="0123456789", max_answer_len=6, alphabet=None,
                     answer_kind="number", eval_fn=lambda: held_out("calculator"))
register_environment("calculator_plain", PlainAnswer, calculator_plain_examples,
                     AgentSettings(max_turns=1, max_action_tokens=128, max_observation_tokens=1),
                     description="the calculator's questions without the tool",
                     answer_chars="0123456789", max_answer_len=6, alphabet=None,
                     answer_kind="number", eval_fn=lambda: held_out("calculator_plain"))
