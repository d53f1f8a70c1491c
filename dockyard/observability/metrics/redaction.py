"""What trackers may see of the resolved config: everything but its secrets.

``hyperparams.json`` in the run directory keeps the whole config (a retrain reconnects with it;
the directory is its owner's only, see :mod:`dockyard.utils.private_files`). W&B, MLflow,
SwanLab and TensorBoard runs are often shared or uploaded, so they get a copy in which every
credential is replaced by :data:`REDACTED`: the values of ``password`` and ``token`` keys, and
the password of any ``scheme://user:password@host`` URL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

REDACTED = "<redacted>"
SECRET_KEYS = frozenset({"password", "token"})
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@/\s]+(?=@)")


def redact_url(text: str) -> str:
    """``nats://u:pw@host`` → ``nats://u:<redacted>@host``; other text unchanged."""
    return _URL_PASSWORD.sub(lambda match: match["head"] + REDACTED, text)


def redact_secrets(params: Mapping[str, object]) -> dict[str, object]:
    """A copy of ``params`` (as JSON dumps a config: mappings, lists, scalars) without secrets.

    A secret key whose value is None stays None: that no secret was set is not a secret.
    """
    return {
        key: REDACTED if key in SECRET_KEYS and item is not None else _redact(item)
        for key, item in params.items()
    }


def _redact(value: object) -> object:
    if isinstance(value, Mapping):
        return redact_secrets(value)
    if isinstance(value, list | tuple):
        return [_redact(item) for item in value]
    if isinstance(value, str):
        return redact_url(value)
    return value
