"""Which streams a site replicates from another site's JetStream domain (``data_plane.site``).

Sites are joined by NATS leaf nodes, each server with its own JetStream domain, and data crosses
the WAN only by JetStream replication — stream *sources* and *mirrors*, which resume from their
last sequence when a partition heals — never by plain subject interest (the leaf connection
denies the plane's subjects both ways, see :func:`leaf_remote`). So:

- the trainer's site *sources* each rollout site's experience, chunks and dead letters: what a
  rollout site stores while the link is down reaches the trainer after it heals, once (a source
  tracks the sequence it has copied; the stream's duplicate window also drops a re-sent
  ``Nats-Msg-Id``);
- a rollout site *mirrors* the trainer's weight events and blobs: a weight version crosses the
  WAN once per site, and the workers there read the local mirror.

- a rollout site's prompt queue *sources* the trainer site's through a durable consumer there
  that acknowledges by flow control (ADR-58, server >= 2.14): a prompt group leaves the
  trainer's work queue only once the rollout site has stored it, so none is lost in a
  partition, and each goes to the rollout site once.

With several rollout sites, each has its own feed: a work queue admits one consumer per
subject, so the trainer site stores each prompt group under one rollout site's subject
(:func:`site_prompt_subject`, chosen by :class:`PromptRouter` when it is published) and each
site's feed filters its own; the site's source maps the subject back to the plane's prompt
subject, so its workers pull as at a single site.

The leases stream is site-local: workers lease the blobs of their own site's mirror.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from urllib.parse import quote, urlsplit, urlunsplit

from nats.js import JetStreamContext, api

from dockyard.broker.messages import OutgoingMessage
from dockyard.broker.names import ConsumerSpec, PlaneNames, StreamSpec
from dockyard.broker.plane import ProvisioningDrift
from dockyard.config.sections.data_plane import SiteConfig


def domain_api(domain: str) -> str:
    """The subject prefix under which a leaf-joined server answers JetStream API calls."""
    return f"$JS.{domain}.API"


@dataclass(frozen=True)
class Replication:
    """How one stream of this site is filled from other sites (neither: only local writes)."""

    mirror: api.StreamSource | None = None
    sources: tuple[api.StreamSource, ...] = ()
    #: The stream's own subjects when they are not its spec's (None: the spec's).
    subjects: tuple[str, ...] | None = None


#: How often an idle prompt source's consumer sends a heartbeat, which also moves its ack
#: floor (so the trainer's queue forgets what a rollout site stored while nothing new came).
PROMPT_SOURCE_HEARTBEAT_S = 1.0
#: Prompt groups a feed has handed to its site's source and not yet had acknowledged.
PROMPT_SOURCE_MAX_ACK_PENDING = 1000


def _from(
    spec: StreamSpec,
    domain: str,
    consumer: api.StreamConsumerSource | None = None,
    transforms: list[api.SubjectTransform] | None = None,
) -> api.StreamSource:
    return api.StreamSource(
        name=spec.name,
        external=api.ExternalStream(api=domain_api(domain)),
        consumer=consumer,
        subject_transforms=transforms,
    )


def site_prompt_subject(names: PlaneNames, rollout_domain: str) -> str:
    """Where the trainer site stores a prompt group bound for one rollout site."""
    return f"{names.prompts}.site.{rollout_domain}"


def prompt_subjects(names: PlaneNames, site: SiteConfig) -> tuple[str, ...]:
    """The subjects a prompt group published at this site is stored under: at a trainer site
    of rollout sites, one per rollout site; elsewhere the plane's prompt subject."""
    if site.rollout_domains:
        return tuple(site_prompt_subject(names, d) for d in site.rollout_domains)
    return (names.prompts,)


def site_api_calls(names: PlaneNames, site: SiteConfig) -> tuple[str, ...]:
    """JetStream API calls (without the prefix) every role makes at a site of a multi-site
    plane, beyond a single site's: the domain check at start (``INFO``, see
    :func:`check_domain`) and, at the trainer site, each feed's state (provisioning checks it,
    the prompt router and the prompt backlog read it)."""
    if site.domain is None:
        return ()
    feeds = (prompt_source_consumer(names, d) for d in site.rollout_domains)
    return ("INFO", *(f"CONSUMER.INFO.{f.stream}.{f.durable}" for f in feeds))


def prompt_source_consumer(names: PlaneNames, rollout_domain: str) -> ConsumerSpec:
    """The durable consumer on the trainer site's prompt queue that feeds one rollout site:
    it reads only the groups stored for that site, so the feeds never overlap."""
    return ConsumerSpec(
        f"{names.namespace}_prompts_to_{rollout_domain}",
        names.prompts_stream.name,
        site_prompt_subject(names, rollout_domain),
    )


