"""Streams and durable consumers from :class:`DataPlaneConfig`, created idempotently.

Limits (sizes, ages, dedupe window, redelivery settings) are updated in place when the config
changes; properties JetStream cannot change (subjects, retention, storage) raise
:class:`ProvisioningDrift` naming the stream, the field, what exists and what the config wants,
rather than the server's bare "stream name already in use" (10058).
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from dockyard.broker.names import ConsumerSpec, PlaneNames, Retention, StreamSpec
from dockyard.broker.plane import ProvisioningDrift
from dockyard.broker.sites import replication_for
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

_IMMUTABLE_STREAM_FIELDS = ("retention", "storage", "mirror")
_MUTABLE_STREAM_FIELDS = (
    "subjects",
    "max_msgs",
    "max_bytes",
    "max_age",
    "max_msgs_per_subject",
    "duplicate_window",
    "discard",
    "num_replicas",
    "allow_direct",
    "republish",
    "sources",
)
_CONSUMER_FIELDS = ("ack_wait", "max_deliver", "max_ack_pending", "filter_subject")


def stream_config(
    spec: StreamSpec, config: DataPlaneConfig, *, is_blob_store: bool
) -> api.StreamConfig:
    limits = config.streams
    names = PlaneNames(config.namespace)
    replication = replication_for(spec, names, config.site)
    return api.StreamConfig(
        name=spec.name,
        # A mirror holds exactly its origin's messages: it takes no subjects of its own.
        subjects=None if replication.mirror else list(replication.subjects or spec.subjects),
        mirror=replication.mirror,
        # Workers read a weight mirror by direct get, as they would the origin stream.
        mirror_direct=True if replication.mirror else None,
        sources=list(replication.sources) or None,
        retention=(
            api.RetentionPolicy.WORK_QUEUE
            if spec.retention is Retention.WORK_QUEUE
            else api.RetentionPolicy.LIMITS
        ),
        storage=api.StorageType.FILE if limits.storage == "file" else api.StorageType.MEMORY,
        num_replicas=limits.replicas,
        # Blob retention is by version count (see weights/retention), never by a byte limit
        # that could silently drop part of a blob a worker is about to read.
        max_bytes=-1 if is_blob_store else spec.effective_max_bytes(limits.max_bytes),
        max_msgs=-1 if is_blob_store else limits.max_msgs,
        max_age=0 if is_blob_store else spec.effective_max_age_s(limits.max_age_s),
        max_msgs_per_subject=spec.max_msgs_per_subject,
        duplicate_window=limits.duplicate_window_s,
        discard=api.DiscardPolicy.NEW if spec.discard_new else api.DiscardPolicy.OLD,
        allow_direct=spec.allow_direct,
        # A followed stream announces every stored message (headers only) for watchers, which
        # then read it by direct get: following a subject needs no consumer of the watcher's own.
        republish=(
            api.RePublish(
                src=spec.announce_filter,
                dest=names.stored_notice_destination(spec.announce_filter),
                headers_only=True,
            )
            if spec.announces
            else None
        ),
    )


def consumer_config(spec: ConsumerSpec, config: DataPlaneConfig) -> api.ConsumerConfig:
    consumer = config.consumer
    return api.ConsumerConfig(
        durable_name=spec.durable,
        deliver_policy=api.DeliverPolicy.ALL,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=consumer.ack_wait_s,
        max_deliver=consumer.max_deliver,
        max_ack_pending=consumer.max_ack_pending,
        filter_subject=spec.filter_subject,
    )


def _normalise(value: object) -> object:
    if isinstance(value, api.StreamSource):
        return (
            value.name,
            value.external.api if value.external else None,
            value.consumer.name if value.consumer else None,
            tuple((t.src, t.dest) for t in value.subject_transforms or ()),
        )
    if isinstance(value, list) and value and isinstance(value[0], api.StreamSource):
        return sorted(_normalise(source) for source in value)  # type: ignore[type-var]  # normalised sources are tuples, which order
    if isinstance(value, api.RePublish):
        return (value.src or ">", value.dest, bool(value.headers_only))
    value = getattr(value, "value", value)  # enums and their string forms compare equal
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, list):
        return sorted(value)
    return value


def _differences(
    existing: object, wanted: object, fields: tuple[str, ...]
) -> list[tuple[str, object, object]]:
    out = []
    for name in fields:
        have = _normalise(getattr(existing, name, None))
        want = _normalise(getattr(wanted, name, None))
        if have != want and not (name == "max_age" and not have and not want):
            out.append((name, have, want))
    return out


@dataclass
class ProvisionOutcome:
    name: str
    action: str  # "created" | "updated" | "unchanged"


async def ensure_stream(js: JetStreamContext, wanted: api.StreamConfig) -> ProvisionOutcome:
    assert wanted.name is not None
    try:
        info = await js.stream_info(wanted.name)
    except NotFoundError:
        try:
            await js.add_stream(wanted)
        except APIError as error:
            raise ProvisioningDrift(
                f"cannot create stream {wanted.name}: {error.description} (code {error.err_code}); "
                f"check data_plane.streams (max_bytes={wanted.max_bytes} is reserved up front) "
                f"and the server's JetStream limits"
            ) from error
        log.info("stream.created", stream=wanted.name)
        return ProvisionOutcome(wanted.name, "created")
    fixed = _differences(info.config, wanted, _IMMUTABLE_STREAM_FIELDS)
    if fixed:
        detail = "; ".join(
            f"{name}: exists as {have}, config wants {want}" for name, have, want in fixed
        )
        raise ProvisioningDrift(
            f"stream {wanted.name} cannot be changed in place ({detail}); "
            f"delete it or use another data_plane.namespace"
        )
    changed = _differences(info.config, wanted, _MUTABLE_STREAM_FIELDS)
    if not changed:
        return ProvisionOutcome(wanted.name, "unchanged")
    await js.update_stream(wanted)
    log.info(
        "stream.updated",
        stream=wanted.name,
        changes={name: f"{have} -> {want}" for name, have, want in changed},
    )
    return ProvisionOutcome(wanted.name, "updated")


async def ensure_consumer(
    js: JetStreamContext, spec: ConsumerSpec, wanted: api.ConsumerConfig
) -> ProvisionOutcome:
    try:
        info = await js.consumer_info(spec.stream, spec.durable)
    except NotFoundError:
        await js.add_consumer(spec.stream, wanted)
        log.info("consumer.created", stream=spec.stream, consumer=spec.durable)
        return ProvisionOutcome(spec.durable, "created")
    changed = _differences(info.config, wanted, _CONSUMER_FIELDS)
    if not changed:
        return ProvisionOutcome(spec.durable, "unchanged")
    try:
        await js.add_consumer(spec.stream, wanted)  # create-or-update
    except Exception as error:
        detail = "; ".join(
            f"{name}: exists as {have}, config wants {want}" for name, have, want in changed
        )
        raise ProvisioningDrift(
            f"consumer {spec.durable} on {spec.stream} cannot be updated ({detail}): {error}"
        ) from error
    log.info(
        "consumer.updated",
        consumer=spec.durable,
        changes={name: f"{have} -> {want}" for name, have, want in changed},
    )
    return ProvisionOutcome(spec.durable, "updated")
