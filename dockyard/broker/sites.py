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

The leases stream is site-local: workers lease the blobs of their own site's mirror.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext, api

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


#: How often an idle prompt source's consumer sends a heartbeat, which also moves its ack
#: floor (so the trainer's queue forgets what a rollout site stored while nothing new came).
PROMPT_SOURCE_HEARTBEAT_S = 1.0


def _from(
    spec: StreamSpec, domain: str, consumer: api.StreamConsumerSource | None = None
) -> api.StreamSource:
    return api.StreamSource(
        name=spec.name, external=api.ExternalStream(api=domain_api(domain)), consumer=consumer
    )


def prompt_source_consumer(names: PlaneNames, rollout_domain: str) -> ConsumerSpec:
    """The durable consumer on the trainer site's prompt queue that feeds one rollout site."""
    return ConsumerSpec(
        f"{names.namespace}_prompts_to_{rollout_domain}", names.prompts_stream.name, names.prompts
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
        filter_subject=spec.filter_subject,
    )


def backlog_reader(names: PlaneNames, site: SiteConfig, consumer: ConsumerSpec) -> ConsumerSpec:
    """The consumer whose backlog stands for ``consumer`` at this site: at the trainer site of
    a rollout site, the prompt queue's backlog is what its feed has not yet sent there."""
    if site.rollout_domains and consumer == names.prompt_consumer:
        return prompt_source_consumer(names, site.rollout_domains[0])
    return consumer


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
        return Replication(sources=(_from(spec, site.trainer_domain, consumer),))
    if site.rollout_domains and spec.name in {
        names.experience_stream.name,
        names.chunks_stream.name,
        names.dead_letters_stream.name,
    }:
        return Replication(sources=tuple(_from(spec, d) for d in site.rollout_domains))
    return Replication()


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


def hub_leafnodes(listen: str) -> str:
    """The value of the trainer site's ``leafnodes`` setting. ``no_advertise``: a leaf must
    reach the hub only through the address it was given (the WAN link), never a learned one."""
    return f'{{ listen: "{listen}", no_advertise: true }}'


def leaf_remote(hub_url: str, namespace: str) -> str:
    """The value of a rollout site's ``leafnodes`` setting: one remote to the hub that carries
    JetStream replication and API calls but none of the plane's own subjects, so a message
    published at one site is stored there first and crosses only by source/mirror (no copy
    through subject interest, which a partition would lose and which would be stored twice)."""
    denied = f'["{namespace}.>"]'
    return (
        f'{{ remotes: [ {{ url: "{hub_url}", deny_imports: {denied}, deny_exports: {denied} }} ] }}'
    )
