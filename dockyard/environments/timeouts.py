"""The per-task timeout a scorer applies around ``Environment.score``."""

from __future__ import annotations

import asyncio

from dockyard.environments.base import Environment, GroupScore, ScoreFlag, ScoringGroup
from dockyard.utils.logging import get_logger

logger = get_logger(__name__)


async def score_with_timeout(
    environment: Environment,
    group: ScoringGroup,
    *,
    timeout_s: float | None = None,
    timeout_reward: float | None = None,
) -> GroupScore:
    """``environment.score(group)`` bounded by ``env.<name>.task_timeout``.

    On timeout every sample gets ``env.<name>.timeout_reward`` and the ``timeout`` flag; the
    scoring coroutine is cancelled (environments that run blocking work in threads also stop
    their sandboxes on cancellation). Other exceptions propagate for the scorer to nak or
    dead-letter.
    """
    settings = environment.settings
    limit = settings.task_timeout if timeout_s is None else timeout_s
    reward = settings.timeout_reward if timeout_reward is None else timeout_reward
    try:
        async with asyncio.timeout(limit):
            return await environment.score(group)
    except TimeoutError:
        logger.warning(
            "scoring timed out", env=environment.name, group_id=group.group_id, timeout_s=limit
        )
        return GroupScore.uniform(
            group, reward, frozenset({ScoreFlag.TIMEOUT}), f"timed out after {limit:g}s"
        )
