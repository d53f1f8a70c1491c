"""Pure pieces of the plane: naming, chunking, retention, server config, dead letters, --since."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dockyard.broker import chunking
from dockyard.broker.dead_letters import build_dead_letter, read_dead_letter
from dockyard.broker.embedded import EmbeddedServerSettings, ServerUser, render_config
from dockyard.broker.inspect import parse_since, resolve_subject
from dockyard.broker.names import PlaneNames, Retention, subject_matches
from dockyard.broker.plane import (
    HEADER_DEAD_REASON,
    OutgoingMessage,
    PayloadError,
    StoredMessage,
)
from dockyard.broker.security import role_grants
from dockyard.broker.trace import _answered as trace_answered
from dockyard.broker.weight_blobs.base import BlobRef, prunable

NAMES = PlaneNames("run1")


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        ("a.*.meta", "a.x.meta", True),
        ("a.*.meta", "a.x.data", False),
    ],
)
def test_subject_matching(pattern: str, subject: str, expected: bool) -> None:
    assert subject_matches(pattern, subject) is expected


def test_every_subject_has_exactly_one_stream() -> None:
    subjects = [
        NAMES.prompts,
        NAMES.rollouts,
        NAMES.scored,
        NAMES.weight_events,
        NAMES.dead_letters,
    ]
    subjects += [NAMES.chunk_subject("ref", 0), NAMES.blob_data_subject("ab")]
    for subject in subjects:
        owners = [
            s for s in NAMES.all_streams() if any(subject_matches(p, subject) for p in s.subjects)
        ]
        assert len(owners) == 1, subject
    assert NAMES.prompts_stream.retention is Retention.WORK_QUEUE
    assert NAMES.experience_stream.retention is Retention.LIMITS
    with pytest.raises(KeyError):
        NAMES.stream_for_subject("other.subject")


def _as_received(message: OutgoingMessage) -> dict[str, str]:
    """Its headers as a consumer reads them: the publish sends its id as ``Nats-Msg-Id``."""
    return {**message.headers, "Nats-Msg-Id": message.msg_id}


@given(size=st.integers(min_value=1, max_value=5000), chunk=st.integers(min_value=1, max_value=977))
def test_split_and_join_are_inverse(size: int, chunk: int) -> None:
    payload = os.urandom(size)
    split = chunking.split(
        NAMES, NAMES.scored, payload, msg_id="m", headers={"A": "b"}, chunk_size=chunk
    )
    assert len(split.chunks) == -(-size // chunk)
    assert all(len(c.payload) <= chunk for c in split.chunks)
    reference = chunking.reference_of(_as_received(split.reference))
    assert reference is not None and split.reference.payload == b""
    assert chunking.join(reference, [c.payload for c in split.chunks]) == payload
    assert chunking.strip_chunk_headers(split.reference.headers) == {"A": "b"}


def test_join_refuses_missing_or_altered_chunks() -> None:
    split = chunking.split(NAMES, NAMES.scored, b"x" * 100, msg_id="m", headers={}, chunk_size=30)
    reference = chunking.reference_of(_as_received(split.reference))
    assert reference is not None
    parts = [c.payload for c in split.chunks]
    with pytest.raises(PayloadError, match="bytes, expected"):
        chunking.join(reference, parts[:-1])
    with pytest.raises(PayloadError, match="SHA-256"):
        chunking.join(reference, [parts[0].replace(b"x", b"y"), *parts[1:]])


def _ref(version: int, at: float) -> BlobRef:
    return BlobRef(version, f"sha256:{version:064x}", 1, "u", at)


def test_prunable_keeps_the_newest_and_respects_the_grace_period() -> None:
    refs = [_ref(v, at=100.0 + v) for v in range(5)]
    assert prunable(refs, keep_last=3, grace_s=10, now=105) == []  # superseded too recently
    assert [r.version for r in prunable(refs, keep_last=3, grace_s=10, now=111.5)] == [0]
    assert [r.version for r in prunable(refs, keep_last=3, grace_s=10, now=1000)] == [0, 1]
    assert prunable(refs[:2], keep_last=3, grace_s=0, now=1000) == []


def test_server_config_quotes_values_and_renders_permissions(tmp_path: Path) -> None:
    user = ServerUser("rollout", 'pa"ss', publish_allow=("a.b",), publish_deny=("c.>",))
    text = render_config(
        EmbeddedServerSettings(store_dir=tmp_path / "with space", users=(user,), max_payload=123),
        port=4333,
    )
    assert "port: 4333" in text and "max_payload: 123" in text
    assert f'store_dir: "{tmp_path}/with space"' in text
    assert 'password: "pa\\"ss"' in text
    assert 'publish: { allow: ["a.b"], deny: ["c.>"] }' in text


def test_only_the_trainer_publishes_weight_events_and_no_role_changes_streams() -> None:
    grants = role_grants(NAMES)
    allowed = {role for role, grant in grants.items() if NAMES.weight_events in grant.publish}
    assert allowed == {"trainer"}
    # The admin is in the data account, unrestricted; every other role has a grant, and none
    # creates, updates or deletes a stream or consumer.
    assert set(grants) == {"dispatcher", "rollout", "scorer", "trainer"}
    changes = ("STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE", "CONSUMER.CREATE")
    changes += ("CONSUMER.DURABLE", "CONSUMER.DELETE", "STREAM.MSG.GET")
    assert [call for g in grants.values() for call in g.api if call.startswith(changes)] == []
    assert NAMES.rollouts in grants["rollout"].publish
    # Workers lease the blobs they read; only the trainer writes blob data.
    assert "run1.leases.>" in grants["rollout"].publish
    assert "run1.blobs.>" not in grants["rollout"].publish


def test_dead_letter_keeps_the_original_and_says_why() -> None:
    original = StoredMessage(
        "run1_experience", NAMES.scored, 7, datetime.now(UTC), {"Nats-Msg-Id": "m7"}, b"\x00bad"
    )
    letter = build_dead_letter(NAMES, original, "corrupt_frame", "line one\nline two", stage="s")
    again = build_dead_letter(NAMES, original, "corrupt_frame", "line one\nline two", stage="s")
    assert letter.msg_id == again.msg_id  # deterministic: reported twice, stored once
    assert letter.subject == NAMES.dead_letters
    assert letter.headers[HEADER_DEAD_REASON] == "corrupt_frame"
    stored = StoredMessage(
        "d", letter.subject, 1, original.timestamp, letter.headers, letter.payload
    )
    decoded = read_dead_letter(stored)
    assert decoded.original_payload == b"\x00bad" and decoded.original_message_id == "m7"
    assert decoded.original_stream_seq == 7 and decoded.message == "line one\nline two"


def test_messages_with_an_empty_id_get_dead_letters_of_their_own() -> None:
    # An empty Nats-Msg-Id names nothing: the dead letter is identified by the stream position
    # (docs/wire-format.md, the dead letter's Nats-Msg-Id), not by '' shared with every other.
    def refused(seq: int) -> OutgoingMessage:
        original = StoredMessage(
            "run1_experience", NAMES.scored, seq, datetime.now(UTC), {"Nats-Msg-Id": ""}, b"x"
        )
        return build_dead_letter(NAMES, original, "bad_header", "poison")

    assert refused(3).msg_id == f"dead_letter:data_plane:seq={NAMES.scored}#3"
    assert refused(3).msg_id != refused(4).msg_id


def test_since_parses_relative_and_absolute_times() -> None:
    now = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
    assert parse_since("10m", now) == now - timedelta(minutes=10)
    assert parse_since("2025-01-01T10:00:00Z") == datetime(2025, 1, 1, 10, tzinfo=UTC)
    assert parse_since("2025-01-01T10:00:00").tzinfo is UTC
    with pytest.raises(ValueError, match="relative time"):
        parse_since("yesterday")
    assert resolve_subject(NAMES, "weights") == NAMES.weight_events
    assert resolve_subject(NAMES, "x.y") == "x.y"


def test_a_state_dict_with_tied_and_view_tensors_serialises_by_name() -> None:
    """Tied embeddings and views share storage (safetensors refuses that as is): every name
    comes back with its values, and the caller's tensors are left alone."""
    import torch
    from safetensors.torch import load

    from dockyard.broker.weight_blobs.base import tensors_to_bytes

    embedding = torch.nn.Parameter(torch.randn(8, 4))
    fused = torch.randn(6, 4)
    state = {
        "embed.weight": embedding,
        "lm_head.weight": embedding,  # tied
        "q.weight": fused[:3],  # views of one buffer
        "k.weight": fused[3:],
        "norm.bias": torch.zeros(2),
    }
    loaded = load(tensors_to_bytes(state))
    assert set(loaded) == set(state)
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor.detach()), name
    assert state["lm_head.weight"] is embedding


