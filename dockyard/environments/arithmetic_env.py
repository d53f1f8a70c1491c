"""``arithmetic``: the quickstart task ``a+b=`` -> digits, exact integer match before EOS."""

from __future__ import annotations

import re

from dockyard.config.sections.env import ArithmeticEnvConfig
from dockyard.environments.base import (
    Environment,
    GroupScore,
    InvalidScoringInput,
    SampleInput,
    SampleScore,
    ScoreFlag,
    ScoringGroup,
)
from dockyard.environments.math_answers import parse_number
from dockyard.environments.math_env import ground_truth_text
from dockyard.environments.registry import register_environment

_INTEGER = re.compile(r"\s*[-+]?\d+\s*")


def answer_before_eos(text: str, eos_markers: list[str]) -> tuple[str, bool]:
    """The text before the first EOS marker, and whether a marker was there."""
    positions = [text.find(marker) for marker in eos_markers if marker and marker in text]
    if not positions:
        return text, False
    return text[: min(positions)], True


def score_arithmetic_sample(
    sample: SampleInput, truth: int, settings: ArithmeticEnvConfig
) -> SampleScore:
    answer, saw_eos = answer_before_eos(sample.answer_text, settings.eos_markers)
    stopped = saw_eos or sample.finish_reason == "stop"
    if settings.require_stop and not stopped and sample.finish_reason == "length":
        return SampleScore(0.0, {"correct": 0.0}, frozenset({ScoreFlag.TRUNCATED}), "no EOS")
    if not _INTEGER.fullmatch(answer):
        return SampleScore(
            0.0,
            {"correct": 0.0},
            frozenset({ScoreFlag.INVALID_ACTION}),
            f"not an integer: {answer[:40]!r}",
        )
    parsed = parse_number(answer)
    correct = 1.0 if parsed is not None and parsed.value == truth else 0.0
    return SampleScore(correct, {"correct": correct}, frozenset(), f"answer {answer.strip()}")


@register_environment
class ArithmeticEnvironment(Environment):
    """Cheap enough to score inline on the event loop (a regex and an integer compare)."""

    name = "arithmetic"
    settings: ArithmeticEnvConfig

    async def score(self, group: ScoringGroup) -> GroupScore:
        truth_text = ground_truth_text(group)
        truth = parse_number(truth_text)
        if truth is None or truth.value.denominator != 1:
            raise InvalidScoringInput("bad_ground_truth", f"not an integer: {truth_text!r}")
        target = int(truth.value)
        scores = [score_arithmetic_sample(s, target, self.settings) for s in group.samples]
        return GroupScore(group_id=group.group_id, samples=scores)
