"""Dataset record → :class:`PromptGroup` (what the dispatcher publishes)."""

from __future__ import annotations

import time

import numpy as np

from dockyard.data.base import PromptRecord
from dockyard.schemas import DatasetPosition, PromptGroup


def group_id_for(run_id: str, epoch: int, index: int, loader: int = 0) -> str:
    """Deterministic: re-dispatching the same position after a restart reuses the id, so the
    broker's dedupe window and the trainer's ledger recognise it. ``loader`` 0 is data.train;
    an extra dataloader's positions are its own, so its ids name it."""
    if loader:
        return f"{run_id}:l{loader}:e{epoch}:i{index}"
    return f"{run_id}:e{epoch}:i{index}"


def make_prompt_group(
    record: PromptRecord,
    tokenizer: object,
    *,
    run_id: str,
    dataset_name: str,
    epoch: int,
    position: int,
    num_generations: int,
    weight_version: int,
    attempt: int = 0,
    loader: int = 0,
) -> PromptGroup:
    token_ids = tokenizer(record.prompt)["input_ids"]  # type: ignore[operator]  # a transformers tokenizer, typed object here
    group_id = group_id_for(run_id, epoch, position, loader)
    return PromptGroup(
        group_id=group_id,
        attempt=attempt,
        prompt_token_ids=np.asarray(token_ids, dtype=np.int32),
        prompt_text=record.prompt,
        environment=record.env,
        agent=record.agent_name,
        num_generations=num_generations,
        dataset_position=DatasetPosition(dataset=dataset_name, epoch=epoch, index=position),
        ground_truth=record.ground_truth,
        extra=dict(record.extra),
        images=list(record.images),
        dispatch_weight_version=weight_version,
        trace_id=group_id,
        created_at_unix_s=time.time(),
    )
