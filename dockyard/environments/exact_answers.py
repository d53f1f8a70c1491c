"""Exact (short, free-form) answers: where a response states its answer, and text equality.

Extraction, strongest first: the last ``\\boxed{...}``; the last ``Answer: ...`` line (HLE's own
response format is ``Explanation: / Answer: / Confidence:``) or ``the answer is ...`` sentence;
with ``answer_format: any``, the last number. Comparison: equal after normalisation (case,
whitespace, surrounding punctuation and markdown, LaTeX ``\\text{}``/``$``/spacing), else the
math checker (:func:`dockyard.environments.math_answers.answers_equivalent`: exact rationals,
tolerance, math-verify in a killable worker) for answers that are numbers or expressions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from dockyard.environments.math_answers import (
    Equivalence,
    SymbolicChecker,
    answers_equivalent,
    extract_boxed,
    extract_last_number,
    normalize_answer,
)

ExactFormat = Literal["boxed", "marked", "any"]

# "Answer: ..." as its own line (optionally "Final", markdown bold); the rest of the line.
_ANSWER_LINE = re.compile(
    r"^[ \t>*_#-]*(?:final[ \t]+)?answer[ \t]*\**[ \t]*[:：][ \t]*(.*)$",
    re.IGNORECASE | re.MULTILINE,
)
# "the (final) answer is X": X runs to the end of the sentence or line (at most _STATED_CHARS;
# a bounded window keeps a long line of repeated statements linear).
_ANSWER_SENTENCE = re.compile(r"\bthe[ \t]+(?:final[ \t]+)?answer[ \t]+is\b[ \t]*:?", re.I)
_SENTENCE_END = re.compile(r"[.;](?=\s|$)|\n")
_STATED_CHARS = 400
_EDGE_PUNCTUATION = "\"'`.,;:!?*_ \t"


AnswerSource = Literal["boxed", "answer_line", "answer_sentence", "last_number"]


@dataclass(frozen=True)
class StatedAnswer:
    text: str
    source: AnswerSource


def extract_exact_answer(text: str, answer_format: ExactFormat) -> StatedAnswer | None:
    boxed = extract_boxed(text)
    if boxed is not None:
        return StatedAnswer(boxed, "boxed")
    if answer_format == "boxed":
        return None
    lines = [m for m in _ANSWER_LINE.finditer(text) if m.group(1).strip(_EDGE_PUNCTUATION)]
    # The later of the two statements is the response's last word on its answer.
    candidates: list[tuple[int, str, AnswerSource]] = [
        (m.start(), m.group(1), "answer_line") for m in lines[-1:]
    ]
    for sentence in reversed(list(_ANSWER_SENTENCE.finditer(text))):
        window = text[sentence.end() : sentence.end() + _STATED_CHARS]
        stated = window[: end.start()] if (end := _SENTENCE_END.search(window)) else window
        if stated.strip(_EDGE_PUNCTUATION):
            candidates.append((sentence.start(), stated, "answer_sentence"))
            break
    if candidates:
        _, stated, source = max(candidates)
        return StatedAnswer(stated.strip(), source)
    if answer_format == "any":
        number = extract_last_number(text)
        if number is not None:
            return StatedAnswer(number, "last_number")
    return None


def normalize_exact(text: str) -> str:
    """Presentation off, then case and inner whitespace: ``**The  Krebs cycle.**`` -> ``the krebs
    cycle``."""
    text = normalize_answer(text.strip(_EDGE_PUNCTUATION))
    return re.sub(r"\s+", " ", text.strip(_EDGE_PUNCTUATION)).casefold()


def exact_answers_equal(
    answer: str, truth: str, *, relative_tolerance: float, checker: SymbolicChecker | None
) -> Equivalence:
    normalized = normalize_exact(answer)
    if normalized and normalized == normalize_exact(truth):
        return Equivalence(True, "exact")
    return answers_equivalent(answer, truth, relative_tolerance=relative_tolerance, checker=checker)
