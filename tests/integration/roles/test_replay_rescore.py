"""``dockyard replay rescore`` and ``replay diff`` on a real nats-server: stored rollouts scored
by the math environment with the symbolic checker on, then off, and the diff of the two.

Expected rewards come from the math environment's rule (1 when the boxed answer denotes the
ground truth): with ``env.math.symbolic_equivalence`` off, only answers equal as text or as
numbers count, so ``\\sqrt{4}`` and ``\\sqrt{9}-1`` stop matching ``2``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.typed import MessagePlane
from dockyard.cli import main
from dockyard.models import load_tokenizer
from dockyard.schemas import ScoredRollout, decode
from tests.integration.roles.factories import prompt_group, rollout

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
BPE = "tiny://qwen2-bpe"  # byte-level: it spells LaTeX, the character tokenizer does not

#: group id -> boxed answers; the ground truth of every group is 2.
ANSWERS = {
    "g-roots": [r"\boxed{\sqrt{4}}", r"\boxed{2}"],
    "g-mixed": [r"\boxed{3}", r"\boxed{\sqrt{9}-1}"],
}
SYMBOLIC_ON = {"g-roots": [1.0, 1.0], "g-mixed": [0.0, 1.0]}
SYMBOLIC_OFF = {"g-roots": [0.0, 1.0], "g-mixed": [0.0, 0.0]}


def _config_args(config, *overrides: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [
        "--config",
        str(QUICKSTART),
        f"policy.model_name={BPE}",
        f"data_plane.url={config.url}",
        f"data_plane.namespace={config.namespace}",
        *overrides,
    ]


def _url_args(config) -> list[str]:  # type: ignore[no-untyped-def]
    return ["--url", config.url, "--namespace", config.namespace]


def _store_rollouts(config, groups: dict[str, list[str]]) -> None:  # type: ignore[no-untyped-def]
    tokenizer = load_tokenizer(BPE)

    async def run() -> None:
        async with JetStreamPlane(config) as plane:
            messages = MessagePlane(plane, stage="test")
            for group_id, answers in groups.items():
                group = msgspec.structs.replace(
                    prompt_group(group_id, generations=len(answers)),
                    **{"environment": "math", "ground_truth": "2"},
                )
                await messages.publish(rollout(group, answers, tokenizer=tokenizer))

    asyncio.run(run())


def _stored_rewards(config, subject: str) -> dict[str, list[float]]:  # type: ignore[no-untyped-def]
    async def run() -> dict[str, list[float]]:
        async with JetStreamPlane(config, provision=False) as plane:
            out = {}
            async for stored in plane.replay(subject):
                scored = decode(stored.headers, stored.data, expected=ScoredRollout)
                out[scored.rollout.group.group_id] = [s.reward for s in scored.scores]
            return out

    return asyncio.run(run())


@pytest.mark.slow
def test_rescore_with_the_checker_on_and_off_then_diff(
    data_plane_config, capsys: pytest.CaptureFixture[str]
):
    _store_rollouts(data_plane_config, ANSWERS)
    ns = data_plane_config.namespace
    on = ["--subject", "rollouts", "--env", "math", "--to-subject", "sym-on"]
    off = ["--subject", "rollouts", "--env", "math", "--to-subject", f"{ns}.rescored.sym-off"]
    assert main(["replay", "rescore", *on, *_config_args(data_plane_config)]) == 0
    assert (
        main(
            [
                "replay",
                "rescore",
                *off,
                *_config_args(data_plane_config, "env.math.symbolic_equivalence=false"),
            ]
        )
        == 0
    )
    assert _stored_rewards(data_plane_config, f"{ns}.rescored.sym-on") == SYMBOLIC_ON
    assert _stored_rewards(data_plane_config, f"{ns}.rescored.sym-off") == SYMBOLIC_OFF
    capsys.readouterr()

    diff = ["replay", "diff", "--subject", "sym-off", "--against", "sym-on"]
    assert main([*diff, "--json", *_url_args(data_plane_config)]) == 0
    report = json.loads(capsys.readouterr().out)
    # Rows: the baseline (checker on); columns: checker off. Counted from the tables above.
    assert report["confusion"] == {"0->0": 1, "0->1": 0, "1->0": 2, "1->1": 1}
    assert report["non_binary_pairs"] == 0
    assert report["by_environment"] == {
        "math": {
            "groups": 2,
            "samples": 4,
            "changed_groups": 2,
            "changed_samples": 2,
            "against_mean_reward": 3 / 4,
            "subject_mean_reward": 1 / 4,
        }
    }
    groups = {g["group_id"]: (g["against"], g["subject"]) for g in report["groups"]}
    assert groups == {g: (SYMBOLIC_ON[g], SYMBOLIC_OFF[g]) for g in ANSWERS}
    assert report["unusable"] == [] and report["only_in_subject"] == []

    assert main([*diff, *_url_args(data_plane_config)]) == 0
    text = capsys.readouterr().out
    assert "g-roots [math]  1 1 -> 0 1" in text
    assert "g-mixed [math]  0 1 -> 0 0" in text


def test_a_group_that_cannot_be_rescored_is_named_and_fails_the_command(
    data_plane_config, capsys: pytest.CaptureFixture[str]
):
    _store_rollouts(data_plane_config, {"g-fine": [r"\boxed{2}"]})

    async def add_stray() -> int:
        async with JetStreamPlane(data_plane_config) as plane:
            ack = await plane.publish(plane.names.rollouts, b"not a frame", msg_id="stray")
            return ack.seq

    stray_seq = asyncio.run(add_stray())
    args = ["--subject", "rollouts", "--env", "math", "--to-subject", "partial"]
    assert main(["replay", "rescore", *args, *_config_args(data_plane_config)]) == 1
    err = capsys.readouterr().err
    assert f"not re-scored: seq {stray_seq}:" in err
    rewards = _stored_rewards(data_plane_config, f"{data_plane_config.namespace}.rescored.partial")
    assert rewards == {"g-fine": [1.0]}


@pytest.mark.parametrize(
    "target",
    [
        "rollouts",
        "scored",
        "prompts",
        "dead",
        "weights",
        "{ns}.experience.scored",
        "{ns}.chunks.abc.0",
        "{ns}.blobs.abc.data",
        "{ns}.leases.abc.reader",
        "{ns}.stored.{ns}.experience.scored",
        "{ns}.elsewhere",
        "{ns}.rescored.*",
        "{ns}.rescored.>",
    ],
)
def test_a_live_or_foreign_target_is_refused(
    data_plane_config, target: str, capsys: pytest.CaptureFixture[str]
):
    subject = target.format(ns=data_plane_config.namespace)
    args = ["--subject", "rollouts", "--env", "math", "--to-subject", subject]
    assert main(["replay", "rescore", *args, *_config_args(data_plane_config)]) == 2
    assert "--to-subject" in capsys.readouterr().err


def test_a_target_that_already_holds_a_rescore_is_refused(
    data_plane_config, capsys: pytest.CaptureFixture[str]
):
    _store_rollouts(data_plane_config, {"g-once": [r"\boxed{2}"]})
    args = ["--subject", "rollouts", "--env", "math", "--to-subject", "once"]
    assert main(["replay", "rescore", *args, *_config_args(data_plane_config)]) == 0
    capsys.readouterr()
    assert main(["replay", "rescore", *args, *_config_args(data_plane_config)]) == 2
    assert "already holds messages" in capsys.readouterr().err


def test_a_plane_provisioned_before_rescores_existed_is_refused_with_the_fix(
    data_plane_config, capsys: pytest.CaptureFixture[str]
):
    _store_rollouts(data_plane_config, {"g-old": [r"\boxed{2}"]})

    async def as_an_older_version_left_it() -> None:
        async with JetStreamPlane(data_plane_config, provision=False) as plane:
            info = await plane.js.stream_info(plane.names.experience_stream.name)
            info.config.subjects = [plane.names.rollouts, plane.names.scored]
            await plane.js.update_stream(info.config)

    asyncio.run(as_an_older_version_left_it())
    args = ["--subject", "rollouts", "--env", "math", "--to-subject", "late"]
    assert main(["replay", "rescore", *args, *_config_args(data_plane_config)]) == 2
    assert "provision it again" in capsys.readouterr().err
