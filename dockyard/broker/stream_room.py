"""How full a stream is, and the policy for full streams (invariants 1 and 4 of DESIGN.md).

A stream at its limits either drops its oldest messages (JetStream ``discard: old``) or refuses
new ones (``discard: new``). Dropping is only safe for messages no one still has to read, so:

- the work queue (``NS_prompts``) and the experience stream (``NS_experience``: raw rollouts
  the scorers have not read yet, scored groups the trainer has not read yet) refuse new messages
  when full (the experience stream at a single site only: across sites its copies are read by
  stream sources the trim cannot see, so they keep dropping their oldest, see provisioning).
  A publisher backs off and retries for ``data_plane.publish.full_stream_wait_s``, then
  fails with :class:`~dockyard.broker.plane.StreamFull` naming the stream, never losing an
  acknowledged message; the dispatcher puts no more groups in flight than the experience stream
  can hold;
- the experience stream is also history, kept for replay: nothing would ever free a full one.
  The trainer trims it (``DataPlane.trim_history``) once it is :data:`FULL_AT` full, and only
  of messages no role can need again: raw rollouts below the scorers' ack floor (each has been
  scored and its scored copy stored) and scored groups below both the trainer's ack floor and
  the replay point of its newest checkpoint (what a resume replays from). A stream with room
  keeps everything for ``dockyard replay``;
- the other streams keep ``discard: old``: weight events and blobs are superseded by design
  (blobs are pruned by version count), heartbeats and leases are current state, and dead letters
  and chunks are bounded records whose loss is reported (a lost chunk is dead-lettered as
  ``chunks_missing``), not a group's only copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from dockyard.utils.sizes import human_bytes

#: The fraction of a limit at which a stream counts as full: the trainer trims the experience
#: stream's history from here, the dispatcher keeps its in-flight groups below it, and the
#: trainer's starvation diagnosis names a stream this full as the cause.
FULL_AT = 0.9


@dataclass(frozen=True)
class StreamRoom:
    stream: str
    bytes: int
    max_bytes: int  # -1: no byte limit
    messages: int
    max_msgs: int  # -1: no message limit

    @property
    def fill(self) -> float:
        """The fuller of bytes and messages against their limits (0 when neither is set)."""
        fractions = [0.0]
        if self.max_bytes > 0:
            fractions.append(self.bytes / self.max_bytes)
        if self.max_msgs > 0:
            fractions.append(self.messages / self.max_msgs)
        return max(fractions)

    @property
    def full(self) -> bool:
        return self.fill >= FULL_AT

    def messages_that_fit(self, per_message_bytes: float) -> int | None:
        """How many messages of that size the stream holds below :data:`FULL_AT` when empty
        (None: no limit)."""
        fits: list[int] = []
        if self.max_bytes > 0 and per_message_bytes > 0:
            fits.append(int(self.max_bytes * FULL_AT // per_message_bytes))
        if self.max_msgs > 0:
            fits.append(int(self.max_msgs * FULL_AT))
        return min(fits) if fits else None

    @property
    def mean_message_bytes(self) -> float:
        return self.bytes / self.messages if self.messages else 0.0

    def describe(self) -> str:
        parts = []
        if self.max_bytes > 0:
            parts.append(
                f"{human_bytes(self.bytes)} of its max_bytes {human_bytes(self.max_bytes)}"
            )
        if self.max_msgs > 0:
            parts.append(f"{self.messages} of its max_msgs {self.max_msgs} messages")
        held = " and ".join(parts) or f"{self.messages} messages"
        return f"stream {self.stream} is full ({held}, {self.fill:.0%})"
