"""Streams and durable consumers from :class:`DataPlaneConfig`, created idempotently.

An existing stream keeps its limits (``data_plane.streams``: sizes, ages, dedupe window,
replicas): serving a store — a finished run's, to replay it — must not rewrite what it keeps, and
a smaller ``max_bytes`` would delete its oldest messages. A difference is reported (a warning,
and in the :class:`ProvisionReport`); the config's limits are applied only when asked
(``update_limits``: ``dockyard broker up --update-limits``). The rest of a stream's layout,
which this code defines (subjects, discard policy, direct gets, republish, sources), is updated
in place; properties JetStream cannot change (retention, storage) raise
:class:`ProvisioningDrift` naming the stream, the field, what exists and what the config wants,
rather than the server's bare "stream name already in use" (10058). Consumers' redelivery
settings are updated in place (they keep no data).

JetStream reserves each file stream's ``max_bytes`` on its store when it creates the stream and
refuses one the store cannot hold (10047); :func:`check_store_room` refuses before creating
anything when the store is a local directory, and a refusal by the server is reported with the
numbers (:class:`InsufficientStorage`).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from dockyard.broker.names import ConsumerSpec, PlaneNames, Retention, StreamSpec
from dockyard.broker.plane import InsufficientStorage, LimitDifference, ProvisioningDrift
from dockyard.broker.sites import replication_for
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.utils.logging import get_logger
from dockyard.utils.sizes import human_bytes

log = get_logger(__name__)

_IMMUTABLE_STREAM_FIELDS = ("retention", "storage", "mirror")
#: What ``data_plane.streams`` sets: an existing stream keeps its own unless asked.
_LIMIT_FIELDS = ("max_msgs", "max_bytes", "max_age", "duplicate_window", "num_replicas")
#: The layout this code defines: updated in place.
_LAYOUT_FIELDS = (
    "subjects",
    "max_msgs_per_subject",
    "discard",
    "allow_direct",
    "republish",
    "sources",
)
#: JetStream's error code for "insufficient storage resources available".
_INSUFFICIENT_RESOURCES = 10047
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
        discard=api.DiscardPolicy.NEW
        if _discards_new(spec, names, config)
        else api.DiscardPolicy.OLD,
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


def _discards_new(spec: StreamSpec, names: PlaneNames, config: DataPlaneConfig) -> bool:
    """Whether a full stream refuses new messages (``stream_room``). Across sites the
    experience streams are sources and sourced copies whose readers the trainer's history trim
    does not see (a rollout site's is read by the trainer site's source, not a durable), so
    nothing would free them: there they keep dropping their oldest, as before."""
    site = config.site
    multi_site = site.trainer_domain is not None or bool(site.rollout_domains)
    if multi_site and spec.name == names.experience_stream.name:
        return False
    return spec.discard_new


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
    #: Limits in which the existing stream differs from the config: kept, or with
    #: ``update_limits`` changed.
    limits: tuple[LimitDifference, ...] = ()


def reserved_bytes(config: api.StreamConfig) -> int:
    """What JetStream reserves on its file store for a stream: its ``max_bytes`` (none for an
    unlimited or in-memory stream)."""
    if config.storage != api.StorageType.FILE or config.max_bytes is None:
        return 0
    return max(config.max_bytes, 0)


def nats_store_limit(directory: Path, max_file_store: int | None = None) -> tuple[int, int]:
    """(free bytes, what nats-server lets streams reserve) of a store at ``directory``: its
    ``max_file_store`` when set, else three quarters of the free disk, nats-server's own rule
    for an unset limit (server/disk_avail.go: "Estimate 75% of available storage")."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the store is created by the server: ask its nearest parent
    free = shutil.disk_usage(probe).free
    return free, (max_file_store if max_file_store is not None else free // 4 * 3)


def check_store_room(
    to_create: Sequence[api.StreamConfig], directory: Path, max_file_store: int | None = None
) -> None:
    """Refuse, before any is created, streams whose reservations the local store at
    ``directory`` cannot hold: with the numbers (what they reserve, the disk's free space,
    the server's limit) and a ``max_bytes`` that would fit."""
    reserving = [config for config in to_create if reserved_bytes(config)]
    needed = sum(reserved_bytes(config) for config in reserving)
    if not needed:
        return
    free, limit = nats_store_limit(directory, max_file_store)
    if needed <= limit:
        return
    where = (
        f"its max_file_store of {limit} bytes ({human_bytes(limit)})"
        if max_file_store is not None
        else f"three quarters of the free disk, {limit} bytes ({human_bytes(limit)})"
    )
    fits = limit // len(reserving)
    names = ", ".join(str(config.name) for config in reserving)
    raise InsufficientStorage(
        f"the JetStream store {directory} cannot hold the streams' limits: JetStream reserves "
        f"each file stream's max_bytes up front, and creating {names} reserves {needed} bytes "
        f"({human_bytes(needed)}) in all; the disk has {free} bytes ({human_bytes(free)}) free "
        f"and nats-server lets streams reserve at most {where}. Lower "
        f"data_plane.streams.max_bytes (to at most {fits} bytes, {human_bytes(fits)}, for "
        f"{len(reserving)} streams to fit) or free disk space; nothing was created"
    )


async def ensure_streams(
    js: JetStreamContext,
    wanted: Sequence[api.StreamConfig],
    *,
    update_limits: bool = False,
    store: tuple[Path, int | None] | None = None,
) -> list[ProvisionOutcome]:
    """:func:`ensure_stream` for each of ``wanted``, in order. ``store``: the server's store
    directory and ``max_file_store`` when it is local (a server this process started): the
    streams to create are checked against its disk first (:func:`check_store_room`)."""
    if store is not None:
        missing = []
        for config in wanted:
            try:
                await js.stream_info(str(config.name))
            except NotFoundError:
                missing.append(config)
        check_store_room(missing, *store)
    outcomes: list[ProvisionOutcome] = []
    for config in wanted:
        try:
            outcomes.append(await ensure_stream(js, config, update_limits=update_limits))
        except InsufficientStorage as error:
            created = [o.name for o in outcomes if o.action == "created"]
            total = sum(reserved_bytes(c) for c in wanted)
            raise InsufficientStorage(
                f"{error}. The {len(wanted)} streams of this namespace reserve {total} bytes "
                f"({human_bytes(total)}) in all; lower data_plane.streams.max_bytes or raise "
                f"the server's JetStream max_file_store"
                + (
                    f"; created before the refusal, empty, with the limits asked: "
                    f"{', '.join(created)} (an existing stream keeps its limits: delete these "
                    f"or pass --update-limits to `dockyard broker up` to size them anew)"
                    if created
                    else ""
                )
            ) from error
    return outcomes


def _insufficient_storage(wanted: api.StreamConfig, error: APIError) -> InsufficientStorage:
    """The server refused to reserve what the stream asks for (creating or updating it)."""
    return InsufficientStorage(
        f"the JetStream server cannot reserve max_bytes={wanted.max_bytes} "
        f"({human_bytes(reserved_bytes(wanted))}) for stream {wanted.name}: "
        f"{error.description} (code {error.err_code})"
    )


async def ensure_stream(
    js: JetStreamContext, wanted: api.StreamConfig, *, update_limits: bool = False
) -> ProvisionOutcome:
    assert wanted.name is not None
    try:
        info = await js.stream_info(wanted.name)
    except NotFoundError:
        try:
            await js.add_stream(wanted)
        except APIError as error:
            if error.err_code == _INSUFFICIENT_RESOURCES:
                raise _insufficient_storage(wanted, error) from error
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
    limits = tuple(
        LimitDifference(wanted.name, name, have, want)
        for name, have, want in _differences(info.config, wanted, _LIMIT_FIELDS)
    )
    layout = _differences(info.config, wanted, _LAYOUT_FIELDS)
    if limits and not update_limits:
        log.warning(
            "stream.limits_kept",
            stream=wanted.name,
            kept={d.field: f"{d.existing} (config: {d.configured})" for d in limits},
            hint="`dockyard broker up --update-limits` applies the config's limits",
        )
    if not layout and not (limits and update_limits):
        return ProvisionOutcome(wanted.name, "unchanged", limits)
    # Without ``update_limits`` the stream's own limits go back with the new layout.
    target = (
        wanted
        if update_limits
        else dataclasses.replace(
            wanted, **{name: getattr(info.config, name) for name in _LIMIT_FIELDS}
        )
    )
    try:
        await js.update_stream(target)
    except APIError as error:
        if error.err_code == _INSUFFICIENT_RESOURCES:
            raise _insufficient_storage(wanted, error) from error
        raise
    changes = {name: f"{have} -> {want}" for name, have, want in layout}
    if update_limits:
        changes.update({d.field: f"{d.existing} -> {d.configured}" for d in limits})
    log.info("stream.updated", stream=wanted.name, changes=changes)
    return ProvisionOutcome(wanted.name, "updated", limits)


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
