"""Decentralised (operator-mode) NATS credentials for the tests: operator, account and user
JWTs signed with nkeys, and the ``.creds`` file nats-py reads — what ``nsc`` would generate.

Only the claims the server needs are written (NATS JWT v2: ``typ``/``alg`` header,
``jti``/``iat``/``iss``/``sub``/``name`` and a ``nats`` section with ``type`` and ``version``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import nkeys

UNLIMITED = -1


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class Identity:
    seed: bytes
    public: str

    @classmethod
    def new(cls, prefix: int) -> Identity:
        seed = nkeys.encode_seed(os.urandom(32), prefix)
        return cls(seed, nkeys.from_seed(bytearray(seed)).public_key.decode())

    def sign_jwt(self, subject: str, name: str, nats: dict[str, object]) -> str:
        """A JWT about ``subject`` issued (signed) by this identity."""
        claims: dict[str, object] = {
            "iat": int(time.time()),
            "iss": self.public,
            "name": name,
            "sub": subject,
            "nats": {**nats, "version": 2},
        }
        digest = hashlib.sha512(json.dumps(claims, sort_keys=True).encode()).digest()[:32]
        claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
        header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
        body = _b64(json.dumps(claims).encode())
        signature = nkeys.from_seed(bytearray(self.seed)).sign(f"{header}.{body}".encode())
        return f"{header}.{body}.{_b64(signature)}"


def _account_claims(jetstream: bool) -> dict[str, object]:
    limits: dict[str, object] = {
        "subs": UNLIMITED,
        "data": UNLIMITED,
        "payload": UNLIMITED,
        "imports": UNLIMITED,
        "exports": UNLIMITED,
        "wildcards": True,
        "conn": UNLIMITED,
        "leaf": UNLIMITED,
    }
    if jetstream:
        limits |= {
            "mem_storage": UNLIMITED,
            "disk_storage": UNLIMITED,
            "streams": UNLIMITED,
            "consumer": UNLIMITED,
        }
    return {"type": "account", "limits": limits}


@dataclass(frozen=True)
class OperatorSetup:
    """Server config entries (``EmbeddedServerSettings.extra``) and a user's ``.creds`` file."""

    server_extra: dict[str, str]
    creds_file: Path


def operator_setup(directory: Path, *, user_name: str = "trainer") -> OperatorSetup:
    operator = Identity.new(nkeys.PREFIX_BYTE_OPERATOR)
    system = Identity.new(nkeys.PREFIX_BYTE_ACCOUNT)
    account = Identity.new(nkeys.PREFIX_BYTE_ACCOUNT)
    user = Identity.new(nkeys.PREFIX_BYTE_USER)
    operator_jwt = operator.sign_jwt(operator.public, "test-operator", {"type": "operator"})
    system_jwt = operator.sign_jwt(system.public, "SYS", _account_claims(jetstream=False))
    account_jwt = operator.sign_jwt(account.public, "dockyard", _account_claims(jetstream=True))
    user_jwt = account.sign_jwt(
        user.public,
        user_name,
        {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1},
    )
    directory.mkdir(parents=True, exist_ok=True)
    creds = directory / f"{user_name}.creds"
    creds.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user.seed.decode()}\n"
        "------END USER NKEY SEED------\n"
    )
    creds.chmod(0o600)
    extra = {
        "operator": json.dumps(operator_jwt),
        "system_account": system.public,
        "resolver": "MEMORY",
        "resolver_preload": "{\n"
        f"  {system.public}: {json.dumps(system_jwt)}\n"
        f"  {account.public}: {json.dumps(account_jwt)}\n"
        "}",
    }
    return OperatorSetup(extra, creds)
