"""``reasoning_gym``: procedural tasks scored by reasoning-gym's own verifier.

The prompt group carries the generated item and its generator config
(:mod:`dockyard.data.procedural`); the verifier is the ``score_answer`` of the same dataset
object, rebuilt once per config and cached. A response with no answer, or one the verifier
chokes on, scores 0 with the reason — never an exception out of the scorer.
"""

from __future__ import annotations

import asyncio
import json
import re
from functools import lru_cache

from dockyard.config.sections.env import ReasoningGymEnvConfig
from dockyard.data.procedural import CONFIG_KEY, ENTRY_KEY, TASK_KEY, decode_entry
from dockyard.environments.base import (
    Environment,
    GroupScore,
    InvalidScoringInput,
    SampleScore,
    ScoreFlag,
    ScoringGroup,
)
from dockyard.environments.registry import register_environment


@lru_cache(maxsize=64)
def _verifier(task: str, options: str) -> object:
    import reasoning_gym

    return reasoning_gym.create_dataset(task, **json.loads(options))


def extract_tagged(text: str, tag: str) -> str | None:
    """The content of the last ``<tag>...</tag>``, stripped (reasoning-gym's convention)."""
    matches = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    return matches[-1].strip() if matches else None


def _no_answer(detail: str) -> SampleScore:
    return SampleScore(
        reward=0.0,
        components={"score": 0.0, "has_answer": 0.0},
        flags=frozenset({ScoreFlag.INVALID_ACTION}),
        detail=detail,
    )


def score_sample(
    response: str, entry: object, verifier: object, settings: ReasoningGymEnvConfig
) -> SampleScore:
    if settings.answer_tag is None:
        answer = response.strip()
    else:
        tagged = extract_tagged(response, settings.answer_tag)
        if tagged is None:
            return _no_answer(f"no <{settings.answer_tag}>...</{settings.answer_tag}> answer")
        answer = tagged
    try:
        score = float(verifier.score_answer(answer, entry))  # type: ignore[attr-defined]  # an untyped reasoning-gym dataset
    except Exception as error:  # a verifier parsing model output may raise anything
        return SampleScore(
            reward=0.0,
            components={"score": 0.0, "has_answer": 1.0},
            flags=frozenset({ScoreFlag.INVALID_ACTION}),
            detail=f"the verifier refused {answer[:80]!r}: {type(error).__name__}: {error}"[:300],
        )
    score = min(1.0, max(0.0, score)) if score == score else 0.0  # NaN scores 0
    return SampleScore(
        reward=score,
        components={"score": score, "has_answer": 1.0},
        flags=frozenset(),
        detail=f"answer {answer[:80]!r}: verifier score {score}",
    )


@register_environment
class ReasoningGymEnvironment(Environment):
    name = "reasoning_gym"
    settings: ReasoningGymEnvConfig

    async def score(self, group: ScoringGroup) -> GroupScore:
        values = [group.extra.get(key) for key in (TASK_KEY, CONFIG_KEY, ENTRY_KEY)]
        task, options, entry = values
        if not (isinstance(task, str) and isinstance(options, str) and isinstance(entry, str)):
            raise InvalidScoringInput(
                "missing_reasoning_gym_item",
                f"group {group.group_id} carries no reasoning-gym item (is its dataset "
                "reasoning_gym/<task>?)",
            )
        return await asyncio.to_thread(self._score_sync, group, task, options, entry)

    def _score_sync(self, group: ScoringGroup, task: str, options: str, entry: str) -> GroupScore:
        try:
            verifier = _verifier(task, options)
            item = decode_entry(json.loads(entry))
        except Exception as error:
            raise InvalidScoringInput(
                "bad_reasoning_gym_item", f"group {group.group_id}: {type(error).__name__}: {error}"
            ) from None
        scores = [score_sample(s.answer_text, item, verifier, self.settings) for s in group.samples]
        return GroupScore(group_id=group.group_id, samples=scores)
