"""``data_plane.site``: what each site replicates from where, and the refused combinations."""

from __future__ import annotations

import pytest
from nats.js import api
from pydantic import ValidationError

from dockyard.broker.names import PlaneNames
from dockyard.broker.provisioning import stream_config
from dockyard.broker.sites import (
    backlog_reader,
    consumers_at_site,
    prompt_source_consumer_config,
)
from dockyard.config.sections.data_plane import DataPlaneConfig

NS = PlaneNames("ns")


def _config(**site: object) -> DataPlaneConfig:
    return DataPlaneConfig.model_validate({"url": "nats://x:4222", "namespace": "ns", "site": site})


def _streams(config: DataPlaneConfig) -> dict[str, object]:
    return {
        spec.name: stream_config(spec, config, is_blob_store=spec.name == NS.blobs_stream.name)
        for spec in NS.all_streams()
    }


def test_a_rollout_site_mirrors_the_trainer_sites_weights_and_keeps_the_rest_local() -> None:
    streams = _streams(_config(domain="b", trainer_domain="a"))
    for name in (NS.weights_stream.name, NS.blobs_stream.name):
        mirrored = streams[name]
        assert mirrored.mirror.name == name  # type: ignore[attr-defined]
        assert mirrored.mirror.external.api == "$JS.a.API"  # type: ignore[attr-defined]
        assert mirrored.subjects is None and mirrored.mirror_direct  # type: ignore[attr-defined]
    prompts = streams[NS.prompts_stream.name].sources  # type: ignore[attr-defined]
    # The prompt queue is fed from the trainer site's, by the durable consumer there for "b".
    assert [(s.name, s.external.api, s.consumer.name) for s in prompts] == [
        ("ns_prompts", "$JS.a.API", "ns_prompts_to_b")
    ]
    for name in (NS.experience_stream.name, NS.leases_stream.name):
        local = streams[name]
        assert local.mirror is None and not local.sources and local.subjects  # type: ignore[attr-defined]


def test_the_trainer_site_sources_experience_chunks_and_dead_letters_of_the_rollout_site() -> None:
    config = _config(domain="a", rollout_domains=["b"])
    streams = _streams(config)
    for name in (NS.experience_stream.name, NS.chunks_stream.name, NS.dead_letters_stream.name):
        sources = streams[name].sources  # type: ignore[attr-defined]
        assert [(s.name, s.external.api) for s in sources] == [(name, "$JS.b.API")]
    assert streams[NS.weights_stream.name].mirror is None  # type: ignore[attr-defined]
    # No worker pulls prompts at the trainer site: the queue's one reader feeds site b.
    assert NS.prompt_consumer not in consumers_at_site(NS, config.site)
    feed = prompt_source_consumer_config(NS, "b")
    assert feed.ack_policy == api.AckPolicy.FLOW_CONTROL and feed.flow_control
    assert feed.max_deliver == -1 and feed.ack_wait is None  # ADR-58's constraints
    assert not feed.deliver_subject.startswith("ns.")  # the leaf denies the namespace


def test_a_single_site_replicates_nothing() -> None:
    for config in _streams(_config()).values():
        assert config.mirror is None and not config.sources  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("site", "key"),
    [
        ({"trainer_domain": "a"}, "trainer_domain"),  # its own domain is needed to check it
        ({"rollout_domains": ["b"]}, "rollout_domains"),
        ({"domain": "a", "trainer_domain": "a"}, "domain"),  # replicating from itself
        ({"domain": "b", "trainer_domain": "a", "rollout_domains": ["c"]}, "rollout_domains"),
        ({"domain": "a", "rollout_domains": ["b", "c"]}, "rollout_domains"),  # one prompt feed
        ({"domain": "a", "rollout_domains": ["b.c"]}, "rollout_domains"),  # not a domain name
        ({"domain": "a b"}, "domain"),
    ],
)
def test_a_site_config_that_cannot_work_is_refused_with_its_key(
    site: dict[str, object], key: str
) -> None:
    with pytest.raises(ValidationError, match=rf"(?m)^\s*(site\.)?{key}\b"):
        _config(**site)


def test_the_blob_stream_announces_manifests_but_not_chunks() -> None:
    blobs = _streams(_config())[NS.blobs_stream.name]
    republish = blobs.republish  # type: ignore[attr-defined]
    assert republish.src == "ns.blobs.*.meta"
    assert republish.dest == "ns.stored.ns.blobs.{{wildcard(1)}}.meta"


def test_the_trainer_sites_prompt_backlog_is_what_its_feed_has_not_sent() -> None:
    trainer_site = _config(domain="a", rollout_domains=["b"]).site
    assert backlog_reader(NS, trainer_site, NS.prompt_consumer).durable == "ns_prompts_to_b"
    assert backlog_reader(NS, trainer_site, NS.scored_consumer) == NS.scored_consumer
    assert backlog_reader(NS, _config().site, NS.prompt_consumer) == NS.prompt_consumer
