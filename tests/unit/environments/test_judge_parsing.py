"""What the LLM judge's answers are read as: a judgement, or a refusal naming what it said."""

from __future__ import annotations

import pytest

from dockyard.config.sections.env import JudgeConfig
from dockyard.environments.judge import Judge, JudgementRefused, parse_judgement


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"score": 7, "reason": "two of three points"}', (7.0, "two of three points")),
        ('Here is my grade:\n```json\n{"score": 10, "reason": "all"}\n```', (10.0, "all")),
        ('{"score": 0}', (0.0, "")),
        ('{"score": 2.5, "reason": 3}', (2.5, "")),
    ],
)
def test_a_judgement_is_read_from_the_answer(text, expected):
    assert parse_judgement(text, max_score=10) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("I'm sorry, I can't grade this.", "holds no JSON object"),
        ("", r"holds no JSON object: '\(empty\)'"),
        ('{"score": 7, "reason": "cut off', "holds no JSON object"),
        ("{score: 7}", "not valid JSON"),
        ('{"grade": 7}', "no numeric score"),
        ('{"score": "high"}', "no numeric score"),
        ('{"score": true}', "no numeric score"),
        ('{"score": 11}', "off the scale 0..10"),
        ('{"score": -1}', "off the scale 0..10"),
    ],
)
def test_an_answer_without_a_judgement_is_refused_with_what_it_said(text, why):
    with pytest.raises(JudgementRefused, match=why):
        parse_judgement(text, max_score=10)


def test_a_judge_without_an_endpoint_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"env\.gdpval\.judge\.base_url: not set"):
        Judge(JudgeConfig(), "env.gdpval.judge")


def test_the_request_asks_for_the_judgement_schema_only_when_structured():
    judge = Judge(JudgeConfig(base_url="http://127.0.0.1:9/", max_score=5), "judge")
    body = judge.request_body("system", "user")
    assert judge.url == "http://127.0.0.1:9/v1/chat/completions"
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["score"] == {"type": "integer", "minimum": 0, "maximum": 5}
    plain = Judge(JudgeConfig(base_url="http://x", structured_output=False), "judge")
    assert "response_format" not in plain.request_body("s", "u")