def prompt_source_subject(names: PlaneNames, rollout_domain: str) -> str:
    """Where that consumer delivers: outside the namespace, which the leaf connection denies."""
    return f"_dockyard_sites.{names.namespace}.prompts.{rollout_domain}"


def prompt_source_consumer_config(names: PlaneNames, rollout_domain: str) -> api.ConsumerConfig:
    spec = prompt_source_consumer(names, rollout_domain)
    # ADR-58: a push consumer acknowledged by the sourcing server's flow-control replies, with
    # heartbeats, redelivering without limit; ack_wait and backoff must stay unset.
    return api.ConsumerConfig(
        durable_name=spec.durable,
        deliver_subject=prompt_source_subject(names, rollout_domain),
        deliver_policy=api.DeliverPolicy.ALL,
        ack_policy=api.AckPolicy.FLOW_CONTROL,
        flow_control=True,
        idle_heartbeat=PROMPT_SOURCE_HEARTBEAT_S,
        max_deliver=-1,
        # The server's default, stated: left unset, every role's provisioning would see the
        # server's 1000 against None and try to update the consumer (which a role may not).
        max_ack_pending=PROMPT_SOURCE_MAX_ACK_PENDING,
        filter_subject=spec.filter_subject,
    )


def backlog_readers(
    names: PlaneNames, site: SiteConfig, consumer: ConsumerSpec
) -> tuple[ConsumerSpec, ...]:
    """The consumers whose backlogs together stand for ``consumer`` at this site: at the
    trainer site, the prompt queue's backlog is what its feeds have not yet sent out."""
    if site.rollout_domains and consumer == names.prompt_consumer:
        return tuple(prompt_source_consumer(names, d) for d in site.rollout_domains)
    return (consumer,)


def consumers_at_site(names: PlaneNames, site: SiteConfig) -> tuple[ConsumerSpec, ...]:
    """The plane's pull consumers this site's server holds. At the trainer site of a rollout
    site the prompt queue's only reader is the source feeding it (a work queue admits one
    consumer per subject), so no worker pulls prompts there."""
    if site.rollout_domains:
        return tuple(c for c in names.consumers() if c != names.prompt_consumer)
    return names.consumers()


def replication_for(spec: StreamSpec, names: PlaneNames, site: SiteConfig) -> Replication:
    if site.trainer_domain is not None and spec.name in {
        names.weights_stream.name,
        names.blobs_stream.name,
    }:
        return Replication(mirror=_from(spec, site.trainer_domain))
    if site.trainer_domain is not None and spec.name == names.prompts_stream.name:
        assert site.domain is not None  # a rollout site names its own domain (config rules)
        consumer = api.StreamConsumerSource(
            name=prompt_source_consumer(names, site.domain).durable,
            deliver_subject=prompt_source_subject(names, site.domain),
        )
        # Stored here under the plane's prompt subject, which this site's workers pull.
        back = api.SubjectTransform(src=site_prompt_subject(names, site.domain), dest=names.prompts)
        return Replication(sources=(_from(spec, site.trainer_domain, consumer, [back]),))
    if site.rollout_domains and spec.name == names.prompts_stream.name:
        return Replication(subjects=prompt_subjects(names, site))
    if site.rollout_domains and spec.name in {
        names.experience_stream.name,
        names.chunks_stream.name,
        names.dead_letters_stream.name,
    }:
        return Replication(sources=tuple(_from(spec, d) for d in site.rollout_domains))
    return Replication()


