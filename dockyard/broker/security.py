"""Per-role users and accounts, for ``dockyard broker up --secure``.

The streams, consumers and the admin live in one account (``DATA_ACCOUNT``, with JetStream);
each other role has an account of its own that reaches the data account only through imports:
the subjects it writes, the JetStream API calls its code makes (under ``ROLE_API_PREFIX``), the
durables it pulls from and the subjects it follows. A separate account is what makes the
allow-list hold: inside one account, any request's reply subject — a publish ack, a direct
get — is published by the server wherever the requester says, into any stream's subjects too,
and a push consumer delivers wherever its creator says. Across accounts an answer only ever
goes back to the requester's account, which holds no stream.

Creating, updating and deleting streams and consumers, purges and account-level calls are the
admin's (and provisioning's, which runs as the admin) alone. Each role's user also has publish
and subscribe permissions for exactly what its account imports, so that a refused publish
surfaces as :class:`~dockyard.broker.plane.PermissionDenied` instead of going nowhere.
``docs/operations.md`` (Security) lists what each role may do and why.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from dockyard.broker.embedded import AccountImport, ServerAccount, ServerUser
from dockyard.broker.exhausted import ADVISORY_MAX_DELIVERIES
from dockyard.broker.names import ConsumerSpec, PlaneNames
from dockyard.broker.sites import LeafCredentials, leaf_user, prompt_subjects, site_api_calls
from dockyard.config.sections.data_plane import SiteConfig

ROLES = ("dispatcher", "rollout", "scorer", "trainer", "admin")
#: The account with JetStream: every stream and consumer, and the admin.
DATA_ACCOUNT = "data"
#: The JetStream API as a role's account imports it (``data_plane.api_prefix``). Not
#: ``$JS.API``: the server answers that itself in an account without JetStream.
ROLE_API_PREFIX = "$JS.DOCKYARD.API"
_API = "$JS.API"


@dataclass(frozen=True)
class RoleGrant:
    """What one role's code does on the data plane, and nothing more."""

    role: str
    #: Subjects it publishes to (stream subjects: the stream's ack comes back).
    publish: tuple[str, ...]
    #: JetStream API calls, without the prefix (``STREAM.INFO.<stream>``).
    api: tuple[str, ...] = ()
    #: Durables it pulls from: pull requests, acks and their max-deliveries advisories.
    pulls: tuple[ConsumerSpec, ...] = ()
    #: Subjects it follows (``watch``): it hears their stored notices.
    watches: tuple[str, ...] = ()


def _reads(stream: str) -> tuple[str, ...]:
    """Direct gets on ``stream``: by sequence or ``next_by_subj`` (the request names the
    subject in its body), and ``last_by_subj`` (the subject follows the stream's name)."""
    return (f"DIRECT.GET.{stream}", f"DIRECT.GET.{stream}.>")


def role_grants(names: PlaneNames, site: SiteConfig | None = None) -> dict[str, RoleGrant]:
    """Each role's grant, read off the code each role runs (see docs/operations.md), at the
    server of ``site`` (``data_plane.site``; None: a single site)."""
    site = site or SiteConfig.model_validate({})
    chunks = f"{names.namespace}.chunks.>"
    streams = [spec.name for spec in names.all_streams()]
    # Every role checks at start that the streams and durables are there (``provision``, which
    # only reads when the admin provisioned them already) and reports consumer lag.
    common_api = (
        *(f"STREAM.INFO.{stream}" for stream in streams),
        *(f"CONSUMER.INFO.{c.stream}.{c.durable}" for c in names.consumers()),
        *site_api_calls(names, site),
    )
    # At the trainer site of rollout sites a prompt group is stored under its site's subject.
    prompts = prompt_subjects(names, site)
    # Everyone reassembles chunked messages and may dead-letter what it cannot read. Each role
    # publishes its heartbeat under its own role's name only (heartbeats.py), so no role can
    # speak for another in the fleet view.
    common_publish = (chunks, names.dead_letters)
    weights = names.weights_stream.name
    blobs = names.blobs_stream.name
    return {
        "dispatcher": RoleGrant(
            "dispatcher",
            (*prompts, names.heartbeats_of("dispatcher"), *common_publish),
            api=(*common_api,),
        ),
        # Rollout workers read weight blobs, so they write the leases that protect their reads.
        # A worker sweeping exhausted prompts deletes them from the work queue: no new power,
        # since acking a prompt it pulled removes it as well, and only rollouts read prompts.
        "rollout": RoleGrant(
            "rollout",
            (
                names.rollouts,
                f"{names.namespace}.leases.>",
                names.heartbeats_of("rollout"),
                *common_publish,
            ),
            api=(
                *common_api,
                *_reads(names.prompts_stream.name),
                f"STREAM.MSG.DELETE.{names.prompts_stream.name}",
                *_reads(names.chunks_stream.name),
                *_reads(weights),
                *_reads(blobs),
            ),
            pulls=(names.prompt_consumer,),
            watches=(names.weight_events,),
        ),
        "scorer": RoleGrant(
            "scorer",
            (names.scored, names.heartbeats_of("scorer"), *common_publish),
            api=(
                *common_api,
                *_reads(names.experience_stream.name),
                *_reads(names.chunks_stream.name),
            ),
            pulls=(names.rollout_consumer,),
        ),
        # The trainer process hosts the dispatcher (prompts); it prunes old weight blobs and
        # their lease records and trims a full experience stream's history (purges), resumes
        # from the scored history and diagnoses starvation from every stream's consumers.
        "trainer": RoleGrant(
            "trainer",
            (
                names.weight_events,
                f"{names.namespace}.blobs.>",
                *prompts,
                names.heartbeats_of("trainer"),
                *common_publish,
            ),
            api=(
                *common_api,
                *(f"CONSUMER.LIST.{stream}" for stream in streams),
                *_reads(names.experience_stream.name),
                *_reads(names.chunks_stream.name),
                *_reads(weights),
                *_reads(blobs),
                *_reads(names.leases_stream.name),
                # Dead letters: which dispatched groups died, so it drops them and goes on.
                *_reads(names.dead_letters_stream.name),
                f"STREAM.PURGE.{blobs}",
                f"STREAM.PURGE.{names.leases_stream.name}",
                # The experience history no role needs any more, when the stream fills.
                f"STREAM.PURGE.{names.experience_stream.name}",
            ),
            pulls=(names.scored_consumer,),
        ),
    }


