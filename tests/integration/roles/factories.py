"""Messages for role tests: arithmetic prompt groups and rollouts with known answers."""

from __future__ import annotations

import time

import numpy as np

from dockyard.models import build_character_tokenizer
from dockyard.schemas import (
    DatasetPosition,
    EngineInfo,
    PromptGroup,
    Rollout,
    RolloutSample,
    SampleTimings,
    SamplingParams,
)

TOKENIZER = build_character_tokenizer()


def prompt_group(group_id: str, a: int = 12, b: int = 34, generations: int = 2) -> PromptGroup:
    return PromptGroup(
        group_id=group_id,
        prompt_token_ids=np.array(TOKENIZER(f"{a}+{b}=")["input_ids"], dtype=np.int32),
        prompt_text=f"{a}+{b}=",
        environment="arithmetic",
        agent="arithmetic",
        num_generations=generations,
        dataset_position=DatasetPosition(dataset="test", epoch=0, index=0),
        ground_truth=str(a + b),
        dispatch_weight_version=0,
        trace_id=group_id,
    )


def rollout(
    group: PromptGroup,
    answers: list[str],
    *,
    version: int = 0,
    tokenizer: object = TOKENIZER,
    stamps: list[tuple[str, float, float]] | None = None,
) -> Rollout:
    """One sample per answer, every token generated with weight ``version`` (the character
    tokenizer by default: ``tokenizer`` for answers it cannot spell, such as LaTeX); ``stamps``
    gives each sample's (worker id, started, finished) instead of ``w-test`` and the current
    time."""
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    samples = []
    for index, answer in enumerate(answers):
        ids = tokenizer(answer, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
        tokens = np.array([*ids, eos])
        stamp = stamps[index] if stamps is not None else ("w-test", time.time(), time.time())
        samples.append(
            RolloutSample(
                sample_index=index,
                prompt_token_ids=group.prompt_token_ids,
                response_token_ids=tokens.astype(np.int32),
                behaviour_logprobs=np.full(len(tokens), -0.1, dtype=np.float32),
                token_weight_versions=np.full(len(tokens), version, dtype=np.int64),
                loss_mask=np.ones(len(tokens), dtype=np.uint8),
                finish_reason="stop",
                sampling=SamplingParams(temperature=1.0, max_new_tokens=4),
                engine=EngineInfo(name="torch", version="test"),
                worker_id=stamp[0],
                timings=SampleTimings(started_at_unix_s=stamp[1], finished_at_unix_s=stamp[2]),
            )
        )
    return Rollout(group=group, samples=samples)
