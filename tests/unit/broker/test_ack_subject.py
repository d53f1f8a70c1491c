"""A delivery's stream, sequence, delivery count and time, read from its ack subject.

The two layouts are JetStream's (ADR-15): v1 ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream
seq>.<consumer seq>.<time ns>.<pending>`` and v2 ``$JS.ACK.<domain>.<account hash>.<stream>.
<consumer>.<delivered>.<stream seq>.<consumer seq>.<time ns>.<pending>[.<token>]``.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from dockyard.broker.jetstream_pull import AckSubject, parse_ack_subject

# 2026-12-01 12:00:00.123456 UTC in nanoseconds since the epoch.
_NS = 1_796_126_400_123_456_000
_WHEN = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)


def test_v1_subject() -> None:
    reply = f"$JS.ACK.ns_experience.ns_scored.3.1207.88.{_NS}.41"
    assert parse_ack_subject(reply) == AckSubject("ns_experience", 1207, 3, _WHEN)


@pytest.mark.parametrize("token", ["", ".Xk2p"])
def test_v2_subject_with_and_without_its_token(token: str) -> None:
    reply = f"$JS.ACK.hub.ACCHASH.ns_experience.ns_scored.1.99.7.{_NS}.0{token}"
    assert parse_ack_subject(reply) == AckSubject("ns_experience", 99, 1, _WHEN)


@pytest.mark.parametrize(
    "reply",
    [
        None,
        "",
        "_INBOX.abc.1",  # a core NATS reply, not a JetStream delivery
        "$JS.ACK.s.c.1.2.3.4",  # 8 tokens: neither layout
        "$JS.ACK.d.h.s.c.1.2.3.4",  # 10 tokens
        "$JS.NAK.s.c.1.2.3.4.5",  # 9 tokens, not an ack subject
        "$KV.ACK.s.c.1.2.3.4.5",
    ],
)
def test_other_subjects_are_refused_as_nats_py_refuses_them(reply: str | None) -> None:
    with pytest.raises(NotJSMessageError):
        parse_ack_subject(reply)
    with pytest.raises(NotJSMessageError):
        _ = Msg(None, reply=reply or "").metadata  # type: ignore[arg-type]  # no client needed to parse


_TOKEN = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
_NUMBER = st.integers(min_value=0, max_value=2**63 - 1)


@given(
    st.booleans(),
    _TOKEN,
    _TOKEN,
    _NUMBER,
    _NUMBER,
    st.integers(min_value=0, max_value=4_000_000_000_000_000_000),
)
def test_what_nats_py_reads(
    v2: bool, stream: str, consumer: str, delivered: int, seq: int, ns: int
) -> None:
    head = "$JS.ACK.dom.hash." if v2 else "$JS.ACK."
    reply = f"{head}{stream}.{consumer}.{delivered}.{seq}.5.{ns}.0"
    metadata = Msg(None, reply=reply).metadata  # type: ignore[arg-type]  # no client needed to parse
    assert parse_ack_subject(reply) == (
        metadata.stream,
        metadata.sequence.stream,
        metadata.num_delivered,
        metadata.timestamp,
    )