def test_requeue_skips_what_it_cannot_send_back() -> None:
    from dockyard.broker.requeue import Requeue, Skipped, requeue_of
    from dockyard.schemas import DeadLetter, encode

    def stored_letter(seq: int, letter_or_bytes: DeadLetter | bytes) -> StoredMessage:
        data = (
            letter_or_bytes
            if isinstance(letter_or_bytes, bytes)
            else encode(letter_or_bytes).payload
        )
        return StoredMessage("run1_dead", NAMES.dead_letters, seq, datetime.now(UTC), {}, data)

    def letter(**fields: object) -> DeadLetter:
        base: dict[str, object] = {
            "original_subject": NAMES.scored,
            "original_payload": b"\x00bad",
            "original_message_id": "m7",
            "stage": "trainer",
            "reason": "corrupt_frame",
            "message": "not zstd",
        }
        return DeadLetter(**(base | fields))

    sent = requeue_of(stored_letter(4, letter()), NAMES)
    assert isinstance(sent, Requeue)
    assert sent.message.subject == NAMES.scored and sent.message.msg_id == "requeue:4:m7"
    by_reference = letter(original_payload=None, original_ref="s3://bucket/blob")
    elsewhere = letter(original_subject="otherns.experience.scored")
    # A chunked message whose chunks aged out: only its (empty) reference was dead-lettered.
    chunks_gone = letter(original_payload=b"", reason="chunks_missing", message="chunk 2 gone")
    # Its header would be as malformed the second time (docs/wire-format.md, bad_header).
    bad_header = letter(reason="bad_header", message="Dockyard-Chunks 'x' is not a number")
    outcomes = [
        requeue_of(stored_letter(5, by_reference), NAMES),
        requeue_of(stored_letter(6, elsewhere), NAMES),
        requeue_of(stored_letter(7, b"not a dead letter"), NAMES),
        requeue_of(stored_letter(8, chunks_gone), NAMES),
        requeue_of(stored_letter(9, bad_header), NAMES),
    ]
    assert all(isinstance(o, Skipped) for o in outcomes)
    whys = [o.why for o in outcomes if isinstance(o, Skipped)]
    assert "not kept" in whys[0] and "not a subject of this plane" in whys[1]
    assert whys[2].startswith("undecodable dead letter")
    assert "chunks had aged out" in whys[3]
    assert "malformed header" in whys[4]


