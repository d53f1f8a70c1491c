"""Advantage estimators (placeholder registry; the algorithms issue fills it in)."""

from __future__ import annotations

_NAMES = ["grpo", "reinforce_plus_plus", "gdpo", "opd"]


def estimator_names() -> list[str]:
    return list(_NAMES)
