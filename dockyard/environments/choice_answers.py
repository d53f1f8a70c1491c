"""Multiple-choice answers: which letters a question offers, and which one a response picks.

A response's letter is looked for in tiers, strongest first, and the first tier that finds one
decides (a later, weaker tier never overrides it):

1. ``boxed``: the last ``\\boxed{...}`` — ``\\boxed{C}``, ``\\boxed{(c)}``, ``\\boxed{\\text{C}}``,
   ``\\boxed{C) 42 eV}``;
2. ``statement``: the last ``Answer: C`` / ``the answer is (C)`` / ``Final answer: **C**``;
3. ``parenthesised``: the last ``(C)``;
4. ``bare``: the last standalone choice letter (only with ``answer_format: any``).

Naming two different letters where one is asked for (``\\boxed{B, C}``, ``Answer: B or C``, a
line listing ``(A) (B) (C) (D)``) is *ambiguous* and scores 0: otherwise a policy could list every
option and collect the reward. A letter that is not one of the question's choices scores 0 too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from dockyard.environments.base import InvalidScoringInput, JSONValue
from dockyard.environments.math_answers import extract_boxed, normalize_answer

ChoiceFormat = Literal["boxed", "marked", "any"]
Source = Literal["boxed", "statement", "parenthesised", "bare"]

# An option list in the prompt: "A) ...", "(B) ...", "C. ...", "D: ..." at the start of a line.
_PROMPT_OPTION = re.compile(r"^[ \t]*(?:\(([A-Z])\)|([A-Z])[).:])[ \t]+\S", re.MULTILINE)
# "Answer: C", "answer is (C)", "Final Answer: **C**": the text after it is inspected separately.
_STATEMENT = re.compile(r"\banswer\b\**\s*(?:is\b\s*:?|:|：)", re.IGNORECASE)
_PARENTHESISED = re.compile(r"\(([A-Z])\)")
_STANDALONE_UPPER = re.compile(r"(?<![\w\\])([A-Z])(?!\w)")
# The end of the clause an answer statement makes: a sentence stop, a semicolon or a newline.
_CLAUSE_END = re.compile(r"[.;\n](?=\s|$)|\n")


@dataclass(frozen=True)
class ChoiceAnswer:
    """What a response picks: ``letter`` when it picks exactly one, else ``reason`` says why not."""

    letter: str | None
    source: Source | None
    reason: str


def resolve_choices(extra: Mapping[str, JSONValue], prompt: str, default: str) -> str:
    """The question's answer letters, in order: metadata ``choices``, the prompt's list, default.

    Metadata ``choices`` is a string of letters (``"ABCDE"``, ``"A,B,C,D,E"``) or a count
    (``5`` = A-E). A prompt option list counts when it runs A, B, ... without a gap.
    """
    declared = extra.get("choices")
    if declared is not None:
        return _declared_choices(declared)
    listed: list[str] = []
    for match in _PROMPT_OPTION.finditer(prompt):
        letter = match.group(1) or match.group(2)
        if letter not in listed:
            listed.append(letter)
    if len(listed) >= 2 and "".join(sorted(listed)) == _first_letters(len(listed)):
        return "".join(sorted(listed))
    return default


def _first_letters(count: int) -> str:
    return "".join(chr(ord("A") + i) for i in range(count))


def _declared_choices(declared: JSONValue) -> str:
    if isinstance(declared, int) and not isinstance(declared, bool):
        if 2 <= declared <= 26:
            return _first_letters(declared)
    elif isinstance(declared, str):
        letters = re.sub(r"[\s,;/|]", "", declared).upper()
        if (
            2 <= len(letters) <= 26
            and letters.isalpha()
            and letters.isascii()
            and len(set(letters)) == len(letters)
        ):
            return letters
    raise InvalidScoringInput(
        "bad_choices",
        f"metadata 'choices' is {declared!r}; expected 2-26 distinct letters ('ABCD', "
        "'A,B,C,D') or a count from 2 to 26",
    )


def ground_truth_letter(truth: str, choices: str) -> str:
    """The reference letter (``C``, ``c``, ``(C)``, ``\\boxed{C}``); refused if not a choice."""
    letters = _letters_in(_strip_wrapping(truth), upper_only=False)
    if len(letters) != 1 or letters[0] not in choices:
        raise InvalidScoringInput(
            "bad_ground_truth",
            f"multiple-choice ground truth {truth[:80]!r} is not one of the letters {choices}",
        )
    return letters[0]


def extract_choice(text: str, choices: str, answer_format: ChoiceFormat) -> ChoiceAnswer:
    if not text.strip():
        return ChoiceAnswer(None, None, "empty response")
    boxed = extract_boxed(text)
    if boxed is not None:
        return _boxed_choice(boxed, choices)
    if answer_format == "boxed":
        return ChoiceAnswer(None, None, "no \\boxed{} answer")
    statement = _statement_choice(text, choices)
    if statement is not None:
        return statement
    parenthesised = list(_PARENTHESISED.finditer(text))
    if parenthesised:
        last = parenthesised[-1]
        line = _line_of(text, last.start())
        others = {m.group(1) for m in _PARENTHESISED.finditer(line)} & set(choices)
        return _single(last.group(1), others, choices, "parenthesised")
    if answer_format == "any":
        bare = [m for m in _STANDALONE_UPPER.finditer(text) if m.group(1) in choices]
        if bare:
            last = bare[-1]
            line = _line_of(text, last.start())
            others = {m.group(1) for m in _STANDALONE_UPPER.finditer(line)} & set(choices)
            return _single(last.group(1), others, choices, "bare")
    return ChoiceAnswer(None, None, f"no answer letter found (format {answer_format!r})")


def _boxed_choice(content: str, choices: str) -> ChoiceAnswer:
    stripped = _strip_wrapping(content)
    if not stripped:
        return ChoiceAnswer(None, "boxed", "empty \\boxed{} answer")
    # "\boxed{C) 42 eV}": a letter labelling the option's text.
    labelled = re.match(r"([A-Za-z])\s*[).:]\s+\S", stripped)
    if labelled:
        return _single(labelled.group(1).upper(), set(), choices, "boxed")
    letters = _letters_in(stripped, upper_only=False)
    if len(letters) == 1 and len(stripped) == 1:
        return _single(letters[0], set(), choices, "boxed")
    if len(set(letters) & set(choices)) >= 2:
        detail = f"ambiguous: \\boxed{{{content[:80]}}} names two letters"
        return ChoiceAnswer(None, "boxed", detail)
    return ChoiceAnswer(
        None, "boxed", f"\\boxed{{{content[:80]}}} is not one of the letters {choices}"
    )


def _statement_choice(text: str, choices: str) -> ChoiceAnswer | None:
    """The last answer statement that starts with a letter; None if no statement names one."""
    for statement in reversed(list(_STATEMENT.finditer(text))):
        rest = text[statement.end() : statement.end() + 400]
        clause = rest[: m.start()] if (m := _CLAUSE_END.search(rest)) else rest
        # Presentation around the letter: markdown bold, dollars, \text{}, "option", "choice".
        clause = normalize_answer(clause.replace("*", " "))
        clause = re.sub(r"^(?:option|choice)\s+", "", clause.strip(), flags=re.IGNORECASE)
        first = re.match(r"[(\[]([A-Za-z])[)\]]|([A-Z])(?!\w)", clause)
        if not first:
            continue  # prose ("the answer is not obvious"), not a pick
        letter = (first.group(1) or first.group(2)).upper()
        others = set(_letters_in(clause[first.end() :], upper_only=True)) & set(choices)
        return _single(letter, others, choices, "statement")
    return None


def _single(letter: str, seen: set[str], choices: str, source: Source) -> ChoiceAnswer:
    distinct = sorted(seen | {letter})
    if len(distinct) > 1:
        return ChoiceAnswer(None, source, f"ambiguous: names {', '.join(distinct)}")
    if letter not in choices:
        return ChoiceAnswer(None, source, f"{letter} is not one of the letters {choices}")
    return ChoiceAnswer(letter, source, f"{source} answer {letter}")


def _strip_wrapping(text: str) -> str:
    """``\\text{(C).}`` -> ``C``: LaTeX wrappers, brackets, markdown and final punctuation off."""
    text = normalize_answer(text.replace("*", ""))
    text = re.sub(r"^\\boxed\{(.*)\}$", r"\1", text)
    return text.strip().strip("()[]{}").strip().rstrip(".,;:!").strip()


def _letters_in(text: str, *, upper_only: bool) -> list[str]:
    pattern = _STANDALONE_UPPER if upper_only else re.compile(r"(?<![\w\\])([A-Za-z])(?!\w)")
    return [match.group(1).upper() for match in pattern.finditer(text)]


def _line_of(text: str, index: int) -> str:
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    return text[start : end if end != -1 else len(text)]
