"""``gpqa``: multiple-choice questions; reward 1 for the record's letter, else 0 with a reason.

Record fields (``data.*.fields``): ``answer`` is the correct letter (``C``, ``(C)``); the choices
are listed in the prompt (lines ``A) ...`` / ``(B) ...`` / ``C. ...``) or named by metadata
``choices`` (``"ABCDE"`` or a count), else ``env.gpqa.choices``. Letter rules:
:mod:`dockyard.environments.choice_answers`.
"""

from __future__ import annotations

import asyncio

from dockyard.config.sections.env import ChoiceEnvConfig, GpqaEnvConfig
from dockyard.environments.arithmetic_env import answer_before_eos
from dockyard.environments.base import (
    Environment,
    GroupScore,
    SampleScore,
    ScoreFlag,
    ScoringGroup,
)
from dockyard.environments.choice_answers import (
    extract_choice,
    ground_truth_letter,
    resolve_choices,
)
from dockyard.environments.math_env import ground_truth_text
from dockyard.environments.registry import register_environment


def no_answer(detail: str) -> SampleScore:
    """Zero reward for a response with no usable answer, with the reason."""
    return SampleScore(
        reward=0.0,
        components={"correct": 0.0, "has_answer": 0.0},
        flags=frozenset({ScoreFlag.INVALID_ACTION}),
        detail=detail,
    )


def too_long(response: str, env_name: str, limit: int) -> SampleScore | None:
    if len(response) <= limit:
        return None
    return no_answer(
        f"response is {len(response)} characters, over env.{env_name}.max_response_chars={limit}"
    )


def score_choice_sample(
    response: str, truth: str, choices: str, settings: ChoiceEnvConfig, env_name: str
) -> SampleScore:
    if (refused := too_long(response, env_name, settings.max_response_chars)) is not None:
        return refused
    response, _ = answer_before_eos(response, settings.eos_markers)
    picked = extract_choice(response, choices, settings.answer_format)
    if picked.letter is None:
        return no_answer(picked.reason)
    correct = 1.0 if picked.letter == truth else 0.0
    return SampleScore(
        reward=correct,
        components={"correct": correct, "has_answer": 1.0},
        detail=f"{picked.reason} (expected {truth})",
    )


def choice_truth(group: ScoringGroup, default_choices: str) -> tuple[str, str]:
    """The group's choices and its correct letter; refuses a group whose truth is not a choice."""
    choices = resolve_choices(group.extra, group.prompt_text, default_choices)
    return choices, ground_truth_letter(ground_truth_text(group), choices)


@register_environment
class GpqaEnvironment(Environment):
    """Scored in a worker thread: extraction is linear, but a 200,000-character response of
    repeated answer statements still takes about a second, too long to hold the event loop."""

    name = "gpqa"
    settings: GpqaEnvConfig

    async def score(self, group: ScoringGroup) -> GroupScore:
        choices, truth = choice_truth(group, self.settings.choices)
        return await asyncio.to_thread(
            score_choice_group, group, truth, choices, self.settings, self.name
        )


def score_choice_group(
    group: ScoringGroup, truth: str, choices: str, settings: ChoiceEnvConfig, env_name: str
) -> GroupScore:
    scores = [
        score_choice_sample(s.answer_text, truth, choices, settings, env_name)
        for s in group.samples
    ]
    return GroupScore(group_id=group.group_id, samples=scores)
