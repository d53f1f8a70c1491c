"""Every stream, subject and durable consumer name of the plane, derived from one namespace.

The plane knows no roles; it knows the *data* that flows: prompt groups (a work queue), raw and
scored rollouts (experience, kept for replay), weight-version events, dead letters, the chunk
side-store for oversized messages and weight blobs. Durable consumers are named after the data
they read, so several processes sharing one durable form a pool (the scorers do).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

#: A lease record outlives any lease (leases are renewed every few seconds): after a day it can
#: only be the last word of a reader that died, and the server drops it.
LEASE_RECORD_MAX_AGE_S = 24 * 3600.0
#: A heartbeat record is kept this long after its role's last beat (roles beat every few
#: seconds): long enough to see that a role went silent and what it said last, short enough that
#: the records of roles long gone leave the fleet view by themselves (the stream's TTL).
HEARTBEAT_RECORD_MAX_AGE_S = 3600.0
#: The heartbeats stream's byte cap: a record is at most 64 KiB (about 1 KiB in practice), one
#: per role instance, so this holds a thousand instances at the worst.
HEARTBEAT_STREAM_MAX_BYTES = 64 * 1024 * 1024


class Retention(StrEnum):
    WORK_QUEUE = "work_queue"  # a message is deleted once acked: each prompt group is done once
    LIMITS = "limits"  # kept until the stream's limits: history stays replayable


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    retention: Retention
    # Direct get lets readers fetch single messages (chunks, the latest weight event) cheaply.
    allow_direct: bool = True
    # A full stream refuses new messages (back-pressure) rather than drop ones still to be read
    # (a work queue, the experience its consumers read); a stream of records only superseded
    # or bounded by nature drops its oldest (see ``stream_room``).
    discard_new: bool = False
    #: Only the newest N messages of each subject are kept (-1: no such limit). A stream of
    #: "current state per key" (blob leases) keeps 1, so it never grows with time.
    max_msgs_per_subject: int = -1
    #: Overrides ``data_plane.streams.max_age_s`` for a stream whose records expire by nature.
    max_age_s: float | None = None
    #: Caps ``data_plane.streams.max_bytes`` for a stream of small records (JetStream reserves
    #: a file stream's max_bytes up front: a stream of heartbeats must not take gigabytes).
    max_bytes_cap: int | None = None
    #: Each stored message is announced on ``stored_notice`` (headers only), so its subjects can
    #: be followed (``DataPlane.watch``) without a consumer. Only for streams that are followed:
    #: on the experience stream the notices would double the server's messages per group.
    announces: bool = False
    #: Which of its subjects a stream announces: a blob's manifest, not each of its chunks.
    announce_filter: str = ">"

    def effective_max_age_s(self, configured: float) -> float:
        """This stream's message age limit in seconds (0 = none), given the configured one."""
        return configured if self.max_age_s is None else self.max_age_s

    def effective_max_bytes(self, configured: int) -> int:
        """This stream's byte limit (-1 = none), given the configured one."""
        if self.max_bytes_cap is None:
            return configured
        return self.max_bytes_cap if configured < 0 else min(configured, self.max_bytes_cap)


@dataclass(frozen=True)
class ConsumerSpec:
    """A durable pull consumer: every process that uses the same spec shares its messages."""

    durable: str
    stream: str
    filter_subject: str


