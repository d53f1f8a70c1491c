"""Answer extraction and equivalence for verifiable math.

Extraction: the *last* ``\\boxed{...}`` (balanced braces, so ``\\boxed{\\frac{1}{2}}`` works) or
the last number in the text. Equivalence: exact rational comparison when both sides are numbers
(integers, decimals, fractions, ``\\frac``, percentages, thousands separators, scientific
notation) — kept by hand because math-verify gets ``50\\%`` vs ``0.5`` and ``2.5e3`` vs ``2500``
wrong (docs/benchmarks.md) — else math-verify, through a checker that runs it in a killable worker
process (:mod:`dockyard.environments.math_check_pool`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, Protocol

from dockyard.environments.latex_braces import balanced_group
from dockyard.environments.math_check_pool import CheckVerdict

AnswerFormat = Literal["boxed_or_last_number", "boxed", "last_number"]

# Numbers larger than this many digits / exponents are compared as refused, not computed: a
# model can write ``1e999999999`` and Fraction would try to build the integer.
_MAX_NUMBER_CHARS = 400
_MAX_DECIMAL_EXPONENT = 400

_BOX_COMMANDS = ("\\boxed", "\\fbox")

_NUMBER_PATTERN = (
    r"(?<![\w./])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?%?"
    r"|(?<![\w./])-?\.\d+(?:[eE][-+]?\d+)?%?"
)
_LAST_NUMBER = re.compile(rf"(?<![\w.])-?\d+\s*/\s*\d+(?!\d|\.\d)|{_NUMBER_PATTERN}")


@dataclass(frozen=True)
class ExtractedAnswer:
    text: str
    source: Literal["boxed", "last_number"]


_BOX_START = re.compile("|".join(re.escape(command) for command in _BOX_COMMANDS) + r"(?![A-Za-z])")
_SPACE_TOKEN = re.compile(r"\s+([^\s$]+)")
_NOT_SPACE = re.compile(r"\S")


def extract_boxed(text: str) -> str | None:
    """The content of the last well-formed ``\\boxed{...}`` (or ``\\boxed x``), else None.

    Linear in the text: candidates are tried from the last one back, and a group still open when
    the scan reaches the brace of a later unclosed group can never close (it would need to close
    that one first), so each character is scanned once. Scanning every candidate to the end is
    quadratic, and a response of many unclosed ``\\boxed{`` made that minutes of scorer CPU.
    """
    limit = len(text)
    for match in reversed(list(_BOX_START.finditer(text))):
        after = match.end()
        brace = _NOT_SPACE.search(text, after)
        if brace is not None and text[brace.start()] == "{":
            content = balanced_group(text, brace.start(), end=limit)
            if content is not None:
                return content.strip()
            limit = brace.start()
        elif text[after : after + 1] == " ":
            token = _SPACE_TOKEN.match(text, after)
            if token:
                return token.group(1).strip()
    return None


def extract_last_number(text: str) -> str | None:
    matches = _LAST_NUMBER.findall(text)
    return matches[-1].strip() if matches else None


def extract_answer(text: str, answer_format: AnswerFormat) -> ExtractedAnswer | None:
    if answer_format != "last_number":
        boxed = extract_boxed(text)
        if boxed is not None:
            return ExtractedAnswer(boxed, "boxed")
        if answer_format == "boxed":
            return None
    number = extract_last_number(text)
    return ExtractedAnswer(number, "last_number") if number is not None else None


_LATEX_NOISE = re.compile(r"\\[,!;: ]|\\quad|\\qquad|\\left|\\right|\\displaystyle")
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|mathrm|mathbf|operatorname)\{([^{}]*)\}")


def normalize_answer(text: str) -> str:
    """Strip presentation: dollars, spacing commands, ``\\text{}`` wrappers, degrees, final dot."""
    text = text.strip().strip("$").strip()
    text = _LATEX_NOISE.sub("", text)
    text = _TEXT_COMMAND.sub(r"\1", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"\^\s*\{?\\circ\}?|°", "", text)
    text = text.replace("\\%", "%")
    # "x = 5" answers the question "x = ?": compare the right-hand side.
    text = re.sub(r"^[A-Za-z]\s*=\s*(?=\S)", "", text.strip())
    text = re.sub(r"\s+", " ", text).strip()
    return text.rstrip(".").strip()


_PLAIN_NUMBER = re.compile(
    r"(?P<sign>[-+]?)(?P<body>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)"
    r"(?:[eE](?P<exp>[-+]?\d+))?(?P<percent>%?)"
)
_FRACTION = re.compile(r"(?P<num>[-+]?\d+)\s*/\s*(?P<den>\d+)")
_LATEX_FRACTION = re.compile(r"(?P<sign>-?)\\frac\{(?P<num>[-+]?\d+)\}\{(?P<den>[-+]?\d+)\}")


@dataclass(frozen=True)
class ParsedNumber:
    value: Fraction
    is_percent: bool = False


def parse_number(text: str) -> ParsedNumber | None:
    """An exact rational for a number written the usual ways; None for anything else."""
    text = normalize_answer(text).replace(" ", "")
    if not text or len(text) > _MAX_NUMBER_CHARS:
        return None
    if match := _PLAIN_NUMBER.fullmatch(text):
        exponent = int(match["exp"] or 0)
        if abs(exponent) > _MAX_DECIMAL_EXPONENT:
            return None
        value = Fraction(match["body"].replace(",", "")) * Fraction(10) ** exponent
        if match["sign"] == "-":
            value = -value
        return ParsedNumber(value, is_percent=bool(match["percent"]))
    if (match := _FRACTION.fullmatch(text)) or (match := _LATEX_FRACTION.fullmatch(text)):
        denominator = int(match["den"])
        if denominator == 0:
            return None
        value = Fraction(int(match["num"]), denominator)
        if match.groupdict().get("sign") == "-":
            value = -value
        return ParsedNumber(value)
    return None


def _close(a: Fraction, b: Fraction, relative_tolerance: float) -> bool:
    if a == b:
        return True
    if relative_tolerance <= 0:
        return False
    return abs(a - b) <= Fraction(relative_tolerance) * max(abs(a), abs(b))


def numbers_equal(answer: ParsedNumber, truth: ParsedNumber, relative_tolerance: float) -> bool:
    """Equal values; a percentage also matches its fraction (``50%`` matches ``50`` and ``0.5``)."""
    candidates = [answer.value]
    if answer.is_percent:
        candidates.append(answer.value / 100)
    if truth.is_percent:
        candidates.extend(value * 100 for value in list(candidates))
    return any(_close(value, truth.value, relative_tolerance) for value in candidates)


class SymbolicChecker(Protocol):
    """Judges two answers that are not both plain numbers (bound to its deadline)."""

    def __call__(self, answer: str, truth: str) -> CheckVerdict: ...


@dataclass(frozen=True)
class Equivalence:
    equal: bool
    method: Literal["exact", "numeric", "symbolic", "unparsed", "timeout", "crashed"]


def answers_equivalent(
    answer: str,
    truth: str,
    *,
    relative_tolerance: float = 1e-6,
    checker: SymbolicChecker | None = None,
) -> Equivalence:
    """Whether ``answer`` and ``truth`` denote the same value. Without a ``checker`` only text
    and numbers are compared; the checker bounds its own time (see module doc)."""
    normalized_answer, normalized_truth = normalize_answer(answer), normalize_answer(truth)
    if normalized_answer == normalized_truth and normalized_answer:
        return Equivalence(True, "exact")
    answer_number, truth_number = parse_number(answer), parse_number(truth)
    if answer_number is not None and truth_number is not None:
        return Equivalence(
            numbers_equal(answer_number, truth_number, relative_tolerance), "numeric"
        )
    if checker is None or not answer.strip():
        return Equivalence(False, "unparsed")
    verdict = checker(answer, truth)
    if verdict == "equal":
        return Equivalence(True, "symbolic")
    if verdict == "not_equal":
        return Equivalence(False, "symbolic")
    return Equivalence(False, verdict)