def test_replay_export_writes_a_group_one_object_per_sample() -> None:
    # People read exports with jq: one object per sample and per score, whatever the layout
    # on the wire (3.0 carries the group field by field).
    import json
    from datetime import UTC, datetime

    from dockyard.broker.inspect import export_record
    from dockyard.broker.plane import StoredMessage
    from dockyard.schemas import encode
    from tests.unit.schemas.schema_factories import make_scored

    scored = make_scored(num_samples=3, length=4)
    encoded = encode(scored)
    stored = StoredMessage("s", "x.scored", 7, datetime.now(UTC), encoded.headers, encoded.payload)
    record = json.loads(json.dumps(export_record(stored)))
    message = record["message"]
    assert record["schema"] == "scored_rollout"
    assert [score["reward"] for score in message["scores"]] == [1.0, 0.0, 1.0]
    samples = message["rollout"]["samples"]
    assert [sample["sample_index"] for sample in samples] == [0, 1, 2]
    expected = scored.rollout.samples[2].response_token_ids.tolist()
    assert samples[2]["response_token_ids"] == expected
    assert message["scores"][1]["teacher_logprobs"] == [-0.25] * 4


def _reference_headers(count: str, size: str, *, ref: str | None = None) -> dict[str, str]:
    # docs/wire-format.md: the ref is the first half of the SHA-256 of the message's id.
    own_ref = hashlib.sha256(b"message-1").hexdigest()[:32]
    return {
        "Nats-Msg-Id": "message-1",
        "Dockyard-Chunks": count,
        "Dockyard-Chunk-Ref": own_ref if ref is None else ref,
        "Dockyard-Payload-Size": size,
        "Dockyard-Payload-Sha256": "0" * 64,
    }


