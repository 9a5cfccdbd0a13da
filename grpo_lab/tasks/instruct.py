"""Prompts for instruct (chat) models: each task family asked in words, with an answer format.

The toy policy reads ``"12+34="`` and writes ``"46<eos>"``. A chat model reads a question
and writes a sentence, so for ``TrainConfig.answer_format`` other than "raw" every example is
rendered before sampling (``render``): the family's question in words (``QUESTIONS``) plus
the format's instruction (``answers.FORMATS``: ``<answer>42</answer>``, ``\\boxed{42}`` or the
number alone). The rendered ``Example`` keeps the reference answer and the task, and carries
the format (``Example.fmt``), so tasks.py's rewards score it the instruct way: accuracy is
the right answer whatever wraps it (answers.py), ``format`` is whether the requested format
was used. The chat template and the optional system prompt are the policy's (hf.py).

    addition       "12+34="       -> "What is 12 + 34? Put the final answer in <answer></answer> tags."
    word_problems  a story (word_problems.py), countdown  a puzzle (countdown.py): their
                   prompts are already words (``Task.alphabet`` None, as for any task
                   registered with alphabet=None); they have no "raw" (toy) form.

The rendered example keeps the task's own prompt in ``Example.raw_prompt`` (and its values in
``Example.fields``): a grouper reads both from ``grouping.PromptBatch``.

``answer_format="raw"`` renders nothing: the toy's format, bit for bit.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from grpo_lab.tasks import countdown, word_problems  # noqa: F401  (they register their families)
from grpo_lab.tasks.answers import FORMATS, KINDS, get_format, register_kind
from grpo_lab.registry import lookup
from grpo_lab.tasks import Example, in_words

RAW = "raw"


def _numbers(prompt: str) -> list[str]:
    return prompt.split(":", 1)[-1].rstrip("=").split(",")


def _addition(p: str) -> str:
    a, b = p.rstrip("=").split("+")
    return f"What is {a} + {b}?"


def _count(p: str) -> str:
    letter, word = _numbers(p)
    return f"How many times does the letter '{letter}' occur in the word '{word}'?"


QUESTIONS: dict[str, Callable[[str], str]] = {
    "addition": _addition,
    "sort": lambda p: (f"Sort the digits {_numbers(p)[0]} in ascending order and write them "
                       f"as one string of digits."),
    "reverse": lambda p: f"Write the letters '{_numbers(p)[0]}' in reverse order.",
    "count": _count,
    "compare": lambda p: (f"Compare {' and '.join(_numbers(p))}: answer '<' if the first is "
                          f"smaller, '>' if it is larger, '=' if they are equal."),
    "max": lambda p: f"What is the largest of the numbers {', '.join(_numbers(p))}?",
    "min": lambda p: f"What is the smallest of the numbers {', '.join(_numbers(p))}?",
}
"""Toy family -> its question in words, from the toy prompt (``"12+34="``). A task written in
words (word_problems, countdown, a plugin's with alphabet=None) uses its prompt as it is."""

for _name in ("addition", "count", "max", "min"):
    register_kind(_name, KINDS["number"])
for _name in ("sort", "reverse", "compare"):
    register_kind(_name, KINDS["text"])


def question(example: Example) -> str:
    if in_words(example.task):
        return example.prompt
    ask = lookup(QUESTIONS, example.task, "instruct task",
                 "add one to instruct.QUESTIONS (and answers.register_kind), or train it with "
                 "answer_format='raw'")
    return ask(example.prompt)


def render(example: Example, fmt: str) -> Example:
    """The example as an instruct prompt asking for format ``fmt`` ("raw": unchanged)."""
    if fmt == RAW:
        return example
    return dataclasses.replace(example, prompt=f"{question(example)} {get_format(fmt).instruction}",
                               fmt=fmt, raw_prompt=example.raw_prompt or example.prompt)


def render_all(examples: Sequence[Example], fmt: str) -> list[Example]:
    return [render(e, fmt) for e in examples]


def rendered_source(draw: Callable, fmt: str) -> Callable:
    """A prompt source ``draw(rng, n)`` whose examples come out rendered in ``fmt``."""
    if fmt == RAW:
        return draw
    return lambda rng, n: render_all(draw(rng, n), fmt)


def check_config(task_names: Sequence[str], answer_format: str, policy: str,
                 supervision: str) -> None:
    """The config's task/format/policy combination makes sense (TrainConfig calls this)."""
    lookup((RAW, *FORMATS), answer_format, "answer format")     # raw is not in FORMATS
    if answer_format != RAW:
        if policy != "hf":
            raise ValueError(f"answer_format={answer_format!r} writes prompts in words for "
                             f"instruct models: it needs policy='hf' (the toy's alphabet has "
                             f"no capitals); the toy uses answer_format='raw'")
        if supervision == "process":
            raise ValueError("supervision='process' rewards the toy's answer characters one "
                             "by one: it needs answer_format='raw'")
        for t in task_names:
            if t not in QUESTIONS and not in_words(t):
                question(Example("", "", t))           # the error naming the task
    else:
        for t in task_names:
            if in_words(t):
                raise ValueError(f"task {t!r} is written for instruct models (in words, "
                                 f"alphabet=None): set answer_format to one of "
                                 f"{sorted(FORMATS)} (and policy='hf')")
