"""The ``gpqa`` and ``hle`` environments behind a real scorer and nats-server: records from the
shipped sample files, responses tokenized and decoded by a byte-level BPE (so the end-of-turn
token is in the text the scorer reads), scored rewards out; a record whose reference is not one
of its choices is a dead letter with the reason, not a retry."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import numpy as np

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.typed import MessagePlane
from dockyard.config.sections.env import EnvConfig
from dockyard.consumers.scorer import Scorer
from dockyard.environments.base import EnvironmentContext
from dockyard.models.tokenizers import train_bpe_tokenizer
from dockyard.schemas import DeadLetter, PromptGroup, Rollout, ScoredRollout, decode
from tests.integration.roles.factories import prompt_group, rollout
from tests.integration.roles.test_scorer import _count, stored, wait_for

ROOT = Path(__file__).resolve().parents[3]
TOKENIZER = train_bpe_tokenizer()


def _record(file: str, record_id: str) -> dict:
    lines = (ROOT / "configs/cpu/data" / file).read_text().splitlines()
    return next(row for row in map(json.loads, lines) if row["id"] == record_id)


def _group(group_id: str, env: str, row: dict, extra: dict) -> PromptGroup:
    return msgspec.structs.replace(
        prompt_group(group_id, generations=3),
        **{
            "environment": env,
            "prompt_text": row["question"],
            "prompt_token_ids": np.array(TOKENIZER(row["question"])["input_ids"], np.int32),
            "ground_truth": row["answer"],
            "extra": extra,
        },
    )


def _rollout(group: PromptGroup, responses: list[str]) -> Rollout:
    """The factory's rollout, re-tokenized with the BPE (the factory's tokenizer only has
    digits): response tokens then the EOS token, as an engine stops."""
    made = rollout(group, ["0"] * len(responses))
    samples = []
    for sample, text in zip(made.samples, responses, strict=True):
        ids = TOKENIZER(text, add_special_tokens=False)["input_ids"] + [TOKENIZER.eos_token_id]
        tokens = np.array(ids, dtype=np.int32)
        samples.append(
            msgspec.structs.replace(
                sample,
                **{
                    "response_token_ids": tokens,
                    "behaviour_logprobs": np.full(len(tokens), -0.1, dtype=np.float32),
                    "token_weight_versions": np.zeros(len(tokens), dtype=np.int64),
                    "loss_mask": np.ones(len(tokens), dtype=np.uint8),
                },
            )
        )
    return Rollout(group=group, samples=samples)


async def test_gpqa_and_hle_rollouts_are_scored_and_a_bad_reference_dead_lettered(
    data_plane_config,
):
    gpqa_row = _record("gpqa.jsonl", "mc-2")  # options (A)-(E), answer "(B)"
    hle_row = _record("hle.jsonl", "ex-2")  # exact answer 11.5
    bad_row = {**gpqa_row, "answer": "F"}  # not one of the prompt's A-E
    rollouts = [
        _rollout(
            _group("g-gpqa", "gpqa", gpqa_row, {"choices": gpqa_row["choices"]}),
            ["so the answer is (B).", "Answer: B or E", "Answer: E"],
        ),
        _rollout(
            _group("g-hle", "hle", hle_row, {"answer_type": hle_row["answer_type"]}),
            ["7.25 * 2 - 3 = 11.5\nAnswer: 11.50", "Answer: 11", ""],
        ),
        _rollout(_group("g-bad", "gpqa", bad_row, {}), ["Answer: F", "B", "C"]),
    ]
    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="scorer")
        for item in rollouts:
            await messages.publish(item)
        scorer = Scorer(
            messages, EnvironmentContext(env=EnvConfig()), TOKENIZER, scorer_id="s-choice"
        )
        task = asyncio.create_task(scorer.run())
        try:
            await wait_for(lambda: _count(plane, plane.names.scored, 2))
            await wait_for(lambda: _count(plane, plane.names.dead_letters, 1))
        finally:
            scorer.stop()
            await asyncio.wait_for(task, 10)
        scored = {
            s.group_id: s
            for s in (
                decode(m.headers, m.data, expected=ScoredRollout)
                for m in await stored(plane, plane.names.scored)
            )
        }
        (dead,) = await stored(plane, plane.names.dead_letters)
    assert [s.reward for s in scored["g-gpqa"].scores] == [1.0, 0.0, 0.0]
    assert [s.invalid_action for s in scored["g-gpqa"].scores] == [False, True, False]
    assert [s.reward for s in scored["g-hle"].scores] == [1.0, 0.0, 0.0]
    assert [s.invalid_action for s in scored["g-hle"].scores] == [False, False, True]
    letter = decode(dead.headers, dead.data, expected=DeadLetter)
    assert letter.reason == "bad_ground_truth"
