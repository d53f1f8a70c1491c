"""``hle``: Humanity's-Last-Exam style questions, exact answers and multiple choice.

Record fields (``data.*.fields``): ``answer`` is the reference (a short text, a number, an
expression, or a letter); metadata ``answer_type`` is ``exact_match``/``exactMatch`` or
``multiple_choice``/``multipleChoice`` (default ``env.hle.default_answer_type``); a
multiple-choice record's choices come as for ``gpqa`` (prompt list, metadata ``choices``, or
``env.hle.choices``). Exact answers: :mod:`dockyard.environments.exact_answers`.
"""

from __future__ import annotations

import asyncio

from dockyard.config.sections.env import HleEnvConfig
from dockyard.environments.arithmetic_env import answer_before_eos
from dockyard.environments.base import (
    GroupScore,
    InvalidScoringInput,
    SampleScore,
    ScoringGroup,
)
from dockyard.environments.choice_env import choice_truth, no_answer, score_choice_group, too_long
from dockyard.environments.exact_answers import exact_answers_equal, extract_exact_answer
from dockyard.environments.math_answers import SymbolicChecker
from dockyard.environments.math_env import (
    MathCheckingEnvironment,
    ground_truth_text,
    judged_answer_score,
)
from dockyard.environments.registry import register_environment

_ANSWER_TYPES = {
    "exact_match": "exact_match",
    "exactmatch": "exact_match",
    "multiple_choice": "multiple_choice",
    "multiplechoice": "multiple_choice",
}


def score_exact_sample(
    response: str, truth: str, settings: HleEnvConfig, checker: SymbolicChecker | None
) -> SampleScore:
    if (refused := too_long(response, "hle", settings.max_response_chars)) is not None:
        return refused
    response, _ = answer_before_eos(response, settings.eos_markers)
    if not response.strip():
        return no_answer("empty response")
    stated = extract_exact_answer(response, settings.answer_format)
    if stated is None:
        return no_answer(f"no answer found (format {settings.answer_format!r})")
    if not stated.text.strip():
        return no_answer(f"empty {stated.source} answer")
    verdict = exact_answers_equal(
        stated.text,
        truth,
        relative_tolerance=settings.relative_tolerance,
        checker=checker,
    )
    return judged_answer_score(verdict, stated.source, stated.text)


@register_environment
class HleEnvironment(MathCheckingEnvironment):
    """Scored in a worker thread: exact answers may go to math-verify (in worker processes),
    letters see long texts."""

    name = "hle"
    settings: HleEnvConfig

    async def score(self, group: ScoringGroup) -> GroupScore:
        if self._answer_type(group) == "multiple_choice":
            choices, letter = choice_truth(group, self.settings.choices)
            return await asyncio.to_thread(
                score_choice_group, group, letter, choices, self.settings, self.name
            )
        truth = ground_truth_text(group)
        return await asyncio.to_thread(self._score_exact, group, truth)

    def _score_exact(self, group: ScoringGroup, truth: str) -> GroupScore:
        scores = [
            score_exact_sample(s.answer_text, truth, self.settings, self._checker)
            for s in group.samples
        ]
        return GroupScore(group_id=group.group_id, samples=scores)

    def _answer_type(self, group: ScoringGroup) -> str:
        declared = group.extra.get("answer_type")
        if declared is None:
            return self.settings.default_answer_type
        answer_type = _ANSWER_TYPES.get(str(declared).replace(" ", "").casefold())
        if answer_type is None:
            raise InvalidScoringInput(
                "bad_answer_type",
                f"group {group.group_id}: metadata answer_type {declared!r} is not one of "
                "exact_match/exactMatch, multiple_choice/multipleChoice",
            )
        return answer_type
