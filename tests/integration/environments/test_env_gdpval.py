"""The gdpval environment end to end: the shipped tasks' commands run in the real sandbox, the
deliverables go to a real vLLM server (tiny model) as the LLM judge; malformed output, unsafe
deliverables, a refusing judge and an unreachable one."""

from __future__ import annotations

from pathlib import Path

import pytest

from dockyard.config.sections.data import DatasetConfig, FieldMapping
from dockyard.config.sections.env import GdpvalEnvConfig, JudgeConfig, SandboxLimits
from dockyard.data.catalog import build_dataset
from dockyard.environments import (
    EnvironmentContext,
    InvalidScoringInput,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    build_environment,
)
from dockyard.environments.judge import JudgeUnavailableError
from tests.judge_server import JUDGE_GROUP, MODEL_NAME
from tests.vllm_server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(JUDGE_GROUP)]

DATA = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "gdpval.jsonl"
FIELDS = FieldMapping(
    prompt="task", answer="solution", metadata=["rubric", "deliverables", "setup"]
)


def _records():
    config = DatasetConfig(name="gdpval", path=str(DATA), fields=FIELDS)
    return list(build_dataset(config, "gdpval").records)


def _environment(url: str, **judge: object):
    limits = SandboxLimits(wall_time_s=5.0, cpu_time_s=2.0, max_output_bytes=10_000)
    settings = GdpvalEnvConfig(
        limits=limits,
        task_timeout=120,
        judge=JudgeConfig(base_url=url, model=MODEL_NAME, max_tokens=512, **judge),
    )
    context = EnvironmentContext()
    context.env.gdpval = settings
    return build_environment("gdpval", context)


def _group(record, *responses: str) -> ScoringGroup:
    return ScoringGroup(
        group_id=str(record.extra.get("id", "gdp")),
        env_name="gdpval",
        prompt_text=record.prompt,
        samples=[SampleInput(response) for response in responses],
        extra=record.extra,
    )


async def test_deliverables_are_graded_by_the_judge(judge_url):
    environment = _environment(judge_url)
    try:
        for record in _records():
            solved = f"```bash\n{record.ground_truth}```<|im_end|>"
            score = await environment.score(_group(record, solved))
            (sample,) = score.samples
            # A random judge: any grade on the scale, but a grade, read from the server.
            assert sample.components["judge_score"] in range(11), sample
            assert sample.reward == sample.components["judge_score"] / 10
            assert sample.detail.startswith("judge: ")
            assert sample.components["judge_attempts"] >= 1
    finally:
        await environment.aclose()


async def test_malformed_output_and_unsafe_deliverables_score_zero_without_the_judge(tmp_path):
    # No server at this URL: any judge call would raise, so every zero here was decided before.
    environment = _environment(f"http://127.0.0.1:{free_port()}", max_retries=0)
    memo = _records()[1]  # deliverable memo.txt, no setup
    responses = [
        "",
        "<eos>",
        "```bash\necho nothing here > other.txt\n```",
        "```bash\nln -s /etc/passwd memo.txt\n```",
        "```bash\nmkdir memo.txt\n```",
        "```bash\nwhile true; do :; done\n```",
    ]
    score = await environment.score(_group(memo, *responses))
    assert score.rewards == [0.0] * 6
    details = [sample.detail for sample in score.samples]
    assert details[0] == details[1] == "no commands in the response"
    assert details[2] == "no deliverable 'memo.txt'"
    assert details[3].startswith("deliverable 'memo.txt' cannot be read")  # not followed
    assert details[4] == "deliverable 'memo.txt' is not a regular file"
    assert ScoreFlag.TEST_TIMEOUT in score.samples[5].flags
    assert all(ScoreFlag.INVALID_ACTION in s.flags for s in score.samples[:5])
    await environment.aclose()


async def test_a_judge_that_never_judges_refuses_the_group_with_its_answer(judge_url):
    # Without the schema the random model writes free text: no judgement, twice.
    environment = _environment(judge_url, structured_output=False, max_retries=1)
    record = _records()[1]
    with pytest.raises(InvalidScoringInput) as refused:
        await environment.score(_group(record, f"```bash\n{record.ground_truth}```"))
    await environment.aclose()
    assert refused.value.reason_code == "judge_refused"
    assert "the judge's answer" in str(refused.value)
    assert "(after 2 attempts)" in str(refused.value)


async def test_an_unreachable_judge_is_an_infrastructure_failure_not_a_score():
    environment = _environment(f"http://127.0.0.1:{free_port()}", max_retries=2)
    record = _records()[1]
    with pytest.raises(JudgeUnavailableError, match="no answer in 3 attempts: ConnectError"):
        await environment.score(_group(record, f"```bash\n{record.ground_truth}```"))
    await environment.aclose()


def test_a_task_without_rubric_or_with_a_path_as_deliverable_is_refused():
    import asyncio

    environment = _environment("http://127.0.0.1:9")
    record = _records()[1]
    for extra, code in (
        ({**record.extra, "rubric": ""}, "bad_rubric"),
        ({**record.extra, "deliverables": "../memo.txt"}, "bad_deliverables"),
    ):
        group = ScoringGroup("g", "gdpval", "p", [SampleInput("true")], extra=extra)
        with pytest.raises(InvalidScoringInput) as refused:
            asyncio.run(environment.score(group))
        assert refused.value.reason_code == code
