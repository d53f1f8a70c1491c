"""``data_plane.site``: what each site replicates from where, and the refused combinations."""

from __future__ import annotations

import pytest
from nats.js import api
from pydantic import ValidationError

from dockyard.broker.messages import OutgoingMessage
from dockyard.broker.names import PlaneNames
from dockyard.broker.provisioning import stream_config
from dockyard.broker.security import role_grants
from dockyard.broker.sites import (
    LeafCredentials,
    PromptRouter,
    backlog_readers,
    consumers_at_site,
    hub_leafnodes,
    leaf_remote,
    prompt_source_consumer,
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
    # The prompt queue is fed from the trainer site's, by the durable consumer there for "b",
    # and stores what it gets under the subject the workers pull here.
    assert [(s.name, s.external.api, s.consumer.name) for s in prompts] == [
        ("ns_prompts", "$JS.a.API", "ns_prompts_to_b")
    ]
    [back] = prompts[0].subject_transforms
    assert (back.src, back.dest) == ("ns.prompts.site.b", "ns.prompts")
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
    assert feed.deliver_subject and not feed.deliver_subject.startswith("ns.")  # leaf denies ns


@pytest.mark.parametrize(
    ("site", "experience_discard"),
    [
        ({}, api.DiscardPolicy.NEW),  # the trainer trims it (consumers/trainer/history_trim)
        ({"domain": "b", "trainer_domain": "a"}, api.DiscardPolicy.OLD),  # read by a source
        ({"domain": "a", "rollout_domains": ["b"]}, api.DiscardPolicy.OLD),  # fed by sources
    ],
)
def test_only_a_single_sites_experience_stream_refuses_new_messages_when_full(
    site: dict[str, object], experience_discard: api.DiscardPolicy
) -> None:
    streams = _streams(_config(**site))
    assert streams[NS.experience_stream.name].discard == experience_discard  # type: ignore[attr-defined]
    assert streams[NS.prompts_stream.name].discard == api.DiscardPolicy.NEW  # type: ignore[attr-defined]
    assert streams[NS.dead_letters_stream.name].discard == api.DiscardPolicy.OLD  # type: ignore[attr-defined]


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
        ({"domain": "a", "rollout_domains": ["b", "c", "b"]}, "rollout_domains"),  # b twice
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


def test_the_trainer_sites_prompt_backlog_is_what_its_feeds_have_not_sent() -> None:
    trainer_site = _config(domain="a", rollout_domains=["b", "c"]).site
    feeds = backlog_readers(NS, trainer_site, NS.prompt_consumer)
    assert [f.durable for f in feeds] == ["ns_prompts_to_b", "ns_prompts_to_c"]
    assert backlog_readers(NS, trainer_site, NS.scored_consumer) == (NS.scored_consumer,)
    assert backlog_readers(NS, _config().site, NS.prompt_consumer) == (NS.prompt_consumer,)


def test_each_rollout_site_has_its_own_feed_of_the_trainer_sites_prompt_queue() -> None:
    config = _config(domain="a", rollout_domains=["b", "c"])
    queue = _streams(config)[NS.prompts_stream.name]
    # A work queue admits one consumer per subject: one subject per site, one feed each.
    assert queue.subjects == ["ns.prompts.site.b", "ns.prompts.site.c"]  # type: ignore[attr-defined]
    feeds = [prompt_source_consumer(NS, d) for d in ("b", "c")]
    assert [f.filter_subject for f in feeds] == queue.subjects  # type: ignore[attr-defined]
    # Each experience-carrying stream sources every rollout site.
    for name in (NS.experience_stream.name, NS.chunks_stream.name, NS.dead_letters_stream.name):
        sources = _streams(config)[name].sources  # type: ignore[attr-defined]
        assert [s.external.api for s in sources] == ["$JS.b.API", "$JS.c.API"]
    for domain in ("b", "c"):
        rollout = _streams(_config(domain=domain, trainer_domain="a"))
        [source] = rollout[NS.prompts_stream.name].sources  # type: ignore[attr-defined]
        assert source.consumer.name == f"ns_prompts_to_{domain}"


def _prompt(index: int) -> OutgoingMessage:
    return OutgoingMessage(NS.prompts, b"", f"p-{index}")


def test_prompt_groups_go_to_the_site_with_the_fewest_unsent_ties_in_turn() -> None:
    router = PromptRouter(NS, _config(domain="a", rollout_domains=["b", "c"]).site)
    scored = OutgoingMessage(NS.scored, b"", "s-0")
    routed = router.route([_prompt(0), scored, _prompt(1), _prompt(2), _prompt(3)], {})
    assert [m.subject for m in routed] == [
        "ns.prompts.site.b",
        NS.scored,  # not a prompt group: left alone
        "ns.prompts.site.c",
        "ns.prompts.site.b",
        "ns.prompts.site.c",
    ]
    assert [m.msg_id for m in routed] == ["p-0", "s-0", "p-1", "p-2", "p-3"]
    # Site c's feed holds 3 unsent (cut off, say): b takes groups until it holds as many.
    routed = router.route([_prompt(i) for i in range(5)], {"b": 0, "c": 3})
    assert [m.subject.rsplit(".", 1)[1] for m in routed][:3] == ["b", "b", "b"]
    assert sorted(m.subject.rsplit(".", 1)[1] for m in routed[3:]) == ["b", "c"]


def test_a_single_rollout_site_gets_every_prompt_group() -> None:
    router = PromptRouter(NS, _config(domain="a", rollout_domains=["b"]).site)
    routed = router.route([_prompt(i) for i in range(3)], {"b": 7})
    assert {m.subject for m in routed} == {"ns.prompts.site.b"}
    assert not PromptRouter(NS, _config().site).active


def test_role_grants_at_a_trainer_site_publish_prompts_under_the_sites_subjects() -> None:
    site = _config(domain="a", rollout_domains=["b", "c"]).site
    grants = role_grants(NS, site)
    routed = {"ns.prompts.site.b", "ns.prompts.site.c"}
    for role in ("dispatcher", "trainer"):
        assert routed <= set(grants[role].publish)
        assert NS.prompts not in grants[role].publish  # no feed reads the bare subject there
    # Every role checks the server's domain at start and reads the feeds' state (provisioning
    # checks them; the trainer routes by them), and changes neither.
    feeds = {"CONSUMER.INFO.ns_prompts.ns_prompts_to_b", "CONSUMER.INFO.ns_prompts.ns_prompts_to_c"}
    for grant in grants.values():
        assert {"INFO", *feeds} <= set(grant.api)
    assert not any(call.startswith("CONSUMER.CREATE") for g in grants.values() for call in g.api)
    # A single site's grants are what they were: no domain check, the plane's prompt subject.
    single = role_grants(NS)
    assert "INFO" not in single["rollout"].api
    assert NS.prompts in single["dispatcher"].publish


def test_a_secured_leaf_connection_authenticates_and_joins_the_data_accounts() -> None:
    leaves = [LeafCredentials("leaf_b", "pw-b"), LeafCredentials("leaf_c", "pw-c")]
    hub = hub_leafnodes("0.0.0.0:7422", leaves, "data")
    # One user per rollout site, each bound to the account that holds the streams.
    assert '{ user: "leaf_b", password: "pw-b", account: "data" }' in hub
    assert '{ user: "leaf_c", password: "pw-c", account: "data" }' in hub
    remote = leaf_remote("nats-leaf://hub.example:7422", "ns", leaves[0], "data")
    assert 'url: "nats-leaf://leaf_b:pw-b@hub.example:7422"' in remote
    assert 'account: "data"' in remote and 'deny_imports: ["ns.>"]' in remote
    # Unsecured, as before: no authorization, no account.
    assert "authorization" not in hub_leafnodes("0.0.0.0:7422")
    assert "account" not in leaf_remote("nats-leaf://hub.example:7422", "ns")
