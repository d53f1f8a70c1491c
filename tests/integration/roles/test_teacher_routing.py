"""Multi-teacher on-policy distillation over a real nats-server (issue #27): prompts read from a
file dataset whose records name their agents (``fields.agent``), the scorer pool routes each
rollout to the teacher its agent name selects (two real tiny Qwen2 teachers, loaded from disk
into the scorer or served each by its own ``dockyard model serve`` process), dead-letters a
rollout whose agent has no teacher with that reason, and the OPD advantage the trainer builds
from the scored rollouts on the wire equals ``log π_teacher − log π_student`` computed by hand
from direct forwards of the two models. A teacher server that is down fails the scoring: the
rollout is retried, then dead-lettered with the reason, and none is lost."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.typed import MessagePlane
from dockyard.config.loader import load_config
from dockyard.config.master import MasterConfig
from dockyard.config.sections.data import DatasetConfig
from dockyard.consumers.trainer.batch import build_batch
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.data.catalog import build_dataset
from dockyard.environments.base import EnvironmentContext
from dockyard.fleet.teacher_servers import teacher_server
from dockyard.models.tiny import build_arithmetic_policy, save_policy
from dockyard.producers.prompts import make_prompt_group
from dockyard.schemas import DeadLetter, Rollout, ScoredRollout, decode
from tests.integration.roles.factories import TOKENIZER, rollout
from tests.integration.roles.test_scorer import _count, running_scorer, stored, wait_for

TEACHER_SEEDS = {"adder_expert": 1, "reverser_expert": 2}
AGENTS = {"adder": "adder_expert", "reverser": "reverser_expert"}


@pytest.fixture(scope="module")
def teacher_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("teachers")
    dirs = {}
    for alias, seed in TEACHER_SEEDS.items():
        model, tokenizer = build_arithmetic_policy(seed)
        dirs[alias] = save_policy(model, tokenizer, root / alias)
    return dirs


@pytest.fixture(scope="module")
def teacher_urls(teacher_dirs: dict[str, Path]) -> Iterator[dict[str, str]]:
    """Each teacher served by its own ``dockyard model serve`` process."""
    with ExitStack() as stack:
        yield {
            alias: stack.enter_context(
                teacher_server(path, "float32", path.parent / f"{alias}.log")
            ).url
            for alias, path in teacher_dirs.items()
        }


def opd_config(teacher_dirs: dict[str, Path], urls: dict[str, str] | None = None) -> MasterConfig:
    """Teachers loaded in the scorer, or with ``urls`` asked over HTTP."""
    overrides = ["grpo.adv_estimator.name=opd", "on_policy_distillation.enabled=true"]
    # OPD's advantage subtracts π_old: the quickstart's π_old := sg(π_θ) shortcut is off here.
    overrides += ["policy.skip_prev_logprobs=false", "loss_fn.force_on_policy_ratio=false"]
    # The teacher scorer's log-probs are untempered, so the student samples at temperature 1
    # here (as the V4 recipe's student does) and the hand computation below needs none.
    overrides.append("policy.generation.temperature=1.0")
    for alias, path in teacher_dirs.items():
        overrides.append(f"on_policy_distillation.teachers.{alias}.model_name={path}")
        overrides.append(
            f"on_policy_distillation.teachers.{alias}.precision=float32"
            if urls is None
            else f"on_policy_distillation.teachers.{alias}.base_url={urls[alias]}"
        )
    overrides += [
        f"on_policy_distillation.teacher_model_by_agent_name.{agent}={alias}"
        for agent, alias in AGENTS.items()
    ]
    # No default teacher: an agent outside the map has nobody to learn from.
    return load_config("configs/quickstart.yaml", overrides)


def direct_logprobs(model: torch.nn.Module, prompt: np.ndarray, response: np.ndarray) -> np.ndarray:
    """``log p(response[j] | prompt, response[:j])`` from one plain forward."""
    ids = torch.as_tensor(np.concatenate([prompt, response]).astype(np.int64))[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
    return logprobs[positions, torch.as_tensor(response.astype(np.int64))].numpy()


ROWS = [  # one file mixing the domains, each record naming its agent
    {"prompt": "12+34=", "answer": "46", "domain": "adder"},
    {"prompt": "21+43=", "answer": "12", "domain": "reverser"},
    {"prompt": "11+11=", "answer": "22", "domain": "stranger"},
]
ANSWERS = [["46", "47"], ["12", "34"], ["22"]]


def rollouts_from_a_file_dataset(tmp_path: Path) -> dict[str, Rollout]:
    """The prompts as the dispatcher publishes them: read from a JSONL file whose
    ``domain`` field is mapped to the agent (``data.train.fields.agent``)."""
    path = tmp_path / "mixture.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    dataset = build_dataset(
        DatasetConfig(name="mixture", path=str(path), fields={"agent": "domain"}), "teacher"
    )
    rollouts = {}
    for index, answers in enumerate(ANSWERS):
        group = make_prompt_group(
            dataset[index],
            TOKENIZER,
            run_id="opd",
            dataset_name=dataset.name,
            epoch=0,
            position=index,
            num_generations=len(answers),
            weight_version=0,
        )
        rollouts[group.agent] = rollout(group, answers)
    return rollouts


async def published(
    plane: JetStreamPlane, sent: dict[str, Rollout], config: MasterConfig
) -> tuple[MessagePlane, EnvironmentContext]:
    """The rollouts on the plane, and the scorer's view of ``config``."""
    messages = MessagePlane(plane, stage="scorer")
    for message in sent.values():
        await messages.publish(message)
    return messages, EnvironmentContext(env=config.env, distillation=config.on_policy_distillation)