def _imports(grant: RoleGrant, names: PlaneNames) -> tuple[AccountImport, ...]:
    out = [AccountImport(DATA_ACCOUNT, subject) for subject in grant.publish]
    out += [
        AccountImport(DATA_ACCOUNT, f"{_API}.{call}", local_subject=f"{ROLE_API_PREFIX}.{call}")
        for call in grant.api
    ]
    for spec in grant.pulls:
        pull = f"CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}"
        out += [
            AccountImport(
                DATA_ACCOUNT,
                f"{_API}.{pull}",
                local_subject=f"{ROLE_API_PREFIX}.{pull}",
                streamed_response=True,
            ),
            AccountImport(DATA_ACCOUNT, f"$JS.ACK.{spec.stream}.{spec.durable}.>"),
            AccountImport(
                DATA_ACCOUNT,
                f"{ADVISORY_MAX_DELIVERIES}.{spec.stream}.{spec.durable}",
                service=False,
            ),
        ]
    out += [
        AccountImport(DATA_ACCOUNT, names.stored_notice(subject), service=False)
        for subject in grant.watches
    ]
    return tuple(out)


def role_account(grant: RoleGrant, names: PlaneNames, password: str) -> ServerAccount:
    """The role's account and its one user, allowed exactly what the account imports."""
    imports = _imports(grant, names)
    user = ServerUser(
        user=grant.role,
        password=password,
        publish_allow=tuple(i.local_subject or i.subject for i in imports if i.service),
        # Answers come to the requester's inboxes.
        subscribe_allow=("_INBOX.>", *(i.subject for i in imports if not i.service)),
    )
    return ServerAccount(grant.role, (user,), imports=imports)


@dataclass(frozen=True)
class GeneratedCredentials:
    accounts: tuple[ServerAccount, ...]
    files: dict[str, Path]  # role -> YAML with the data_plane settings to use


def generate_credentials(
    names: PlaneNames, directory: Path, site: SiteConfig | None = None
) -> GeneratedCredentials:
    """Random passwords per role; one 0600 YAML per role to merge into a role's config. The
    grants are those of a role at ``site``'s server (a multi-site plane's are wider)."""
    directory.mkdir(parents=True, exist_ok=True)
    passwords = {role: secrets.token_urlsafe(24) for role in ROLES}
    admin = ServerUser("admin", passwords["admin"], publish_allow=(">",), subscribe_allow=(">",))
    accounts = [ServerAccount(DATA_ACCOUNT, (admin,), jetstream=True)]
    accounts += [
        role_account(grant, names, passwords[role])
        for role, grant in role_grants(names, site).items()
    ]
    files = {}
    for role, password in passwords.items():
        settings: dict[str, object] = {"credentials": {"user": role, "password": password}}
        if role != "admin":
            settings["api_prefix"] = ROLE_API_PREFIX
        files[role] = _write_private(directory / f"{role}.yaml", {"data_plane": settings})
    return GeneratedCredentials(tuple(accounts), files)


def _write_private(path: Path, document: dict[str, object]) -> Path:
    """A YAML file only its owner can read (it holds a password)."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def generate_leaf_credentials(
    rollout_domains: list[str], directory: Path
) -> dict[str, tuple[LeafCredentials, Path]]:
    """One leaf user per rollout site, for the trainer site's leaf node listener; each written
    to ``leaf-<domain>.yaml`` (0600) to hand to that site's ``broker up --leaf-credentials``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for domain in rollout_domains:
        credentials = LeafCredentials(leaf_user(domain), secrets.token_urlsafe(24))
        path = _write_private(
            directory / f"leaf-{domain}.yaml",
            {"leaf": {"user": credentials.user, "password": credentials.password}},
        )
        out[domain] = (credentials, path)
    return out


def read_leaf_credentials(path: Path) -> LeafCredentials:
    """A rollout site's leaf credentials, as :func:`generate_leaf_credentials` wrote them."""
    try:
        leaf = yaml.safe_load(path.read_text())["leaf"]
        return LeafCredentials(str(leaf["user"]), str(leaf["password"]))
    except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a leaf credentials file ({error!r})") from None
