"""The recipe's teacher servers (issue #27): a stage's ``teacher_servers`` start one ``dockyard
model serve`` process per teacher alias from an earlier stage's exported model, the stage's run
is pointed at them (``on_policy_distillation.teachers.<alias>.model_name`` and ``base_url``), and
they stop when the stage ends, however it ends. Teacher servers that no sample could reach, or
whose model would be named twice, are refused before anything runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest

from dockyard.engines.prompt_logprobs_client import PromptLogprobsClient
from dockyard.fleet.recipe import MARKER_FILE, PlannedStage, RecipeError, plan_recipe, run_recipe
from dockyard.models.tiny import build_arithmetic_policy, save_policy
from tests.integration.e2e.conftest import QUICKSTART, SMALL_RUN
from tests.integration.e2e.test_recipe_chain import write_recipe
from tests.integration.roles.factories import TOKENIZER
from tests.integration.roles.test_teacher_routing import direct_logprobs

OPD = [
    *SMALL_RUN,
    "data_plane=null",
    "grpo.adv_estimator.name=opd",
    # OPD's advantage subtracts π_old: the quickstart's π_old := sg(π_θ) shortcut is off here.
    "policy.skip_prev_logprobs=false",
    "loss_fn.force_on_policy_ratio=false",
    "on_policy_distillation.enabled=true",
    "on_policy_distillation.teacher_model_by_agent_name.adder=adder_expert",
    "on_policy_distillation.teacher_model_by_agent_name.reverser=reverser_expert",
]
SEEDS = {"adder": 1, "reverser": 2}


def two_specialists_and_a_student(tmp_path: Path, **student: object) -> str:
    stage = {"config": str(QUICKSTART), "overrides": [*SMALL_RUN, "data_plane=null"]}
    servers = {
        "adder_expert": {"model_from": "adder"},
        "reverser_expert": {"model_from": "reverser", "precision": "float32"},
    }
    return write_recipe(
        tmp_path,
        [
            {"name": "adder", **stage},
            {"name": "reverser", **stage},
            {
                "name": "student",
                "config": str(QUICKSTART),
                "overrides": OPD,
                "teacher_servers": servers,
                **student,
            },
        ],
    )


def finished_specialists(recipe_dir: Path) -> dict[str, Path]:
    """The two specialists' stages as a finished run leaves them: a model and the marker."""
    models = {}
    for name, seed in SEEDS.items():
        model, tokenizer = build_arithmetic_policy(seed)
        models[name] = save_policy(model, tokenizer, recipe_dir / name / "model")
        marker = {"stage": name, "model": str(models[name]), "checkpoint_step": 2}
        (recipe_dir / name / MARKER_FILE).write_text(json.dumps(marker))
    return models


def overrides_of(overrides: Sequence[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in overrides)


@pytest.mark.slow
def test_the_stage_runs_against_a_server_per_teacher_which_stops_when_it_ends(tmp_path):
    recipe_dir = tmp_path / "out"
    stages = plan_recipe(two_specialists_and_a_student(tmp_path), recipe_dir)
    models = finished_specialists(recipe_dir)
    prompt = np.asarray(TOKENIZER("12+34=")["input_ids"], dtype=np.int64)
    response = np.asarray(TOKENIZER("46")["input_ids"], dtype=np.int64)
    seen: dict[str, str] = {}

    def runner(stage: PlannedStage, overrides: Sequence[str]) -> int:
        # In place of `dockyard run`: what its teacher scorer would ask, asked while it runs.
        given = overrides_of(overrides)
        for alias, specialist in (("adder_expert", "adder"), ("reverser_expert", "reverser")):
            key = f"on_policy_distillation.teachers.{alias}"
            assert given[f"{key}.model_name"] == str(models[specialist])
            seen[alias] = given[f"{key}.base_url"]
            client = PromptLogprobsClient(
                seen[alias], given[f"{key}.model_name"], timeout_s=60, batch_size=1
            )
            (got,) = asyncio.run(client.continuation_logprobs(prompt, [response]))
            expected = direct_logprobs(
                build_arithmetic_policy(SEEDS[specialist])[0], prompt, response
            )
            np.testing.assert_allclose(got, expected, atol=1e-5)
        return 7  # the stage fails: its servers must stop all the same

    with pytest.raises(RecipeError, match="stage student exited with status 7"):
        run_recipe(stages, runner)
    assert sorted(seen) == ["adder_expert", "reverser_expert"]
    assert seen["adder_expert"] != seen["reverser_expert"]
    for url in seen.values():
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=5)
    assert (recipe_dir / "student" / "teacher_adder_expert.log").stat().st_size > 0


@pytest.mark.parametrize(
    ("student", "key"),
    [
        # Only the adder's agent is mapped: the reverser's server would teach nobody.
        (
            {"overrides": [*OPD[:-1]]},
            r"stages\.2\.teacher_servers\.reverser_expert",
        ),
        (
            {"overrides": [*SMALL_RUN, "data_plane=null"]},  # OPD off
            r"stages\.2\.teacher_servers\.adder_expert",
        ),
        (
            {
                "models_from": {
                    "on_policy_distillation.teachers.adder_expert.model_name": "reverser"
                }
            },
            r"stages\.2\.models_from\.on_policy_distillation\.teachers\.adder_expert\.model_name",
        ),
        (
            {"teacher_servers": {"adder_expert": {"model_from": "student"}}},
            r"stages\.2\.teacher_servers\.adder_expert\.model_from",
        ),
        (
            {"teacher_servers": {"adder_expert": {"model_from": "adder", "precision": "fp8"}}},
            r"stages\.2\.teacher_servers\.adder_expert\.precision",
        ),
        (
            # The served teacher's precision is the server's: the run config may not set one.
            {"overrides": [*OPD, "on_policy_distillation.teachers.adder_expert.precision=float32"]},
            r"on_policy_distillation\.teachers\.adder_expert\.precision",
        ),
    ],
)
def test_teacher_servers_that_cannot_work_as_written_are_refused_before_any_stage_runs(
    tmp_path, student, key
):
    with pytest.raises(RecipeError, match=key):
        plan_recipe(two_specialists_and_a_student(tmp_path, **student), tmp_path / "out")
    assert not (tmp_path / "out").exists()
