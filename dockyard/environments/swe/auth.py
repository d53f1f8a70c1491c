"""The bearer token between the ``swe`` environment and the sandbox service, and where it may be
left out (loopback only).

The token comes from a file (``--token-file`` / ``env.swe.sandbox_token_file``) or, failing that,
from the ``DOCKYARD_SANDBOX_TOKEN`` environment variable; never from the command line, where any
local user can read it in ``/proc/<pid>/cmdline``.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from collections.abc import Mapping
from pathlib import Path

TOKEN_ENV = "DOCKYARD_SANDBOX_TOKEN"
_MIN_TOKEN_BYTES = 16


class TokenError(ValueError):
    """The token cannot be used; the message says why (never the token itself)."""


def read_token(
    path: str | Path | None,
    environ: Mapping[str, str] = os.environ,
    *,
    variable: str = TOKEN_ENV,
) -> bytes | None:
    """The token from ``path``, else from ``$variable`` (``$DOCKYARD_SANDBOX_TOKEN``), else
    None. (The gdpval judge's API key is read the same way, from its own variable.)"""
    if path is not None:
        path = Path(path)
        refuse_if_readable_by_others(path, "token file")
        try:
            text = path.read_text()
        except OSError as error:
            raise TokenError(f"token file {path}: {error.strerror}") from None
        source = f"token file {path}"
    elif variable in environ:
        text, source = environ[variable], f"${variable}"
    else:
        return None
    token = text.strip().encode()
    if len(token) < _MIN_TOKEN_BYTES:
        raise TokenError(f"{source} holds under {_MIN_TOKEN_BYTES} bytes; use a random token")
    return token


def refuse_if_readable_by_others(path: Path, what: str) -> None:
    """A secret's file must be private to its owner (mode 0600 or stricter)."""
    try:
        mode = path.stat().st_mode
    except OSError as error:
        raise TokenError(f"{what} {path}: {error.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokenError(f"{what} {path} is readable by others: chmod 600 it")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve beyond this machine
