"""The ``gpqa`` environment: which letter a response picks, and what a bad response scores.

Expected rewards follow the letter rules of :mod:`dockyard.environments.choice_answers`: the
strongest tier present decides (boxed > answer statement > ``(C)`` > last standalone letter);
two different letters where one is asked for, a letter outside the choices, no letter, an empty
or oversized response all score 0 with a reason and the ``invalid_action`` flag.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dockyard.config.loader import load_config_report
from dockyard.config.sections.data import DatasetConfig, FieldMapping
from dockyard.config.sections.env import EnvConfig, GpqaEnvConfig
from dockyard.data.files import load_file_dataset
from dockyard.environments import (
    EnvironmentContext,
    InvalidScoringInput,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    build_environment,
)
from dockyard.environments.choice_env import GpqaEnvironment

ROOT = Path(__file__).resolve().parents[3]
PROMPT = "Which flask?\nA) red\nB) green\nC) blue\nD) clear\n"


def _group(responses: list[str], truth: str = "C", prompt: str = PROMPT, **extra) -> ScoringGroup:
    return ScoringGroup(
        group_id="g",
        env_name="gpqa",
        prompt_text=prompt,
        samples=[SampleInput(text) for text in responses],
        ground_truth=truth,
        extra=extra,
    )


async def _score(responses: list[str], settings: GpqaEnvConfig | None = None, **kwargs):
    environment = GpqaEnvironment(settings or GpqaEnvConfig())
    return (await environment.score(_group(responses, **kwargs))).samples


@pytest.mark.parametrize(
    "response",
    [
        "Blue is the only one left, so \\boxed{C}.",
        "\\boxed{\\text{(c)}}",
        "\\boxed{C) blue}",
        "Answer: C",
        "Final Answer: **C**",
        "A and B are ruled out, so the answer is (C).",
        "the answer is option C; the others fail",
        "I would go with (C) here",
        "It must be blue.\nC",
        # The strongest tier decides: a later bare letter does not override the boxed one.
        "\\boxed{C}\nA note on option A follows",
        # Decoded special tokens: the response ends at the end-of-turn marker.
        "Answer: C<|im_end|>\nAnswer: A",
    ],
)
async def test_a_response_naming_the_right_letter_scores_1(response: str) -> None:
    [score] = await _score([response])
    assert score.reward == 1.0, score.detail
    assert score.components == {"correct": 1.0, "has_answer": 1.0}
    assert score.flags == frozenset()


@pytest.mark.parametrize(
    "response", ["\\boxed{B}", "Answer: D", "so the answer is (A).", "it is B"]
)
async def test_a_wrong_letter_scores_0_but_has_an_answer(response: str) -> None:
    [score] = await _score([response])
    assert (score.reward, score.components["has_answer"]) == (0.0, 1.0)
    assert score.flags == frozenset()
    assert "expected C" in score.detail


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("", "empty response"),
        ("   \n\t ", "empty response"),
        ("I cannot decide between the colours.", "no answer letter found"),
        ("\\boxed{}", "empty \\boxed{} answer"),
        ("\\boxed{B, C}", "ambiguous"),
        ("Answer: B or C", "ambiguous: names B, C"),
        ("the answer is (B) and (C).", "ambiguous: names B, C"),
        # Listing every option must not collect the reward through the last-letter rule.
        ("(A) (B) (C) (D)", "ambiguous: names A, B, C, D"),
        ("A B C D", "ambiguous: names A, B, C, D"),
        ("Answer: E", "E is not one of the letters ABCD"),
        ("\\boxed{F}", "F is not one of the letters ABCD"),
        ("\\boxed{42}", "is not one of the letters ABCD"),
    ],
)
async def test_malformed_output_scores_0_with_a_reason(response: str, reason: str) -> None:
    [score] = await _score([response])
    assert score.reward == 0.0
    assert score.components == {"correct": 0.0, "has_answer": 0.0}
    assert score.flags == frozenset({ScoreFlag.INVALID_ACTION})
    assert reason in score.detail


async def test_answer_format_boxed_accepts_only_a_boxed_letter() -> None:
    settings = GpqaEnvConfig(answer_format="boxed")
    boxed, stated = await _score(["\\boxed{C}", "Answer: C"], settings)
    assert boxed.reward == 1.0
    assert (stated.reward, stated.detail) == (0.0, "no \\boxed{} answer")


async def test_answer_format_marked_ignores_a_bare_letter() -> None:
    settings = GpqaEnvConfig(answer_format="marked")
    marked, bare = await _score(["Answer: C", "It must be blue.\nC"], settings)
    assert marked.reward == 1.0
    assert bare.reward == 0.0 and "no answer letter found" in bare.detail


async def test_oversized_responses_score_0_and_say_the_limit() -> None:
    prose = "The flasks are discussed at length. " * 5_000  # 180,000 characters
    settings = GpqaEnvConfig(max_response_chars=200_000)
    within, over = await _score([prose + "Answer: C", prose * 2 + "Answer: C"], settings)
    assert within.reward == 1.0
    assert over.reward == 0.0 and ScoreFlag.INVALID_ACTION in over.flags
    assert "over env.gpqa.max_response_chars=200000" in over.detail


@pytest.mark.timeout(60)  # a hang guard: the old extraction was quadratic (~minutes here)
async def test_a_response_of_unclosed_boxes_is_scored_not_hung() -> None:
    [score] = await _score(["\\boxed{" * 28_000])  # 196,000 characters, under the limit
    assert score.reward == 0.0 and ScoreFlag.INVALID_ACTION in score.flags


async def test_choices_come_from_metadata_then_the_prompt_then_the_config() -> None:
    five = "Pick one.\n(A) 1\n(B) 2\n(C) 3\n(D) 4\n(E) 5"
    [from_prompt] = await _score(["Answer: E"], truth="E", prompt=five)
    assert from_prompt.reward == 1.0
    # Metadata wins over the prompt: choices "ABC" makes D a letter outside the choices.
    [from_metadata] = await _score(["Answer: D"], truth="A", choices="A,B,C")
    assert "D is not one of the letters ABC" in from_metadata.detail
    [from_count] = await _score(["Answer: E"], truth="A", prompt="No list here.", choices=5)
    assert "expected A" in from_count.detail and from_count.components["has_answer"] == 1.0
    settings = GpqaEnvConfig(choices="ABCDEFGH")
    [from_config] = await _score(["Answer: H"], settings, truth="H", prompt="No list here.")
    assert from_config.reward == 1.0


@pytest.mark.parametrize(
    ("truth", "extra", "reason"),
    [
        ("E", {}, "bad_ground_truth"),  # not one of the prompt's A-D
        ("blue", {}, "bad_ground_truth"),
        ("C", {"choices": "A"}, "bad_choices"),
        ("C", {"choices": 40}, "bad_choices"),
        ("C", {"choices": ["A", "B"]}, "bad_choices"),
    ],
)
async def test_an_unusable_record_is_refused_for_dead_lettering(truth, extra, reason) -> None:
    with pytest.raises(InvalidScoringInput) as refused:
        await _score(["Answer: C"], truth=truth, **extra)
    assert refused.value.reason_code == reason


async def test_the_sample_file_loads_and_scores_through_the_file_dataset() -> None:
    config = DatasetConfig(
        name="gpqa",
        path=str(ROOT / "configs/cpu/data/gpqa.jsonl"),
        fields=FieldMapping(prompt="question", answer="answer", metadata=["id", "choices"]),
    )
    dataset = load_file_dataset(config, env="gpqa")
    environment = build_environment("gpqa")
    right = {"mc-1": "\\boxed{C}", "mc-2": "The answer is (B).", "mc-3": "Answer: C"}
    for record in dataset.records:
        group = ScoringGroup(
            group_id=str(record.extra["id"]),
            env_name=record.env,
            prompt_text=record.prompt,
            samples=[SampleInput(right[record.extra["id"]]), SampleInput("Answer: A")],
            ground_truth=record.ground_truth,
            extra=record.extra,
        )
        assert (await environment.score(group)).rewards == [1.0, 0.0], record.extra["id"]


def test_gpqa_yaml_scores_with_this_environment_and_its_settings() -> None:
    config = load_config_report(ROOT / "configs/gpqa.yaml").config
    assert config.data.train.env == "gpqa" and config.data.default_env == "gpqa"
    environment = build_environment(config.data.train.env, EnvironmentContext(env=config.env))
    assert isinstance(environment, GpqaEnvironment)
    assert environment.settings.answer_format == "boxed"
    assert isinstance(config.env, EnvConfig)
