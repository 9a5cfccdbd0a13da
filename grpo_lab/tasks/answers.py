"""Answers of instruct models: find the answer in free text, and check the requested format.

A chat model asked "What is 17 + 25?" answers with a sentence (``17 + 25 = 42.``), not with
the toy's bare ``42<eos>``. An exact-match reward scores every such answer 0, every group
then has equal rewards and GRPO gets no gradient. So two things are kept apart, as in
DeepSeek-R1's rule-based rewards (Guo et al. 2025, sec. 2.2.2: an accuracy reward and a
format reward) and the GSM8K/MATH graders (last number; ``\\boxed{}``):

  * **the answer** (``extract``): the content of the last ``<answer>...</answer>`` pair, else
    of the last ``\\boxed{...}``, else the value stated after the last "answer is", else the
    last number in the text (or, for a text answer, the last word). Accuracy means the answer
    is right whatever wraps it. A stated answer is read to the end of its sentence and its
    value is the result of what is stated: "The answer is 20 + 22 = 42." states 42 (after the
    last ``=``, ``\\approx`` or "is"), never the first operand 20; a stated expression with
    no result ("The answer is 20 + 22.") is read whole, and ``as_number`` gives it a value
    only where it gives a wrapped one (a product ``6 \\times 7``; a sum is no single number).
  * **the format** (``FORMATS[name].follows``): whether the completion used the format the
    prompt asked for (``tags``: ends with one ``<answer>42</answer>``; ``boxed``: ends with
    one ``\\boxed{42}``; ``number``: is just the number).

Every reader is linear in the text (a model caught in a repetition loop writes 10,000-100,000
characters of ``<answer>`` or ``\\boxed{``; a quadratic scan then takes minutes a step): the
wrappers are found by ``rfind`` and one pass of brace matching, and the unwrapped readers look
at the last ``TAIL_CHARS`` characters only.

A completion cut at ``max_new_tokens`` (``stopped`` False) is flagged, and its answer counts
only when the format says so (``AnswerFormat.counts_truncated``): a closed ``<answer>`` tag
or ``\\boxed{}`` is a finished answer even if the model kept talking after it; the last
number of a cut-off text is only where the model happened to stop, so it counts 0. The
format reward always needs a completion that stopped.

Deviations: numbers compare by value (``42``, ``42.0`` and ``1,000`` vs ``1000`` are equal;
fractions like ``3/4`` and ``\\frac{3}{4}``, products like ``6 \\times 7``, ``.25`` and the
Unicode minus are read exactly), not as strings; a sign belongs to a number only when
no word character precedes it (``12-7`` has the numbers 12 and 7, `` -7`` has -7).
This module imports nothing from grpo_lab: tasks.py's rewards call it for instruct examples.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

from grpo_lab.registry import lookup

MAX_ANSWER_CHARS = 64          # longer "answers" are not answers (and parsing stays cheap)
TAIL_CHARS = 4096
"""The unwrapped readers (``last_number``, ``last_word``, ``final_number``) look at the last
``TAIL_CHARS`` characters only: a completion that ends its answer with no wrapper states it at
its end, and 4,096 characters is ~1,000 tokens of text after the answer. The wrappers (tags,
``\\boxed{}``) are found in the whole text, each by one linear pass."""
OPEN_TAG, CLOSE_TAG, BOX = "<answer>", "</answer>", "\\boxed{"
MINUS = "\u2212"                                       # the Unicode minus sign, read as "-"
NUMBER = re.compile(r"(?<![\w.])[-\u2212]?(?:\d+(?:,\d{3}(?!\d))*(?:\.\d+)?|\.\d+)(?:/\d+)?")
# a comma group is three digits and no more: "12,3456" is no 12,345 cut out of a digit run
WORD = re.compile(r"[^\s.,;:!?\"'`()\[\]{}$]+")
STATED = re.compile(r"answer\s*(?:(?:is|should be|would be|will be)\s*:?|:|=)\s*[*$\s,]*"
                    r"(?=[-\u2212.\d])", re.I)
FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([-\u2212]?\d+)\s*\}\s*\{\s*(\d+)\s*\}")
PRODUCT = re.compile(r"\s*(-?\d+(?:\.\d+)?)((?:\s*(?:\\times|\\cdot|×)\s*-?\d+(?:\.\d+)?)+)\s*")
OPERATOR = re.compile(r"\s*(?:[-+*/×÷·\u2212]|\\times|\\cdot|\\div|\b(?:plus|minus|times|"
                      r"multiplied by|divided by)\b)\s*")
RESULT = re.compile(r"=|≈|\\approx|\b(?:is|equals)\b")   # what follows states the result
LEAD = re.compile(r"[\s*$\\(\[{]*")                 # markup between "is" and the value
SENTENCE_END = re.compile(r"\n|[.!?;](?=\s|$)")   # "42." ends a sentence, "4.2" does not


def tail(text: str, chars: int = TAIL_CHARS) -> str:
    """The last ``chars`` characters of ``text``, less a token the cut went through (so
    "...12345" cut inside the number does not read as "345")."""
    if len(text) <= chars:
        return text
    cut = len(text) - chars
    while cut < len(text) and (text[cut - 1].isalnum() or text[cut - 1] in ".,/_"):
        cut += 1
    return text[cut:]


def _unwrapped(text: str) -> str:
    """The tail an unwrapped reader reads, its LaTeX fractions written as ``a/b``."""
    return FRAC.sub(r"\1/\2", tail(text))


def tagged(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` pair (stripped), or None: the last closing
    tag and the opening tag nearest before it (two ``rfind``: linear, whatever the text)."""
    end = text.rfind(CLOSE_TAG)
    start = text.rfind(OPEN_TAG, 0, max(end, 0))
    return text[start + len(OPEN_TAG):end].strip() if end >= 0 and start >= 0 else None


def boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with its braces matched (``\\boxed{\\frac{1}{2}}``
    -> ``\\frac{1}{2}``), or None when there is none or none closes (an unclosed box yields to
    the closed one before it).

    Linear: with ``depth`` the running count of ``{`` minus ``}``, the ``{`` at ``i`` closes at
    the first ``j > i`` where ``depth[j] = depth[i] - 1``; it closes at all iff the least depth
    after ``i`` is below ``depth[i]``. One cumulative sum and one suffix minimum answer that for
    every box at once (numpy), instead of a scan from each box to the end."""
    if BOX not in text:
        return None
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    depth = np.cumsum((codes == ord("{")).astype(np.int32) - (codes == ord("}")))   # (n,)
    after = np.minimum.accumulate(depth[::-1])[::-1]        # after[k] = min(depth[k:])
    n, k = len(codes), len(BOX)
    starts = np.ones(n - k + 1, dtype=bool)                  # where "\\boxed{" starts
    for c, ch in enumerate(BOX):
        starts &= codes[c:n - k + 1 + c] == ord(ch)
    opens = np.flatnonzero(starts) + k - 1                   # each box's '{'
    opens = opens[opens + 1 < n]
    closed = opens[after[opens + 1] < depth[opens]]
    if not len(closed):
        return None
    i = int(closed[-1])                                     # the last box that closes
    j = i + 1 + int(np.argmax(depth[i + 1:] < depth[i]))
    return text[i + 1:j].strip()


def last_number(text: str) -> str | None:
    """The last number in ``text`` ("17 + 25 = 42." -> "42"; "-7" -> "-7"; ".25"; "−7" with
    the Unicode minus), or None; reads the last ``TAIL_CHARS`` characters."""
    return _last_number(_unwrapped(text))


def _last_number(unwrapped: str) -> str | None:
    found = NUMBER.findall(unwrapped)
    return found[-1] if found else None


def _stated_number(unwrapped: str) -> str | None:
    """The value stated after the last "answer is" / "answer:" in ``unwrapped`` (``_unwrapped``'s
    tail), read to the end of its sentence: the result after its last ``=`` / "is" ("The
    answer is 42. That took 3 steps." -> "42"; "The answer is 20 + 22 = 42." -> "42"), else
    the number or expression it starts with ("The answer is $6 \\times 7$." -> "6 \\times 7");
    ``""`` when the statement is unfinished ("the answer is 33 +"); None when it states none."""
    last = None
    for last in STATED.finditer(unwrapped):
        pass
    if last is None:
        return None
    end = SENTENCE_END.search(unwrapped, last.end())
    sentence = unwrapped[last.end():end.start() if end else len(unwrapped)]
    start = LEAD.match(sentence).end()
    stated, dangling = _expression(sentence, start)
    if stated is None:                            # "the answer is... 42": no value stated here
        return None
    if dangling:                                  # "Final answer: 33 +": stated, unfinished
        return ""
    if not OPERATOR.search(stated):               # one number: "42 units, which is ..." -> 42
        return stated
    # an expression: its value is its result, after the last "=" / "is" / "equals" with a
    # number after it ("20 + 22 = 42" -> 42); with none, the expression itself (as_number
    # reads a product; a sum is no single number)
    for mark in reversed(list(RESULT.finditer(sentence, start + len(stated)))):
        result, _ = _expression(sentence, LEAD.match(sentence, mark.end()).end())
        if result is not None:
            return result
    return stated


def _expression(text: str, start: int) -> tuple[str | None, bool]:
    """The number or arithmetic expression at ``text[start:]`` (``"42$."`` -> ``"42"``,
    ``"6 \\times 7 = 42"`` -> ``"6 \\times 7"``; None when neither starts there), and whether
    an operator dangles after it at the end of ``text`` (``"33 +"``)."""
    found = NUMBER.match(text, start)
    if found is None:
        return None, False
    end = found.end()
    while (op := OPERATOR.match(text, end)) and (operand := NUMBER.match(text, op.end())):
        end = operand.end()
    op = OPERATOR.match(text, end)
    return text[start:end], bool(op) and not text[op.end():].strip()


def final_number(text: str) -> str | None:
    """The stated answer ("the answer is 42"), else the last number: how a grader reads an
    answer given without a wrapper (the tail cut and its fractions rewritten once for both).
    An answer stated but unfinished ("Final answer: 33 +", a text cut at the length limit)
    reads as ``""``, no number, not as the last number before it."""
    unwrapped = _unwrapped(text)
    s = _stated_number(unwrapped)
    return s if s is not None else _last_number(unwrapped)


def last_word(text: str) -> str | None:
    """The last run of characters without spaces or punctuation around it, or None."""
    found = WORD.findall(tail(text))
    return found[-1] if found else None


def wrapped(text: str) -> str | None:
    """The answer inside a wrapper the model closed: the tags, else ``\\boxed{}``."""
    t = tagged(text)
    return t if t is not None else boxed(text)


def extract(text: str, fallback: Callable[[str], str | None] = final_number) -> str | None:
    """The answer in ``text``: tags, else boxed, else ``fallback(text)`` (the stated answer or
    the last number; a family may read the last word or expression instead) -> string, or None."""
    w = wrapped(text)
    return w if w else fallback(text)             # an empty box or tag pair answers nothing


def as_number(text: str | None) -> Fraction | None:
    """``"42"``, ``"-7"``, ``"−7"``, ``"1,000"``, ``"2.50"``, ``".25"``, ``"3/4"``,
    ``"\\frac{3}{4}"`` (and ``\\dfrac``, ``\\tfrac``), a product ``"6 \\times 7"`` (or
    ``\\cdot``, ``×``), and one number with words around it (``"$42."``) -> exact Fraction;
    None when there is no single number."""
    if text is None or len(text) > MAX_ANSWER_CHARS:
        return None
    text = FRAC.sub(r"\1/\2", text).replace(MINUS, "-")
    product = PRODUCT.fullmatch(text.strip(" $.\\()[]"))
    if product:
        value = Fraction(product.group(1))
        for factor in re.findall(r"-?\d+(?:\.\d+)?", product.group(2)):
            value *= Fraction(factor)
        return value
    found = NUMBER.findall(text)
    if len(found) != 1:
        return None
    try:
        return Fraction(found[0].replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def same_number(got: str | None, want: str) -> bool:
    a, b = as_number(got), as_number(want)
    return a is not None and a == b


def same_text(got: str | None, want: str) -> bool:
    """Text answers ("0123", "cba", "<"): equal once spaces and surrounding quotes go."""
    return got is not None and "".join(got.split()).strip("\"'`") == "".join(want.split())


@dataclass(frozen=True)
class AnswerFormat:
    """How an instruct prompt asks for its answer and how a completion is held to it."""
    name: str
    instruction: str                     # appended to the question
    follows: Callable[[str], bool]       # the completion (stripped) used this format
    counts_truncated: bool               # a completion cut at max_new_tokens may still be right
    description: str = ""


def _follows_tags(text: str) -> bool:
    t = text.strip()
    return (t.count("<answer>") == 1 and t.count("</answer>") == 1 and t.endswith("</answer>")
            and 0 < len(tagged(t) or "") <= MAX_ANSWER_CHARS)


def _follows_boxed(text: str) -> bool:
    t = text.strip().rstrip(".$ \n")
    return (t.count("\\boxed{") == 1 and 0 < len(boxed(t) or "") <= MAX_ANSWER_CHARS
            and t.endswith("}"))


def _follows_number(text: str) -> bool:
    t = text.strip().rstrip(".")
    return 0 < len(t) <= MAX_ANSWER_CHARS and NUMBER.fullmatch(t) is not None


FORMATS: dict[str, AnswerFormat] = {
    "tags": AnswerFormat("tags", "Put the final answer in <answer></answer> tags.",
                         _follows_tags, True, "ends with <answer>42</answer>"),
    "boxed": AnswerFormat("boxed", "Put the final answer in \\boxed{}.", _follows_boxed, True,
                          "ends with \\boxed{42}"),
    "number": AnswerFormat("number", "Answer with the number only.", _follows_number, False,
                           "the number alone"),
}
"""Answer formats an instruct prompt can ask for (TrainConfig.answer_format); "raw" is the
toy's own (``"12+34="`` -> ``"46<eos>"``, exact match) and is not in this table."""


def get_format(name: str) -> AnswerFormat:
    return lookup(FORMATS, name, "answer format")


def register_format(fmt: AnswerFormat) -> AnswerFormat:
    """Add an answer format (``TrainConfig.answer_format`` can then name it) -> the record;
    the same ``follows`` function again (a re-run cell) replaces it, another under a taken
    name is an error (registry.check_new)."""
    from grpo_lab.registry import check_new
    if not isinstance(fmt, AnswerFormat):
        raise ValueError(f"register_format takes an answers.AnswerFormat, got {fmt!r}")
    if fmt.name == "raw":
        raise ValueError("answer format 'raw' is the toy's own: pick another name")
    check_new(FORMATS, "answer format", fmt.name, fmt.follows, lambda f: f.follows)
    FORMATS[fmt.name] = fmt
    return fmt


@dataclass(frozen=True)
class AnswerKind:
    """How a family's answers are read from free text and compared with the reference."""
    name: str
    read: Callable[[str], str | None]          # the fallback when no wrapper was closed
    same: Callable[[str | None, str], bool]    # (answer read, reference answer) -> right?


KINDS: dict[str, AnswerKind] = {
    "number": AnswerKind("number", final_number, same_number),
    "text": AnswerKind("text", last_word, same_text),
}
TASK_KINDS: dict[str, AnswerKind] = {}
"""Task name -> the kind of its answers; filled by the modules that define instruct prompts
(instruct.py for the toy families, word_problems.py, countdown.py)."""


def register_kind(task: str, kind: AnswerKind) -> None:
    TASK_KINDS[task] = kind


def kind_of(task: str) -> AnswerKind:
    return lookup(TASK_KINDS, task, "instruct task",
                  "answers.register_kind gives a task its answer kind")


def is_correct(completion: str, stopped: bool, fmt: str, task: str, answer: str) -> bool:
    """The completion's answer is the reference ``answer`` by the task's comparison (same
    number, same text, a valid Countdown expression), whatever wraps it; a completion cut
    at the length limit counts only through a closed wrapper, and only when the format
    counts truncated answers."""
    kind = kind_of(task)
    if not stopped:
        return get_format(fmt).counts_truncated and kind.same(wrapped(completion), answer)
    return kind.same(extract(completion, kind.read), answer)


def follows_format(completion: str, stopped: bool, fmt: str) -> bool:
    """The completion stopped and used the requested format."""
    return bool(stopped) and get_format(fmt).follows(completion)
