"""A group's message ids, the group id read back out of them, and dead letters' ids."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from dockyard.schemas import DeadLetter, PromptGroup, Rollout, ScoredRollout
from dockyard.schemas.prompt import group_id_of
from tests.unit.schemas.schema_factories import make_dead_letter, make_prompt_group

GROUP_MESSAGES = (PromptGroup.SCHEMA_NAME, Rollout.SCHEMA_NAME, ScoredRollout.SCHEMA_NAME)


@pytest.mark.parametrize("schema", GROUP_MESSAGES)
def test_the_group_id_comes_back_even_with_colons_in_it(schema):
    group = make_prompt_group(group_id="run-7:e0:i12", attempt=3)
    assert group_id_of(group.message_id_as(schema), GROUP_MESSAGES) == "run-7:e0:i12"


@pytest.mark.parametrize(
    "message_id",
    ["weight_version:4", "dead_letter:scorer:id=x", "rollout:g1", "rollout::3", "rollout:g:x", ""],
)
def test_other_message_ids_have_no_group(message_id):
    assert group_id_of(message_id, GROUP_MESSAGES) is None


def _dead_letter(**fields: object) -> DeadLetter:
    return msgspec.structs.replace(make_dead_letter(), **fields)


def test_an_empty_original_message_id_falls_back_to_the_stream_position() -> None:
    # docs/wire-format.md: "An empty `Nats-Msg-Id` is no id: the message's dead letter is
    # identified by its stream position" — `id=` would give every such letter of a stage one id.
    letter = _dead_letter(original_message_id="", original_stream_seq=7)
    assert letter.message_id() == "dead_letter:scorer:seq=dockyard.rollouts#7"
    other = _dead_letter(original_message_id="", original_stream_seq=8)
    assert other.message_id() != letter.message_id()


def test_an_empty_id_without_a_position_falls_back_to_the_payload_hash() -> None:
    payload = b"\x28\xb5\x2f\xfd garbage"
    letter = _dead_letter(
        original_message_id="", original_stream_seq=None, original_payload=payload
    )
    expected = "dead_letter:scorer:sha256=" + hashlib.sha256(payload).hexdigest()[:32]
    assert letter.message_id() == expected
