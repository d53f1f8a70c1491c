"""The ``hle`` environment: exact answers (text normalised, numbers through the math checker)
and multiple-choice records, chosen per record by metadata ``answer_type``.

Expected rewards follow the rules in :mod:`dockyard.environments.exact_answers`: the answer is
the last ``\\boxed{}``, else the later of the last ``Answer:`` line and the last "the answer is"
sentence; equal after dropping case, spacing, edge punctuation, markdown and ``\\text{}``, or
equal as numbers/expressions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dockyard.config.loader import load_config_report
from dockyard.config.sections.data import DatasetConfig, FieldMapping
from dockyard.config.sections.env import HleEnvConfig
from dockyard.data.files import load_file_dataset
from dockyard.environments import (
    EnvironmentContext,
    InvalidScoringInput,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    build_environment,
)
from dockyard.environments.hle_env import HleEnvironment

ROOT = Path(__file__).resolve().parents[3]


async def _score(
    responses: list[str], truth: str, settings: HleEnvConfig | None = None, **extra
) -> list:
    group = ScoringGroup(
        group_id="g",
        env_name="hle",
        prompt_text="Question?",
        samples=[SampleInput(text) for text in responses],
        ground_truth=truth,
        extra=extra,
    )
    environment = HleEnvironment(settings or HleEnvConfig())
    try:
        return list((await environment.score(group)).samples)
    finally:
        await environment.aclose()


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        ("Explanation: counted twice.\nAnswer: Three\nConfidence: 90%", "three"),
        ("Answer: **the Krebs   cycle.**", "The Krebs cycle"),
        ("so the final answer is \\text{Paris}.", "Paris"),
        ("We get \\boxed{\\text{Mercury}}", "mercury"),
        # Numbers and expressions go through the math checker, not text equality.
        ("Answer: 0.5", "\\frac{1}{2}"),
        ("the answer is 11.50.", "11.5"),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        # The later statement is the response's last word.
        ("The answer is 4. On reflection:\nAnswer: 5", "5"),
        ("Answer: 4\nWait, the answer is 5.", "5"),
        # Decoded special tokens: the response ends at the end-of-turn marker.
        ("Answer: Paris<|im_end|>", "Paris"),
        ("Answer: Paris</s><|endoftext|>Answer: Rome", "Paris"),
    ],
)
async def test_an_equivalent_exact_answer_scores_1(response: str, truth: str) -> None:
    [score] = await _score([response], truth)
    assert score.reward == 1.0, score.detail
    assert score.components == {"correct": 1.0, "has_answer": 1.0}


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        ("Answer: Four", "three"),
        ("Answer: 0.51", "0.5"),
        ("\\boxed{Venus}", "Mercury"),
        ("Answer: 4\nWait, the answer is 5.", "4"),
    ],
)
async def test_a_different_answer_scores_0_but_has_an_answer(response: str, truth: str) -> None:
    [score] = await _score([response], truth)
    assert (score.reward, score.components["has_answer"]) == (0.0, 1.0)
    assert ScoreFlag.INVALID_ACTION not in score.flags


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("", "empty response"),
        ("I think it is probably three", "no answer found"),
        ("Answer:   \nConfidence: 10%", "no answer found"),
        ("\\boxed{ }", "empty boxed answer"),
        ("The answer is: .", "no answer found"),
    ],
)
async def test_no_usable_answer_scores_0_with_a_reason(response: str, reason: str) -> None:
    [score] = await _score([response], "three")
    assert score.reward == 0.0
    assert score.components == {"correct": 0.0, "has_answer": 0.0}
    assert score.flags == frozenset({ScoreFlag.INVALID_ACTION})
    assert reason in score.detail


async def test_answer_format_decides_which_statements_count() -> None:
    response = "Reasoning...\nAnswer: 12"
    [boxed_only] = await _score([response], "12", HleEnvConfig(answer_format="boxed"))
    assert boxed_only.reward == 0.0 and "no answer found" in boxed_only.detail
    [marked] = await _score(["it comes to 12"], "12", HleEnvConfig(answer_format="marked"))
    assert marked.reward == 0.0
    [any_number] = await _score(["it comes to 12"], "12", HleEnvConfig(answer_format="any"))
    assert any_number.reward == 1.0


async def test_oversized_responses_score_0_and_say_the_limit() -> None:
    settings = HleEnvConfig(max_response_chars=1_000)
    [score] = await _score(["x" * 1_001 + "\nAnswer: three"], "three", settings)
    assert score.reward == 0.0 and "over env.hle.max_response_chars=1000" in score.detail


async def test_multiple_choice_records_use_the_letter_rules() -> None:
    responses = ["Answer: B", "\\boxed{B or C}", "Answer: A", "Answer: D"]
    scores = await _score(responses, "B", answer_type="multipleChoice", choices="ABC")
    assert [s.reward for s in scores] == [1.0, 0.0, 0.0, 0.0]
    assert "ambiguous" in scores[1].detail
    assert "D is not one of the letters ABC" in scores[3].detail
    # Without metadata the config's default answer type decides.
    settings = HleEnvConfig(default_answer_type="multiple_choice")
    [letter] = await _score(["(c)"], "C", settings)
    assert letter.reward == 0.0  # "(c)" lowercase is no parenthesised pick; no letter tier
    [letter] = await _score(["(C)"], "C", settings)
    assert letter.reward == 1.0


@pytest.mark.parametrize(
    ("truth", "extra", "reason"),
    [
        ("B", {"answer_type": "essay"}, "bad_answer_type"),
        ("blue", {"answer_type": "multiple_choice"}, "bad_ground_truth"),
    ],
)
async def test_an_unusable_record_is_refused_for_dead_lettering(truth, extra, reason) -> None:
    with pytest.raises(InvalidScoringInput) as refused:
        await _score(["Answer: B"], truth, **extra)
    assert refused.value.reason_code == reason


async def test_the_sample_file_loads_and_scores_through_the_file_dataset() -> None:
    config = DatasetConfig(
        name="hle",
        path=str(ROOT / "configs/cpu/data/hle.jsonl"),
        fields=FieldMapping(prompt="question", metadata=["id", "answer_type"]),
    )
    dataset = load_file_dataset(config, env="hle")
    environment = build_environment("hle")
    right = {
        "ex-1": "Explanation: three kas.\nAnswer: three\nConfidence: 95%",
        "ex-2": "7.25 * 2 - 3 = 11.5, so the answer is 11.50.",
        "ex-3": "Dividing by 4: \\boxed{0.5}",
        "mc-1": "Only the snarvel has six legs. Answer: B",
    }
    for record in dataset.records:
        group = ScoringGroup(
            group_id=str(record.extra["id"]),
            env_name=record.env,
            prompt_text=record.prompt,
            samples=[SampleInput(right[str(record.extra["id"])]), SampleInput("Answer: C")],
            ground_truth=record.ground_truth,
            extra=record.extra,
        )
        assert (await environment.score(group)).rewards == [1.0, 0.0], record.extra["id"]


def test_grpo_hle_yaml_scores_with_this_environment_and_its_settings() -> None:
    config = load_config_report(ROOT / "configs/grpo_hle.yaml").config
    assert config.data.train.env == "hle" and config.data.default_env == "hle"
    environment = build_environment(config.data.train.env, EnvironmentContext(env=config.env))
    assert isinstance(environment, HleEnvironment)
    assert environment.settings.answer_format == "boxed"
