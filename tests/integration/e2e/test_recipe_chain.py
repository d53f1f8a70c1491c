"""``dockyard recipe v4`` (issue #27): stages run as real ``dockyard run`` processes, each in
its own run directory, each stage's exported model feeding the next through ``models_from``; a
finished stage is not run again, and a chain whose stage was SIGKILLed resumes there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml
from safetensors.torch import load_file

from dockyard.fleet.recipe import MARKER_FILE, RecipeError, plan_recipe
from tests.integration.e2e.conftest import QUICKSTART, ROOT, SMALL_RUN, run_dockyard, wait_until

STEPS = 2
STAGE_OVERRIDES = [*SMALL_RUN, "data_plane=null", f"grpo.max_num_steps={STEPS}"]


def write_recipe(tmp_path, stages: list[dict]) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"recipe": {"name": "chain"}, "stages": stages}))
    return str(path)


def chain(tmp_path) -> str:
    stage = {"config": str(QUICKSTART), "overrides": STAGE_OVERRIDES}
    return write_recipe(
        tmp_path,
        [
            {"name": "first", **stage},
            {"name": "second", **stage, "models_from": {"policy.model_name": "first"}},
        ],
    )


def resolved_model_name(run_dir) -> str:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["policy"]["model_name"]


@pytest.mark.slow
def test_a_chain_killed_in_its_second_stage_resumes_there_and_feeds_it_the_first_model(
    tmp_path,
):
    recipe, recipe_dir = chain(tmp_path), tmp_path / "out"
    first, second = recipe_dir / "first", recipe_dir / "second"
    command = [sys.executable, "-m", "dockyard", "--log-format", "json", "recipe", "v4"]
    command += ["--config", recipe, "--dir", str(recipe_dir)]
    # Its own process group: the kill takes the stage's `dockyard run` child down with it.
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        wait_until(lambda: (second / "config.yaml").exists(), 600, "the second stage to start")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    marker = json.loads((first / MARKER_FILE).read_text())
    first_model = first / "model"
    assert marker["model"] == str(first_model) and marker["checkpoint_step"] == STEPS
    assert not (second / MARKER_FILE).exists()
    # The first stage's model is its last checkpoint, exported.
    weights = load_file(first_model / "model.safetensors")
    checkpoint = load_file(first / "checkpoints" / f"step_{STEPS}" / "model.safetensors")
    assert weights.keys() == checkpoint.keys()
    assert all((weights[name] == checkpoint[name]).all() for name in weights)
    first_config = (first / "config.yaml").stat().st_mtime_ns

    result = run_dockyard("recipe", "v4", "--config", recipe, "--dir", str(recipe_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert [e["stage"] for e in events if e.get("event") == "recipe.stage_skipped"] == ["first"]
    assert [e["stage"] for e in events if e.get("event") == "recipe.stage_started"] == ["second"]
    assert (first / "config.yaml").stat().st_mtime_ns == first_config  # not run again
    assert resolved_model_name(second) == str(first_model)
    assert json.loads((second / MARKER_FILE).read_text())["checkpoint_step"] == STEPS
    assert f"second: {second / 'model'}" in result.stdout

    # Both stages done: a third invocation runs nothing.
    again = run_dockyard("recipe", "v4", "--config", recipe, "--dir", str(recipe_dir))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "recipe.stage_started" not in again.stderr


def test_a_stage_taking_a_model_from_a_later_or_unknown_stage_is_refused(tmp_path):
    stage = {"config": str(QUICKSTART)}
    recipe = write_recipe(
        tmp_path,
        [
            {"name": "a", **stage, "models_from": {"policy.model_name": "b"}},
            {"name": "b", **stage},
        ],
    )
    with pytest.raises(RecipeError, match=r"stages\.0\.models_from\.policy\.model_name"):
        plan_recipe(recipe, tmp_path / "out")


@pytest.mark.slow
def test_a_bad_key_in_a_later_stage_is_refused_before_any_stage_runs(tmp_path):
    stage = {"config": str(QUICKSTART), "overrides": STAGE_OVERRIDES}
    recipe = write_recipe(
        tmp_path,
        [
            {"name": "a", **stage},
            {"name": "b", **stage, "overrides": [*STAGE_OVERRIDES, "grpo.max_num_steps=-3"]},
        ],
    )
    result = run_dockyard("recipe", "v4", "--config", recipe, "--dir", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "stages.1 (b)" in result.stderr and "grpo.max_num_steps" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_stage_without_checkpoints_is_refused(tmp_path):
    recipe = write_recipe(
        tmp_path,
        [{"name": "a", "config": str(QUICKSTART), "overrides": ["checkpointing.enabled=false"]}],
    )
    with pytest.raises(RecipeError, match=r"stages\.0 \(a\)\.checkpointing\.enabled"):
        plan_recipe(recipe, tmp_path / "out")