@pytest.mark.slow
@pytest.mark.parametrize("teachers", ["in_process", "served"])
async def test_each_agent_is_scored_by_its_teacher_and_an_unmapped_agent_is_dead_lettered(
    data_plane_config, teacher_dirs, tmp_path, teachers, request
):
    urls = request.getfixturevalue("teacher_urls") if teachers == "served" else None
    config = opd_config(teacher_dirs, urls)
    sent = rollouts_from_a_file_dataset(tmp_path)
    async with JetStreamPlane(data_plane_config) as plane:
        messages, context = await published(plane, sent, config)
        async with running_scorer(messages, context):
            await wait_for(lambda: _count(plane, plane.names.scored, 2), timeout_s=120)
            await wait_for(lambda: _count(plane, plane.names.dead_letters, 1), timeout_s=60)
        scored = {
            s.rollout.group.agent: s
            for s in (
                decode(m.headers, m.data, expected=ScoredRollout)
                for m in await stored(plane, plane.names.scored)
            )
        }
        (dead,) = await stored(plane, plane.names.dead_letters)
        letter = decode(dead.headers, dead.data, expected=DeadLetter)
        lag = await plane.consumer_lag(plane.names.rollout_consumer)

    assert sorted(scored) == ["adder", "reverser"]
    assert letter.reason == "no_teacher" and "'stranger'" in letter.message
    assert lag.backlog == 0  # the dead letter settled its rollout too

    teachers = {alias: build_arithmetic_policy(seed)[0] for alias, seed in TEACHER_SEEDS.items()}
    for agent, alias in AGENTS.items():
        mine, other = alias, next(a for a in TEACHER_SEEDS if a != alias)
        samples = sent[agent].samples
        for sample, score in zip(samples, scored[agent].scores, strict=True):
            expected = direct_logprobs(
                teachers[mine], sample.prompt_token_ids, sample.response_token_ids
            )
            np.testing.assert_allclose(score.teacher_logprobs, expected, atol=1e-5)
            assert score.detail == f"teacher {mine}"
            # The two teachers disagree, so the wrong teacher would have failed above.
            wrong = direct_logprobs(
                teachers[other], sample.prompt_token_ids, sample.response_token_ids
            )
            assert not np.allclose(score.teacher_logprobs, wrong, atol=1e-3)

    # The trainer's view: the OPD advantage of every response token is the teacher's
    # log-prob minus the student's (π_old), and zero on every other position.
    student, _ = build_arithmetic_policy(0)
    trainer = PolicyTrainer(student, config)
    groups = [scored["adder"], scored["reverser"]]
    batch = build_batch(groups, TOKENIZER.pad_token_id)
    prev = trainer.batch_logprobs(trainer.model, batch)
    advantages = trainer.advantages(batch, prev, None).cpu().numpy()
    row = 0
    for group in groups:
        for sample in sent[group.rollout.group.agent].samples:
            prompt, response = sample.prompt_token_ids, sample.response_token_ids
            teacher = teachers[AGENTS[group.rollout.group.agent]]
            by_hand = direct_logprobs(teacher, prompt, response) - direct_logprobs(
                student, prompt, response
            )
            start = len(prompt) - 1
            np.testing.assert_allclose(
                advantages[row, start : start + len(response)], by_hand, atol=1e-4
            )
            outside = np.delete(advantages[row], np.s_[start : start + len(response)])
            assert not outside.any()
            assert np.abs(by_hand).max() > 1e-3  # a zero advantage would prove nothing
            row += 1


def closed_port_url() -> str:
    # A port the system just handed out and nobody listens on: connections are refused.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.slow
async def test_a_teacher_server_that_is_down_fails_scoring_retried_then_dead_lettered(
    data_plane_config, teacher_dirs, tmp_path
):
    down = closed_port_url()
    config = opd_config(teacher_dirs, {alias: down for alias in teacher_dirs})
    sent = rollouts_from_a_file_dataset(tmp_path)
    async with JetStreamPlane(data_plane_config) as plane:
        messages, context = await published(plane, sent, config)
        async with running_scorer(messages, context) as scorer:
            await wait_for(lambda: _count(plane, plane.names.dead_letters, 3), timeout_s=120)
        letters = [
            decode(m.headers, m.data, expected=DeadLetter)
            for m in await stored(plane, plane.names.dead_letters)
        ]
        lag = await plane.consumer_lag(plane.names.rollout_consumer)
        scored = await stored(plane, plane.names.scored)

    assert scored == []
    assert lag.backlog == 0  # every rollout settled: scored, retried or dead-lettered
    by_reason = sorted((letter.reason, down in letter.message) for letter in letters)
    # The two routed rollouts failed on the server (named in the message) on every delivery;
    # the stranger has no teacher whatever the servers do.
    assert by_reason == [
        ("environment_error", True),
        ("environment_error", True),
        ("no_teacher", False),
    ]
    assert scorer.stats.by_env["teacher"].failures == 2 * scorer.max_deliver
