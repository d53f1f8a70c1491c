"""``dockyard oracle`` (issue #42, item 7): the data's reference answers, scored through each CPU
preset's own environment, earn reward: the reward path works where a tiny policy earns nothing.
And a reference that is wrong earns nothing: the oracle is scored, not assumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dockyard.cli import main
from tests.integration.e2e.conftest import ROOT

PRESETS = ROOT / "configs" / "cpu"
#: Each preset whose environment the oracle answers, and the service it needs (if any).
ORACLE_PRESETS = {
    "grpo_hle.yaml": None,
    "gpqa.yaml": None,
    "grpo_program_bench.yaml": None,
    "grpo_terminal_bench.yaml": None,
    "grpo_swe.yaml": "sandbox_url",
    "grpo_osworld.yaml": "simulator_url",
}
SERVICE_KEYS = {
    "sandbox_url": "env.swe.sandbox_urls=[{}]",
    "simulator_url": "env.osworld.simulator_url={}",
}


@pytest.mark.parametrize("preset", list(ORACLE_PRESETS))
def test_the_reference_answers_earn_full_reward_through_the_preset_s_environment(
    preset, request, capsys
):
    overrides = []
    service = ORACLE_PRESETS[preset]
    if service is not None:
        overrides.append(SERVICE_KEYS[service].format(request.getfixturevalue(service)))
    assert main(["oracle", "--config", str(PRESETS / preset), *overrides]) == 0
    out = capsys.readouterr().out
    # Every shipped task's reference solves it: a scorer that lost one would show it here.
    assert "mean reward 1.000" in out, out
    assert "first miss" not in out


def test_a_wrong_reference_earns_nothing_and_the_oracle_fails(tmp_path: Path, capsys):
    # A program_bench record whose "solution" prints the difference, not the sum: the tests
    # run it in the sandbox and it fails them.
    record = {
        "id": "pb-wrong",
        "prompt": "Read two integers on one line and print their sum.",
        "solution": "a, b = map(int, input().split())\nprint(a - b)\n",
        "tests": [{"input": "2 3\n", "output": "5\n"}],
    }
    data = tmp_path / "wrong.jsonl"
    data.write_text(json.dumps(record) + "\n")
    preset = PRESETS / "grpo_program_bench.yaml"
    argv = ["oracle", "--config", str(preset), f"data.train.path={data}"]
    assert main([*argv, f"data.validation.path={data}"]) == 1
    out = capsys.readouterr().out
    assert "program_bench: 1 reference answers, mean reward 0.000" in out
    assert "first miss: record 0" in out


def test_an_environment_the_oracle_cannot_answer_is_refused_with_the_reason(capsys):
    # gdpval's reward is a judge's reading of files an episode writes: no answer to state.
    from dockyard.environments.base import ScoringGroup
    from dockyard.environments.oracle import NoReference, reference_sample

    group = ScoringGroup("g", "gdpval", "task", [], ground_truth="x")
    with pytest.raises(NoReference, match="the oracle writes reference answers for"):
        reference_sample(group)
