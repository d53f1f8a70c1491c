"""``data_plane``: the external experience-transfer plane (:class:`DataPlaneConfig`).

``data_plane: null`` (or leaving it out) selects the in-memory plane for one process. This model
lives with the configuration code so the algorithms package never imports the broker.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from dockyard.config.base import Section
from dockyard.config.errors import ConfigIssue

MiB = 1024 * 1024


class StreamLimitsConfig(Section):
    storage: Literal["file", "memory"] = "file"
    replicas: PositiveInt = 1
    #: JetStream reserves a file stream's max_bytes on its store when it creates it: six
    #: streams at 1 GiB (the heartbeats 64 MiB, the blobs none) reserve ≈ 6 GiB, which a
    #: laptop's disk holds (8 GiB each needed ≈ 64 GiB free before a broker could start).
    max_bytes: int = Field(
        1024 * MiB, description="per stream, reserved on the store up front; -1 = unlimited"
    )
    max_msgs: int = Field(-1, description="per stream; -1 = unlimited")
    max_age_s: float = Field(0.0, ge=0.0, description="0 = keep until limits")
    duplicate_window_s: PositiveFloat = 120.0


class ConsumerConfig(Section):
    ack_wait_s: PositiveFloat = 60.0
    max_deliver: PositiveInt = 5
    max_ack_pending: PositiveInt = 256
    fetch_batch: PositiveInt = 16
    nak_delay_s: float = Field(1.0, ge=0.0)


class PublishConfig(Section):
    window: PositiveInt = Field(64, description="publishes awaiting an ack at once")
    window_bytes: PositiveInt = Field(
        64 * MiB,
        description="payload bytes awaiting an ack at once (at least one message); keep it "
        "under the server's per-stream ingest buffer (max_buffered_size, 128 MB by default), "
        "past which it refuses publishes with 429",
    )
    timeout_s: PositiveFloat = 10.0
    retries: NonNegativeInt = 5
    full_stream_wait_s: PositiveFloat = Field(
        300.0,
        description="how long a publish refused by a full stream backs off and retries before "
        "it fails naming the stream (its readers have not caught up)",
    )
    max_buffered_bytes: PositiveInt = Field(256 * MiB, description="while the broker is down")


class CredentialsConfig(Section):
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkeys_seed_file: str | None = None
    creds_file: str | None = None

    def rule_issues(self) -> list[ConfigIssue]:
        if (self.user is None) != (self.password is None):
            return [ConfigIssue("password", "user and password go together")]
        return []


class TLSConfig(Section):
    enabled: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True

    def rule_issues(self) -> list[ConfigIssue]:
        if (self.cert_file is None) != (self.key_file is None):
            return [ConfigIssue("key_file", "cert_file and key_file go together (mutual TLS)")]
        return []


class WeightPatchConfig(Section):
    """Lossless sparse weight patches (``docs/operations.md``, "Sparse weight patches")."""

    enabled: bool = Field(
        False,
        description="publish a version as a patch on the one before (the changed elements of "
        "the engine-dtype weights, bit-identical, digest-checked) between full snapshots; the "
        "trainer and every worker keep one CPU copy of the weights to diff and patch",
    )
    snapshot_every: PositiveInt = Field(
        10,
        description="a full snapshot every this many versions, patches in between: a worker "
        "that missed a patch or joins late reads at most one snapshot and this many minus "
        "one patches; 1 = snapshots only",
    )


class WeightTransportConfig(Section):
    kind: Literal["jetstream", "filesystem", "http"] = "jetstream"
    path: str | None = Field(None, description="shared directory for kind=filesystem")
    base_url: str | None = Field(None, description="base URL for kind=http")
    keep_last_versions: PositiveInt = 3
    retention_grace_s: float = Field(
        300.0,
        ge=0.0,
        description="an old version is deleted only this long after a newer one was put, "
        "so a worker still fetching it can finish",
    )
    reader_lease_ttl_s: PositiveFloat = Field(
        30.0,
        description="a worker fetching a blob holds a lease on it, renewed every third of this; "
        "retention keeps leased versions, and a dead reader's lease lapses after this long",
    )
    chunk_size: PositiveInt = 4 * MiB
    fetch_stall_timeout_s: PositiveFloat = Field(
        30.0, description="give up a blob fetch when no chunk arrived for this long"
    )
    patches: WeightPatchConfig = Field(default_factory=WeightPatchConfig)

    def rule_issues(self) -> list[ConfigIssue]:
        if self.kind == "filesystem" and not self.path:
            return [ConfigIssue("path", "kind=filesystem needs a shared directory path")]
        if self.kind == "http" and not self.base_url:
            return [ConfigIssue("base_url", "kind=http needs a base_url")]
        return []


_DOMAIN = r"^[A-Za-z0-9_-]+$"


class SiteConfig(Section):
    """Two or more sites joined by NATS leaf nodes (``docs/operations.md``, "Multi-site").

    Each site's nats-server has its own JetStream domain. The trainer's site sources the
    experience (and its chunks and dead letters) of every rollout site; a rollout site mirrors
    the weight events and blobs of the trainer's site, so each weight version crosses the WAN
    once per site and every worker there reads the site-local copy, and sources the trainer's
    prompt queue.
    """

    domain: str | None = Field(
        None,
        pattern=_DOMAIN,
        description="JetStream domain of the server `url` points at (its `jetstream.domain`); "
        "checked at start; None = a single site",
    )
    trainer_domain: str | None = Field(
        None,
        pattern=_DOMAIN,
        description="at a rollout site: the trainer site's domain, whose weight streams are "
        "mirrored here; None = this is the trainer's site",
    )
    rollout_domains: list[str] = Field(
        default_factory=list,
        description="at the trainer's site: the rollout sites' domains, whose experience, "
        "chunks and dead letters are sourced here; each prompt group goes to one of them",
    )

    def rule_issues(self) -> list[ConfigIssue]:
        issues: list[ConfigIssue] = []
        if (self.trainer_domain or self.rollout_domains) and self.domain is None:
            key = "trainer_domain" if self.trainer_domain else "rollout_domains"
            issues.append(ConfigIssue(key, "a multi-site plane needs this site's own domain"))
        if self.trainer_domain and self.rollout_domains:
            issues.append(
                ConfigIssue(
                    "rollout_domains",
                    "a site is either the trainer's (rollout_domains) or a rollout site "
                    "(trainer_domain), not both",
                )
            )
        named = [self.trainer_domain, *self.rollout_domains]
        if self.domain is not None and self.domain in named:
            issues.append(ConfigIssue("domain", f"{self.domain!r} cannot replicate from itself"))
        repeated = sorted({d for d in self.rollout_domains if self.rollout_domains.count(d) > 1})
        if repeated:
            issues.append(
                ConfigIssue(
                    "rollout_domains",
                    f"{', '.join(map(repr, repeated))} named twice: each rollout site has one "
                    "feed of prompts and its experience is sourced once",
                )
            )
        issues.extend(
            ConfigIssue("rollout_domains", f"{name!r} is not a JetStream domain name")
            for name in self.rollout_domains
            if not re.fullmatch(_DOMAIN, name)
        )
        return issues


class EmbeddedServerConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(-1, description="-1 picks a free port")
    store_dir: str | None = Field(None, description="None = a directory under the run dir")


class DataPlaneConfig(Section):
    url: str | list[str] = Field(
        "embedded", description="nats:// URL(s), or 'embedded' to start a local nats-server"
    )
    namespace: str = Field("dockyard", pattern=r"^[A-Za-z0-9_-]+$")
    max_payload: PositiveInt = Field(8 * MiB, description="bytes per NATS message")
    max_pending: PositiveInt = Field(64 * MiB, description="client pending buffer, bytes")
    connect_timeout_s: PositiveFloat = Field(
        15.0, description="give up the first connection after this long (reconnects never stop)"
    )
    streams: StreamLimitsConfig = Field(default_factory=StreamLimitsConfig)
    consumer: ConsumerConfig = Field(default_factory=ConsumerConfig)
    publish: PublishConfig = Field(default_factory=PublishConfig)
    credentials: CredentialsConfig = Field(default_factory=CredentialsConfig)
    api_prefix: str = Field(
        "$JS.API",
        pattern=r"^[^.\s*>]+(\.[^.\s*>]+)*$",
        description="JetStream API subject prefix; `broker up --secure` role credentials set the "
        "one under which their account imports the API calls it may make",
    )
    tls: TLSConfig = Field(default_factory=TLSConfig)
    weight_transport: WeightTransportConfig = Field(default_factory=WeightTransportConfig)
    embedded: EmbeddedServerConfig = Field(default_factory=EmbeddedServerConfig)
    site: SiteConfig = Field(default_factory=SiteConfig)

    @property
    def is_embedded(self) -> bool:
        return self.url == "embedded"

    def rule_issues(self) -> list[ConfigIssue]:
        issues: list[ConfigIssue] = []
        urls = [self.url] if isinstance(self.url, str) else self.url
        if not urls:
            issues.append(ConfigIssue("url", "give at least one nats:// URL or 'embedded'"))
        for url in urls:
            if url != "embedded" and not url.startswith(("nats://", "tls://", "ws://", "wss://")):
                issues.append(
                    ConfigIssue("url", f"{url!r} is neither 'embedded' nor a nats:// URL")
                )
        if self.max_payload > self.max_pending:
            issues.append(
                ConfigIssue("max_payload", "must not exceed max_pending (the server refuses it)")
            )
        return issues