class PromptRouter:
    """Chooses the rollout site each prompt group published at the trainer site goes to.

    Each group goes to the site whose feed has the fewest groups not yet sent (counting the
    ones routed in the same batch), ties taken in turn. A partitioned site's feed cannot send,
    so its count grows and new groups go to the sites that are reachable; what it was given
    stays in the trainer site's queue until the link heals (a work queue: not lost, not
    duplicated). A group re-published with the same ``Nats-Msg-Id`` to another site's subject
    is still one message: the stream's duplicate window is per stream, not per subject.
    """

    def __init__(self, names: PlaneNames, site: SiteConfig) -> None:
        self._names = names
        self._domains = tuple(site.rollout_domains)
        self._turn = itertools.count()

    @property
    def active(self) -> bool:
        return bool(self._domains)

    def feeds(self) -> dict[str, ConsumerSpec]:
        """Each rollout domain's feed consumer, whose pending count is its ``unsent``."""
        return {d: prompt_source_consumer(self._names, d) for d in self._domains}

    def needs_routing(self, messages: Sequence[OutgoingMessage]) -> bool:
        return self.active and any(m.subject == self._names.prompts for m in messages)

    async def routed(
        self, js: JetStreamContext, messages: Sequence[OutgoingMessage]
    ) -> list[OutgoingMessage]:
        """``messages`` routed by what each site's feed has not handed over yet: pending, or
        delivered and not yet acknowledged (stored) by the site's source."""
        if not self.needs_routing(messages):
            return list(messages)
        feeds = self.feeds()
        infos = await asyncio.gather(
            *(js.consumer_info(c.stream, c.durable) for c in feeds.values())
        )
        unsent = {
            domain: int(info.num_pending or 0) + int(info.num_ack_pending or 0)
            for domain, info in zip(feeds, infos, strict=True)
        }
        return self.route(messages, unsent)

    async def routed_subject(self, js: JetStreamContext, subject: str, msg_id: str) -> str:
        """The subject one message is stored under (see :meth:`routed`)."""
        if subject != self._names.prompts or not self.active:
            return subject
        [message] = await self.routed(js, [OutgoingMessage(subject, b"", msg_id)])
        return message.subject

    def route(
        self, messages: Sequence[OutgoingMessage], unsent: Mapping[str, int]
    ) -> list[OutgoingMessage]:
        """``messages`` with each prompt group's subject set to its site's; ``unsent``: each
        rollout domain's feed backlog (groups stored for it, not yet at the site)."""
        load = {d: unsent.get(d, 0) for d in self._domains}
        routed = []
        for message in messages:
            if message.subject != self._names.prompts:
                routed.append(message)
                continue
            start = next(self._turn) % len(self._domains)
            turn = self._domains[start:] + self._domains[:start]
            domain = min(turn, key=lambda d: load[d])  # min keeps the first of equals
            load[domain] += 1
            routed.append(replace(message, subject=site_prompt_subject(self._names, domain)))
        return routed


async def check_domain(js: JetStreamContext, site: SiteConfig) -> None:
    """Refuse a server whose JetStream domain is not ``data_plane.site.domain``: the streams
    would replicate from the wrong place, or from nowhere."""
    if site.domain is None:
        return
    info = await js.account_info()
    served = getattr(info, "domain", None)
    if served != site.domain:
        raise ProvisioningDrift(
            f"data_plane.site.domain is {site.domain!r} but the server's JetStream domain is "
            f"{served!r}; set `jetstream {{ domain: {site.domain} }}` in its config or fix the key"
        )


@dataclass(frozen=True)
class LeafCredentials:
    """The user a rollout site's leaf connection authenticates as at the trainer site."""

    user: str
    password: str


def leaf_user(rollout_domain: str) -> str:
    return f"leaf_{rollout_domain}"


def hub_leafnodes(
    listen: str,
    leaves: Sequence[LeafCredentials] = (),
    account: str | None = None,
) -> str:
    """The value of the trainer site's ``leafnodes`` setting. ``no_advertise``: a leaf must
    reach the hub only through the address it was given (the WAN link), never a learned one.
    With ``leaves``, only those users may connect a leaf (one per rollout site, so one site's
    password can be revoked alone), each bound to ``account``: the account holding the
    streams, whose JetStream API the other site's sources and mirrors call."""
    settings = [f"listen: {json.dumps(listen)}", "no_advertise: true"]
    if leaves:
        bound = f", account: {json.dumps(account)}" if account else ""
        users = ", ".join(
            f"{{ user: {json.dumps(c.user)}, password: {json.dumps(c.password)}{bound} }}"
            for c in leaves
        )
        settings.append(f"authorization: {{ users: [ {users} ] }}")
    return "{ " + ", ".join(settings) + " }"


def leaf_remote(
    hub_url: str,
    namespace: str,
    credentials: LeafCredentials | None = None,
    account: str | None = None,
) -> str:
    """The value of a rollout site's ``leafnodes`` setting: one remote to the hub that carries
    JetStream replication and API calls but none of the plane's own subjects, so a message
    published at one site is stored there first and crosses only by source/mirror (no copy
    through subject interest, which a partition would lose and which would be stored twice).
    ``credentials`` authenticate the connection; ``account`` is the local account it joins to
    the hub's (the one holding the streams)."""
    url = urlsplit(hub_url)
    if credentials is not None:
        userinfo = f"{quote(credentials.user, safe='')}:{quote(credentials.password, safe='')}"
        url = url._replace(netloc=f"{userinfo}@{url.hostname}:{url.port}")
    denied = json.dumps([f"{namespace}.>"])
    remote = [f"url: {json.dumps(urlunsplit(url))}"]
    if account is not None:
        remote.append(f"account: {json.dumps(account)}")
    remote += [f"deny_imports: {denied}", f"deny_exports: {denied}"]
    return "{ remotes: [ { " + ", ".join(remote) + " } ] }"
