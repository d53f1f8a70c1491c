"""Per-role users with subject permissions, for ``dockyard broker up --secure``.

Each role may publish only the data it produces and read only what it consumes; every role can
use the JetStream API (consumers, direct gets, stream info) and inboxes, but only ``admin`` and
the trainer (which prunes old weight blobs) may purge, and only ``admin`` may delete streams.
A rollout worker, say, cannot publish a weight-version event: the server refuses it and the plane
raises :class:`~dockyard.broker.plane.PermissionDenied`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from dockyard.broker.embedded import ServerUser
from dockyard.broker.names import PlaneNames

ROLES = ("dispatcher", "rollout", "scorer", "trainer", "admin")

_COMMON_PUBLISH = ("$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "_INBOX.>")
_COMMON_SUBSCRIBE = ("_INBOX.>", "$JS.EVENT.ADVISORY.>")


@dataclass(frozen=True)
class RoleGrant:
    role: str
    publish: tuple[str, ...]
    may_purge: bool = False
    may_delete: bool = False


def role_grants(names: PlaneNames) -> dict[str, RoleGrant]:
    ns = names.namespace
    chunks = f"{ns}.chunks.>"
    blobs = f"{ns}.blobs.>"
    leases = f"{ns}.leases.>"
    return {
        "dispatcher": RoleGrant("dispatcher", (names.prompts, chunks, names.dead_letters)),
        # Rollout workers read weight blobs, so they write the leases that protect their reads.
        "rollout": RoleGrant("rollout", (names.rollouts, chunks, leases, names.dead_letters)),
        "scorer": RoleGrant("scorer", (names.scored, chunks, names.dead_letters)),
        "trainer": RoleGrant(
            "trainer", (names.weight_events, blobs, chunks, names.dead_letters), may_purge=True
        ),
        "admin": RoleGrant("admin", (">",), may_purge=True, may_delete=True),
    }


def server_user(grant: RoleGrant, password: str) -> ServerUser:
    deny: list[str] = []
    if not grant.may_purge:
        deny.append("$JS.API.STREAM.PURGE.>")
    if not grant.may_delete:
        deny += ["$JS.API.STREAM.DELETE.>", "$JS.API.CONSUMER.DELETE.>"]
    return ServerUser(
        user=grant.role,
        password=password,
        publish_allow=tuple(dict.fromkeys((*grant.publish, *_COMMON_PUBLISH))),
        publish_deny=tuple(deny),
        subscribe_allow=_COMMON_SUBSCRIBE if grant.role != "admin" else (">",),
    )


@dataclass(frozen=True)
class GeneratedCredentials:
    users: tuple[ServerUser, ...]
    files: dict[str, Path]  # role -> YAML with the data_plane.credentials to use


def generate_credentials(names: PlaneNames, directory: Path) -> GeneratedCredentials:
    """Random passwords per role; one 0600 YAML per role to merge into a role's config."""
    directory.mkdir(parents=True, exist_ok=True)
    users = []
    files = {}
    for role, grant in role_grants(names).items():
        password = secrets.token_urlsafe(24)
        users.append(server_user(grant, password))
        path = directory / f"{role}.yaml"
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(
            yaml.safe_dump(
                {"data_plane": {"credentials": {"user": role, "password": password}}},
                sort_keys=False,
            )
        )
        files[role] = path
    return GeneratedCredentials(tuple(users), files)