@dataclass(frozen=True)
class PlaneNames:
    namespace: str

    # -- subjects ---------------------------------------------------------------------------
    @property
    def prompts(self) -> str:
        return f"{self.namespace}.prompts"

    @property
    def rollouts(self) -> str:
        return f"{self.namespace}.experience.rollouts"

    @property
    def scored(self) -> str:
        return f"{self.namespace}.experience.scored"

    @property
    def rescored_wildcard(self) -> str:
        """Where ``replay rescore`` writes: ``NS.rescored.<name>`` is experience scored again
        offline (another environment or checker setting). Its own prefix, not under
        ``experience.``, so no live consumer's filter can ever match it."""
        return f"{self.namespace}.rescored.>"

    def rescored(self, name: str) -> str:
        return f"{self.namespace}.rescored.{name}"

    @property
    def weight_events(self) -> str:
        return f"{self.namespace}.weights.events"

    @property
    def dead_letters(self) -> str:
        return f"{self.namespace}.dead"

    def chunk_subject(self, ref: str, index: int) -> str:
        return f"{self.namespace}.chunks.{ref}.{index}"

    def blob_data_subject(self, digest: str) -> str:
        return f"{self.namespace}.blobs.{digest}.data"

    def blob_manifest_subject(self, digest: str) -> str:
        return f"{self.namespace}.blobs.{digest}.meta"

    @property
    def blob_manifests_wildcard(self) -> str:
        return f"{self.namespace}.blobs.*.meta"

    def lease_subject(self, digest: str, reader: str) -> str:
        return f"{self.namespace}.leases.{digest}.{reader}"

    def leases_of(self, digest: str) -> str:
        """Every reader's lease record on one blob."""
        return f"{self.namespace}.leases.{digest}.*"

    def heartbeat_subject(self, role: str, instance_token: str) -> str:
        """Where one role instance publishes its heartbeat (``instance_token`` is one subject
        token; see ``heartbeats.subject_token``)."""
        return f"{self.namespace}.heartbeats.{role}.{instance_token}"

    def heartbeats_of(self, role: str) -> str:
        """Every instance's heartbeat subject of one role (what a role may publish to)."""
        return f"{self.namespace}.heartbeats.{role}.*"

    @property
    def heartbeats_wildcard(self) -> str:
        return f"{self.namespace}.heartbeats.>"

    @property
    def stored_notices(self) -> str:
        """Where every stream announces what it stored (headers only; see ``stored_notice``)."""
        return f"{self.namespace}.stored.>"

    def stored_notice(self, subject: str) -> str:
        """The notice a stream republishes, headers only, once it stored a message on
        ``subject``: watchers wake on it and read the message itself by direct get, so no role
        needs a consumer of its own to follow a subject (creating one is the admin's alone)."""
        return f"{self.namespace}.stored.{subject}"

    def stored_notice_destination(self, announce_filter: str) -> str:
        """Where a stream announcing ``announce_filter`` republishes: each message's
        ``stored_notice``, as a server subject transform (its ``*`` tokens carried over)."""
        if announce_filter == ">":
            return self.stored_notices
        tokens, wildcards = [], 0
        for token in announce_filter.split("."):
            if token == "*":
                wildcards += 1
                token = f"{{{{wildcard({wildcards})}}}}"
            tokens.append(token)
        return self.stored_notice(".".join(tokens))

    # -- streams -----------------------------------------------------------------------------
    @property
    def prompts_stream(self) -> StreamSpec:
        return StreamSpec(
            f"{self.namespace}_prompts", (self.prompts,), Retention.WORK_QUEUE, discard_new=True
        )

    @property
    def experience_stream(self) -> StreamSpec:
        # Rescored experience is kept with the experience it was made from, under the same
        # limits, so it can be replayed and diffed against it (adding a subject updates an
        # existing stream in place). Discard new: its oldest messages may not have been read
        # yet; the trainer trims the history no one needs when it fills (``stream_room``).
        return StreamSpec(
            f"{self.namespace}_experience",
            (self.rollouts, self.scored, self.rescored_wildcard),
            Retention.LIMITS,
            discard_new=True,
        )

    @property
    def weights_stream(self) -> StreamSpec:
        return StreamSpec(
            f"{self.namespace}_weights", (self.weight_events,), Retention.LIMITS, announces=True
        )

    @property
    def dead_letters_stream(self) -> StreamSpec:
        return StreamSpec(f"{self.namespace}_dead", (self.dead_letters,), Retention.LIMITS)

    @property
    def chunks_stream(self) -> StreamSpec:
        return StreamSpec(
            f"{self.namespace}_chunks", (f"{self.namespace}.chunks.>",), Retention.LIMITS
        )

    @property
    def blobs_stream(self) -> StreamSpec:
        # Manifests are announced: a reader at a rollout site, whose blobs are a mirror that may
        # lag the weight event naming them, waits for the manifest (see ``data_plane.site``).
        return StreamSpec(
            f"{self.namespace}_blobs",
            (f"{self.namespace}.blobs.>",),
            Retention.LIMITS,
            announces=True,
            announce_filter=self.blob_manifests_wildcard,
        )

    @property
    def leases_stream(self) -> StreamSpec:
        """Who is reading which weight blob right now (see ``weights/leases.py``)."""
        return StreamSpec(
            f"{self.namespace}_leases",
            (f"{self.namespace}.leases.>",),
            Retention.LIMITS,
            max_msgs_per_subject=1,
            max_age_s=LEASE_RECORD_MAX_AGE_S,
            announces=True,
        )

    @property
    def heartbeats_stream(self) -> StreamSpec:
        """Each role instance's last heartbeat (see ``heartbeats.py``): a key-value bucket in all
        but name (one record per subject, expiring), read by ``dockyard status``."""
        return StreamSpec(
            f"{self.namespace}_heartbeats",
            (self.heartbeats_wildcard,),
            Retention.LIMITS,
            max_msgs_per_subject=1,
            max_age_s=HEARTBEAT_RECORD_MAX_AGE_S,
            max_bytes_cap=HEARTBEAT_STREAM_MAX_BYTES,
        )

    def message_streams(self) -> tuple[StreamSpec, ...]:
        """The streams a typed message can land in (the ones replay shows by default)."""
        return (
            self.prompts_stream,
            self.experience_stream,
            self.weights_stream,
            self.dead_letters_stream,
        )

    def all_streams(self) -> tuple[StreamSpec, ...]:
        return (
            *self.message_streams(),
            self.chunks_stream,
            self.blobs_stream,
            self.leases_stream,
            self.heartbeats_stream,
        )

    def stream_for_subject(self, subject: str) -> StreamSpec:
        for spec in self.all_streams():
            for pattern in spec.subjects:
                if subject_matches(pattern, subject):
                    return spec
        raise KeyError(f"no stream of namespace {self.namespace!r} holds subject {subject!r}")

    # -- durable consumers -------------------------------------------------------------------
    @property
    def prompt_consumer(self) -> ConsumerSpec:
        return ConsumerSpec(f"{self.namespace}_prompts", self.prompts_stream.name, self.prompts)

    @property
    def rollout_consumer(self) -> ConsumerSpec:
        """Raw rollouts, shared by the whole scorer pool."""
        return ConsumerSpec(
            f"{self.namespace}_rollouts", self.experience_stream.name, self.rollouts
        )

    @property
    def scored_consumer(self) -> ConsumerSpec:
        return ConsumerSpec(f"{self.namespace}_scored", self.experience_stream.name, self.scored)

    def consumers(self) -> tuple[ConsumerSpec, ...]:
        return (self.prompt_consumer, self.rollout_consumer, self.scored_consumer)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` is one token, a trailing ``>`` one or more."""
    pattern_tokens = pattern.split(".")
    subject_tokens = subject.split(".")
    for index, token in enumerate(pattern_tokens):
        if token == ">":
            return len(subject_tokens) > index
        if index >= len(subject_tokens):
            return False
        if token != "*" and token != subject_tokens[index]:
            return False
    return len(subject_tokens) == len(pattern_tokens)
