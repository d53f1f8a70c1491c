"""Screenshots in, actions out, under a real run (issue #22): `dockyard run` of the screenshot
preset (configs/cpu/grpo_osworld_screenshot.yaml: the tiny Qwen2-VL, torch engine) against a
real `dockyard osworld serve` (the stand-in for OSWorld's VMs) and a real nats-server, a few
steps. The ledger shows every group trained exactly once; the rollouts, read back from the
broker with `dockyard replay export`, carry each episode's screenshots — decoded and compared
with the same desktop rendered here from the task, replayed through the simulator's own rules —
one per expanded placeholder run of the sample's tokens."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

from dockyard.environments.osworld.controller_client import PKGS_PREFIX
from dockyard.environments.osworld.desktop import Desktop
from dockyard.environments.osworld.session import action_of
from dockyard.environments.osworld.simulator import execute
from dockyard.environments.osworld.tasks import parse_task
from dockyard.models import load_processor
from dockyard.models.vision import placeholder_runs
from tests.integration.e2e.conftest import ROOT, run_dockyard
from tests.integration.e2e.ledger_checks import (
    assert_every_group_accounted,
    assert_exactly_once,
    metric_steps,
)
from tests.osworld_simulator import simulator_command
from tests.sandbox_service import sandbox_service

pytestmark = pytest.mark.slow

PRESET = ROOT / "configs" / "cpu" / "grpo_osworld_screenshot.yaml"
STEPS = 2
ENDS_TASK = ("DONE", "FAIL")


def pixels(png: bytes) -> bytes:
    with Image.open(io.BytesIO(png)) as image:
        return image.convert("RGB").tobytes()


def expected_screens(task_json: str, tool_calls: list[dict[str, object]]) -> list[bytes]:
    """The screens an episode was shown: the task's desktop after its setup, then after each
    call that observed (ran without a refusal and did not end the task), the simulator's
    rules applied here to a desktop of our own."""
    desktop = Desktop.from_spec(parse_task(task_json).desktop)
    screens = [desktop.screenshot()]
    for call in tool_calls:
        if call["error"] is not None or call["result"] is None:  # refused, or never run
            continue
        code = action_of(json.loads(str(call["arguments_json"])))
        if code.strip() in ENDS_TASK:
            continue
        if code.strip() != "WAIT":
            execute(desktop, {"command": ["python", "-c", PKGS_PREFIX + code], "shell": False})
        screens.append(desktop.screenshot())
    return screens


def test_a_screenshot_run_trains_each_group_once_and_its_rollouts_carry_the_screens(
    tmp_path, nats_server_factory
):
    server = nats_server_factory()
    run_dir = tmp_path / "run"
    with sandbox_service(simulator_command()) as simulator_url:
        result = run_dockyard(
            "run",
            "--config",
            str(PRESET),
            f"env.osworld.simulator_url={simulator_url}",
            f"data_plane.url={server.url}",
            f"grpo.max_num_steps={STEPS}",
            "grpo.val_period=0",
            "--run-dir",
            str(run_dir),
            timeout=900,
        )
    assert result.returncode == 0, result.stderr[-4000:]
    assert metric_steps(run_dir) == list(range(1, STEPS + 1))
    trained = assert_exactly_once(run_dir)
    assert trained
    assert_every_group_accounted(run_dir)

    out = tmp_path / "rollouts.jsonl"
    export = run_dockyard(
        "replay",
        "export",
        "--subject",
        "rollouts",
        "--config",
        str(PRESET),
        f"data_plane.url={server.url}",
        "--out",
        str(out),
    )
    assert export.returncode == 0, export.stderr[-3000:]
    rollouts = [json.loads(line)["message"] for line in out.read_text().splitlines()]
    assert {r["group"]["group_id"] for r in rollouts} >= set(trained)
    image_token = load_processor("tiny://qwen2-vl-bpe").image_token_id  # type: ignore[union-attr]
    shown = 0
    for rollout in rollouts:
        task = rollout["group"]["extra"]["task"]
        for sample in rollout["samples"]:
            images = [base64.b64decode(image) for image in sample["images"]]
            tokens = sample["prompt_token_ids"] + sample["response_token_ids"]
            runs = placeholder_runs(tokens, image_token)
            assert len(runs) == len(images) >= 1  # the first screen, at least
            assert runs[0][0] + runs[0][1] <= len(sample["prompt_token_ids"])
            expected = expected_screens(task, sample["tool_calls"])
            # An episode cut by its budget shows a prefix of its screens.
            assert [pixels(png) for png in images] == [pixels(png) for png in expected][
                : len(images)
            ]
            shown += len(images)
    assert shown >= len(rollouts)