@pytest.mark.parametrize(
    ("count", "size"),
    [("01", "10"), ("1", "010"), ("00", "10"), ("1", "0010")],
    ids=["count-01", "size-010", "count-00", "size-0010"],
)
def test_a_decimal_header_with_leading_zeros_is_a_bad_header(count: str, size: str) -> None:
    # docs/wire-format.md, "Malformed headers": ASCII decimal as a number is written, no
    # leading zeros (as the schema version's numbers).
    with pytest.raises(PayloadError) as caught:
        chunking.reference_of(_reference_headers(count, size))
    assert caught.value.reason == "bad_header"


def test_a_decimal_header_without_leading_zeros_is_read() -> None:
    reference = chunking.reference_of(_reference_headers("10", "100"))
    assert reference is not None and (reference.count, reference.size) == (10, 100)


@pytest.mark.parametrize(
    "headers",
    [
        _reference_headers("1", "10", ref="a" * 32),
        {k: v for k, v in _reference_headers("1", "10").items() if k != "Nats-Msg-Id"},
    ],
    ids=["another-ref", "no-message-id"],
)
def test_a_chunk_ref_that_is_not_the_message_ids_is_a_bad_header(headers: dict[str, str]) -> None:
    # docs/wire-format.md: Dockyard-Chunk-Ref is the first half of the SHA-256 of the message's
    # Nats-Msg-Id; any other ref would read chunks the message never wrote.
    with pytest.raises(PayloadError) as caught:
        chunking.reference_of(headers)
    assert caught.value.reason == "bad_header"


def _answering(seq: str, delivery: str) -> StoredMessage:
    headers = {"Dockyard-Answers-Seq": seq, "Dockyard-Answers-Delivery": delivery}
    return StoredMessage("S", "s", 1, datetime.now(UTC), headers, b"")


@pytest.mark.parametrize(
    ("seq", "delivery"),
    [("\u00b2", "1"), ("7", "\u0661"), ("007", "1"), ("7", "+1"), ("", "1")],
    ids=["superscript-two", "arabic-indic-one", "leading-zeros", "signed", "empty"],
)
def test_a_malformed_answers_header_is_unknown_provenance(seq: str, delivery: str) -> None:
    # docs/wire-format.md: the Answers headers are ASCII decimal; `replay trace` says `unknown`
    # when they are absent or malformed (a superscript digit passed str.isdigit, then int failed).
    assert "answered" in trace_answered(_answering(seq, delivery))


def test_a_well_formed_answers_header_names_the_delivery() -> None:
    assert trace_answered(_answering("7", "2")) == {"answered_seq": 7, "answered_delivery": 2}


def test_a_default_broker_reserves_what_a_laptop_holds() -> None:
    # docs/operations.md: by default each of the six data streams reserves 1 GiB on the store,
    # the heartbeats 64 MiB and the blobs nothing — about 6 GiB, where 8 GiB streams needed
    # ≈ 64 GiB of free disk (three quarters of it reservable) before a broker could start.
    from dockyard.broker.provisioning import reserved_bytes, stream_config
    from dockyard.config.sections.data_plane import DataPlaneConfig

    config = DataPlaneConfig()
    names = PlaneNames(config.namespace)
    reserved = {
        spec.name: reserved_bytes(
            stream_config(spec, config, is_blob_store=spec.name == names.blobs_stream.name)
        )
        for spec in names.all_streams()
    }
    assert config.streams.max_bytes == 1024**3
    assert sorted(reserved.values()) == [0, 64 * 1024**2, *[1024**3] * 6]
    assert reserved[names.blobs_stream.name] == 0


async def test_a_chunk_reference_with_a_body_is_a_bad_header() -> None:
    # docs/wire-format.md: a reference message has an empty body (its payload is its chunks);
    # one with a body is malformed, not read one way or the other.
    split = chunking.split(NAMES, NAMES.scored, b"x" * 100, msg_id="m", headers={}, chunk_size=30)
    chunks = {index: c.payload for index, c in enumerate(split.chunks)}

    async def read_chunk(ref: str, index: int) -> bytes | None:
        return chunks.get(index)

    headers = _as_received(split.reference)
    assert (await chunking.read(headers, b"", read_chunk))[1] == b"x" * 100
    with pytest.raises(PayloadError) as caught:
        await chunking.read(headers, b"a body", read_chunk)
    assert caught.value.reason == "bad_header"
