"""The client's header parser gives what nats-py's own gives, for any header block."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client as NatsClient

from dockyard.broker.connection import DockyardClient

# Bytes a header block can hold, weighted towards the ones that matter to the parser:
# separators, every kind of ASCII whitespace, non-ASCII bytes, and invalid UTF-8.
_PIECES = st.sampled_from(
    [b":", b": ", b"\r\n", b" ", b"\t", b"\x0b", b"\x0c", b"\x1c", b"\x1f", b"\xc3\xa9", b"\xff"]
)
_BLOCKS = st.lists(
    st.one_of(_PIECES, st.binary(max_size=12), st.sampled_from([b"Nats-Msg-Id", b"Dockyard"])),
    max_size=24,
).map(b"".join)


@given(_BLOCKS)
def test_same_headers_as_nats_py(raw):
    assert DockyardClient._parse_header_lines(raw) == NatsClient._parse_header_lines(raw)


def test_dockyard_headers():
    raw = (
        b"Nats-Msg-Id: scored_rollout:g-1:0\r\nDockyard-Schema: scored_rollout\r\n"
        b"Dockyard-Schema-Version: 3.0\r\nDockyard-Codec: msgpack+zstd\r\n"
        b"Bad Name: skipped\r\nCaf\xc3\xa9: skipped too\r\nnot a header\r\n\r\n"
    )
    assert DockyardClient._parse_header_lines(raw) == {
        "Nats-Msg-Id": "scored_rollout:g-1:0",
        "Dockyard-Schema": "scored_rollout",
        "Dockyard-Schema-Version": "3.0",
        "Dockyard-Codec": "msgpack+zstd",
    }
