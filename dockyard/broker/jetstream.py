"""The NATS JetStream plane: the non-colocated data plane for fleets across machines.

This module holds the plane's lifecycle (connect, embedded server, close), provisioning,
consumption and the survey of streams; the other concerns live beside it:

- publishing — retries, pipelined windows, chunks: :mod:`.jetstream_publish`;
- reading history — direct gets, replay, following a subject: :mod:`.jetstream_history`;
- nats-py's JetStream context with its fixes, and what a retry outlasts: :mod:`.jetstream_context`;
- durable pull consumers with a byte cap per request, and deliveries: :mod:`.jetstream_pull`.

Messages that exhaust ``max_deliver`` are turned into dead letters from the server's advisory by
whichever process consumes from that durable (:mod:`.exhausted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from dockyard.broker import chunking, exhausted
from dockyard.broker.admin import AdminPlane
from dockyard.broker.connection import (
    ConnectionEvents,
    DockyardClient,
    connect,
    server_urls,
)
from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.broker.jetstream_context import PENDING_PUBLISH_SLOTS, PipelinedJetStream
from dockyard.broker.jetstream_history import JetStreamHistory
from dockyard.broker.jetstream_publish import JetStreamPublisher
from dockyard.broker.jetstream_pull import JetStreamDelivery, PullChannel, user_headers
from dockyard.broker.names import ConsumerSpec
from dockyard.broker.plane import (
    ConsumerLag,
    DataPlaneError,
    Delivery,
    OutgoingMessage,
    PayloadError,
    ProvisionReport,
    PublishAck,
    StoredMessage,
    StreamState,
)
from dockyard.broker.provisioning import (
    consumer_config,
    ensure_consumer,
    ensure_streams,
    stream_config,
)
from dockyard.broker.sites import (
    PromptRouter,
    backlog_readers,
    check_domain,
    consumers_at_site,
    prompt_source_consumer,
    prompt_source_consumer_config,
)
from dockyard.broker.stream_room import StreamRoom
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.utils.logging import get_logger
from dockyard.utils.tasks import spawn

log = get_logger(__name__)


class JetStreamPlane(AdminPlane):
    def __init__(
        self, config: DataPlaneConfig, *, provision: bool = True, client_name: str = "dockyard"
    ) -> None:
        super().__init__(config)
        self._provision_on_start = provision
        self._client_name = client_name
        self._events = ConnectionEvents()
        self._nc: DockyardClient | None = None
        self._js: JetStreamContext | None = None
        self._embedded: EmbeddedNatsServer | None = None
        self._channels: dict[str, PullChannel] = {}
        self._advisory_subs: list[object] = []
        self._sweepers: list[asyncio.Task[None]] = []
        self._known_consumers: set[str] = set()
        self._publisher = JetStreamPublisher(config, self.names, self._events, self)
        self._history = JetStreamHistory(
            config, self.names, self._events, self, self.followed_stream
        )
        self._prompt_router = PromptRouter(self.names, config.site)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def nc(self) -> DockyardClient:
        if self._nc is None:
            raise DataPlaneError("the JetStream plane is not started (use `async with plane`)")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise DataPlaneError("the JetStream plane is not started (use `async with plane`)")
        return self._js

    @property
    def reconnects(self) -> int:
        """How often the connection came back after a broker outage."""
        return self._events.reconnects

    @property
    def embedded_server(self) -> EmbeddedNatsServer | None:
        return self._embedded

    async def start(self) -> None:
        if self._nc is not None:
            return
        embedded_url = None
        if self.config.is_embedded:
            embedded_url = await asyncio.to_thread(self._start_embedded)
        urls = server_urls(self.config, embedded_url)
        try:
            self._nc = await connect(self.config, urls, self._events, name=self._client_name)
        except (nats.errors.NoServersError, OSError, TimeoutError) as error:
            raise DataPlaneError(
                f"cannot connect to the data plane at {urls}: {error!r}"
            ) from error
        self._js = PipelinedJetStream(
            self._nc,
            prefix=self.config.api_prefix,
            timeout=self.config.publish.timeout_s,
            publish_async_max_pending=PENDING_PUBLISH_SLOTS,
        )
        await check_domain(self._js, self.config.site)
        if self._provision_on_start:
            await self.provision()

    def _start_embedded(self) -> str:
        embedded = self.config.embedded
        store = (
            Path(embedded.store_dir)
            if embedded.store_dir
            else Path(tempfile.mkdtemp(prefix="dockyard-nats-"))
        )
        self._embedded = EmbeddedNatsServer(
            EmbeddedServerSettings(
                store_dir=store,
                host=embedded.host,
                port=embedded.port,
                max_payload=self.config.max_payload,
                max_pending=self.config.max_pending,
            )
        )
        return self._embedded.start()

    async def close(self) -> None:
        for sweeper in self._sweepers:
            sweeper.cancel()
        await asyncio.gather(*self._sweepers, return_exceptions=True)
        self._sweepers.clear()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if self._nc is not None:
            self._events.closing = True
            # Closing after the broker died must not fail the caller: nothing is left to flush.
            with contextlib.suppress(TimeoutError, nats.errors.Error, OSError):
                async with asyncio.timeout(5):
                    await self._nc.close()
            self._nc = None
            self._js = None
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
            self._embedded = None

    # -- provisioning ------------------------------------------------------------------------
    async def provision(
        self, *, update_limits: bool = False, local_store: Path | None = None
    ) -> ProvisionReport:
        """Create every stream and consumer missing, update their layout; an existing stream
        keeps its limits unless ``update_limits``. ``local_store``: the server's JetStream store
        directory when it is on this machine (a server this process started, or ``broker
        up``'s): the streams to create are checked against its disk before any is."""
        if local_store is None and self._embedded is not None:
            local_store = self._embedded.settings.store_dir
        wanted = [
            stream_config(
                spec, self.config, is_blob_store=spec.name == self.names.blobs_stream.name
            )
            for spec in self.names.all_streams()
        ]
        store = None
        if local_store is not None:
            max_file_store = self._embedded.settings.max_file_store if self._embedded else None
            store = (local_store, max_file_store)
        outcomes = await ensure_streams(self.js, wanted, update_limits=update_limits, store=store)
        differences = tuple(d for outcome in outcomes for d in outcome.limits)
        for consumer in consumers_at_site(self.names, self.config.site):
            outcomes.append(
                await ensure_consumer(self.js, consumer, consumer_config(consumer, self.config))
            )
            self._known_consumers.add(consumer.durable)
        for domain in self.config.site.rollout_domains:
            source = prompt_source_consumer(self.names, domain)
            source_config = prompt_source_consumer_config(self.names, domain)
            outcomes.append(await ensure_consumer(self.js, source, source_config))
            self._known_consumers.add(source.durable)  # never to be made a pull consumer
        return ProvisionReport(
            created=tuple(o.name for o in outcomes if o.action == "created"),
            updated=tuple(o.name for o in outcomes if o.action == "updated"),
            unchanged=tuple(o.name for o in outcomes if o.action == "unchanged"),
            kept=() if update_limits else differences,
            changed=differences if update_limits else (),
        )

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        if spec.durable in self._known_consumers:
            return
        await ensure_consumer(self.js, spec, consumer_config(spec, self.config))
        self._known_consumers.add(spec.durable)

    # -- producing (:mod:`.jetstream_publish`) -----------------------------------------------
    @property
    def usable_payload(self) -> int:
        """Bytes one message may carry: the smaller of the config's and the server's cap."""
        return self._publisher.usable_payload

    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        msg_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> PublishAck:
        subject = await self._prompt_router.routed_subject(self.js, subject, msg_id)
        return await self._publisher.publish(subject, payload, msg_id=msg_id, headers=headers)

    async def publish_many(self, messages: Sequence[OutgoingMessage]) -> list[PublishAck]:
        messages = await self._prompt_router.routed(self.js, messages)
        limit = self.usable_payload  # once: it reads the server's cap through two properties
        if any(len(m.payload) > limit for m in messages):
            # Keep order simple: a batch with a chunked message goes one by one.
            return await super().publish_many(messages)
        return await self._publisher.publish_window(list(messages))

    # -- consuming ---------------------------------------------------------------------------
    async def _channel(self, spec: ConsumerSpec) -> PullChannel:
        channel = self._channels.get(spec.durable)
        if channel is None:
            await self.ensure_consumer(spec)
            channel = PullChannel(
                self.nc,
                spec,
                api_prefix=self.config.api_prefix,
                max_bytes=max(1, self.config.max_pending // 2),
            )
            await channel.open()
            self._advisory_subs.append(await exhausted.watch(self, spec))
            if exhausted.is_work_queue(self, spec):
                # Exhausted messages an outage left behind (advisories nobody heard).
                await exhausted.sweep_now(self, spec)
                self._sweepers.append(
                    spawn(exhausted.sweep_periodically(self, spec), name=f"sweep-{spec.durable}")
                )
            self._channels[spec.durable] = channel
        return channel

    async def fetch(
        self, consumer: ConsumerSpec, batch: int | None = None, timeout_s: float = 1.0
    ) -> list[Delivery]:
        channel = await self._channel(consumer)
        want = batch or self.config.consumer.fetch_batch
        try:
            msgs = await channel.fetch(want, timeout_s)
        except (nats.errors.ConnectionReconnectingError, nats.errors.ConnectionClosedError) as e:
            log.warning("fetch.disconnected", consumer=consumer.durable, error=repr(e))
            with contextlib.suppress(TimeoutError):  # wait for the reconnect, do not spin
                async with asyncio.timeout(timeout_s):
                    await self._events.connected.wait()
            return []
        deliveries: list[Delivery] = []
        for msg in msgs:
            delivery = await self._to_delivery(msg)
            if delivery is not None:
                deliveries.append(delivery)
        return deliveries

    async def _to_delivery(self, msg: Msg) -> Delivery | None:
        """The delivery as published, or None when it was refused: its headers are input like
        its payload, and one the plane cannot read (malformed, or chunks gone) is dead-lettered
        with its reason here (``chunking.read``), so no consumer ever fails on it."""
        headers: Mapping[str, str] = user_headers(msg.headers)
        try:
            headers, data = await chunking.read(headers, msg.data, self._history.chunk)
        except PayloadError as error:
            raw = JetStreamDelivery(msg, data=msg.data, headers=headers)
            await self.refuse(raw, error.reason, str(error))
            return None
        return JetStreamDelivery(msg, data=data, headers=headers)

    async def consumer_lag(self, consumer: ConsumerSpec) -> ConsumerLag:
        readers = backlog_readers(self.names, self.config.site, consumer)
        for reader in readers:
            await self.ensure_consumer(reader)
        infos = [await self.js.consumer_info(r.stream, r.durable) for r in readers]
        return ConsumerLag(
            readers[0].durable if len(readers) == 1 else consumer.durable,
            consumer.stream,
            pending=sum(int(i.num_pending or 0) for i in infos),
            ack_pending=sum(int(i.num_ack_pending or 0) for i in infos),
            redelivered=sum(int(i.num_redelivered or 0) for i in infos),
            # Several readers (sites): each reads its own stream, so the floor means nothing
            # across them; only one reader's floor is a position in ``consumer.stream``.
            ack_floor=_ack_floor(infos[0]) if len(readers) == 1 else 0,
        )

    async def stream_room(self, stream: str) -> StreamRoom | None:
        try:
            info = await self.js.stream_info(stream)
        except NotFoundError:
            return None
        return StreamRoom(
            stream,
            bytes=int(info.state.bytes or 0),
            max_bytes=int(info.config.max_bytes if info.config.max_bytes is not None else -1),
            messages=int(info.state.messages or 0),
            max_msgs=int(info.config.max_msgs if info.config.max_msgs is not None else -1),
        )

    async def trim_history(self, subject: str, below_seq: int) -> None:
        if below_seq <= 1:
            return
        stream = self.names.stream_for_subject(subject).name
        with contextlib.suppress(NotFoundError):
            # JetStream's purge with ``seq``: the subject's messages below it, not including it.
            await self.js.purge_stream(stream, subject=subject, seq=below_seq)

    # -- reading history (:mod:`.jetstream_history`) ------------------------------------------
    async def get(self, stream: str, seq: int) -> StoredMessage:
        return await self._history.get(stream, seq)

    async def next_stored(self, stream: str, subject: str, from_seq: int) -> StoredMessage | None:
        """The first message on ``subject`` at or after ``from_seq``, or None."""
        return await self._history.next_stored(stream, subject, from_seq)

    async def latest(self, subject: str) -> StoredMessage | None:
        return await self._history.latest(subject)

    def replay(
        self,
        subject: str,
        *,
        from_seq: int | None = None,
        since: datetime | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[StoredMessage]:
        return self._history.replay(subject, from_seq=from_seq, since=since, limit=limit)

    def watch(self, subject: str, *, include_latest: bool = True) -> AsyncIterator[StoredMessage]:
        return self._history.watch(subject, include_latest=include_latest)

    # -- surveying and purging ---------------------------------------------------------------
    async def purge(self, subject: str) -> None:
        stream = self.names.stream_for_subject(subject).name
        with contextlib.suppress(NotFoundError):
            await self.js.purge_stream(stream, subject=subject)

    async def streams(self) -> list[StreamState]:
        states: list[StreamState] = []
        for spec in self.names.all_streams():
            try:
                info = await self.js.stream_info(spec.name)
            except NotFoundError:
                continue
            times = await self._stream_times(spec.name)
            lags = []
            for consumer in await self.js.consumers_info(spec.name):
                lags.append(
                    ConsumerLag(
                        consumer.name,
                        spec.name,
                        pending=int(consumer.num_pending or 0),
                        ack_pending=int(consumer.num_ack_pending or 0),
                        redelivered=int(consumer.num_redelivered or 0),
                    )
                )
            state = info.state
            states.append(
                StreamState(
                    name=spec.name,
                    subjects=tuple(info.config.subjects or ()),
                    retention=str(getattr(info.config.retention, "value", info.config.retention)),
                    messages=state.messages,
                    bytes=state.bytes,
                    first_seq=state.first_seq,
                    last_seq=state.last_seq,
                    first_time=_parse_time(times.get("first_ts")),
                    last_time=_parse_time(times.get("last_ts")),
                    consumers=tuple(lags),
                )
            )
        return states

    async def _stream_times(self, stream: str) -> dict[str, object]:
        """The stream's ``state.first_ts``/``last_ts``, from the server's own answer: nats-py's
        ``StreamState`` drops them (and ``replay ls`` showed every "last" as "-")."""
        try:
            reply = await self.nc.request(
                f"{self.config.api_prefix}.STREAM.INFO.{stream}", b"", timeout=5
            )
            state = json.loads(reply.data).get("state") or {}
        except (TimeoutError, ValueError, nats.errors.Error):
            return {}
        return state if isinstance(state, dict) else {}


def _parse_time(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value and not value.startswith("0001"):
        # The server writes RFC 3339 with nanoseconds; Python 3.11 reads it (truncated to µs),
        # so nats-py's private parser is not needed.
        return datetime.fromisoformat(value)
    return None


def _ack_floor(info: api.ConsumerInfo) -> int:
    floor = info.ack_floor
    return int(floor.stream_seq or 0) if floor is not None else 0
