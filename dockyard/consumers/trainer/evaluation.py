"""Validation in the trainer: greedy answers on held-out prompts, scored by the environment.
With structured tool use an answer is a greedy episode (tools called, observations read), scored
from its tool calls as a rollout's episode is.

Greedy decoding makes the number a property of the weights alone (no sampling noise), so the
curve of validation accuracy per step is comparable across runs and restarts. The first
``logger.num_val_samples_to_print`` answers of each validation are logged as they were given
(``validation.sample`` events: prompt, answer, ground truth, reward), to see *what* the policy
answers, not only how often it is right.

A validation set whose records carry several agent names (a multi-domain mixture, the V4
consolidation stage) is also scored per agent (``val/accuracy/<agent>``,
``val/mean_reward/<agent>``): an overall number can rise while one domain is left behind.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from dockyard.data.base import Dataset
from dockyard.engines.base import GenerationRequest, SamplingParams
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.torch_engine import TorchEngine
from dockyard.environments.base import (
    Environment,
    SampleInput,
    ScoringGroup,
    ToolCallRecord,
    TurnSpan,
    final_turn,
)
from dockyard.schemas import ToolCall
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

#: Longer prompts and answers keep their last this many characters in the log (where the
#: answer is), after a marker saying how many were cut.
MAX_PRINTED_CHARS = 2000


class EpisodeAnswer(Protocol):
    """What validation reads of an episode (``producers.episodes.Episode``); read-only, so an
    episode whose fields are narrower (its finish reason) still is one."""

    @property
    def token_ids(self) -> list[int]: ...
    @property
    def finish_reason(self) -> object: ...
    @property
    def tool_calls(self) -> list[ToolCall]: ...
    @property
    def failure(self) -> str | None: ...
    @property
    def segments(self) -> Sequence[TurnSpan]: ...


class ValidationEpisodes(Protocol):
    """The episode loop (``producers.episodes.EpisodeRunner``), handed in by the command that
    builds the trainer: the trainer's package does not import the rollout side's."""

    async def run_prompts(
        self, environment: str, prompts: Sequence[tuple[str, Sequence[int], Mapping[str, Any]]]
    ) -> Sequence[EpisodeAnswer]: ...


#: Builds the episode loop over the evaluator's engine and greedy sampling parameters.
EpisodesFactory = Callable[[TorchEngine, SamplingParams], ValidationEpisodes]


@dataclass(frozen=True)
class ValSample:
    """One held-out prompt, the policy's greedy answer and its reward."""

    prompt: str
    response: str
    ground_truth: str
    reward: float
    agent: str = "default"


def _accuracy(rewards: Sequence[float]) -> float:
    """Share of answers with full reward (1.0): the scorers' "correct"."""
    return sum(1 for reward in rewards if reward >= 1.0) / len(rewards)


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    mean_reward: float
    num_samples: int
    seconds: float
    samples: tuple[ValSample, ...] = ()

    def as_metrics(self, prefix: str = "val") -> dict[str, float]:
        metrics = {
            f"{prefix}/accuracy": self.accuracy,
            f"{prefix}/mean_reward": self.mean_reward,
            f"{prefix}/num_samples": float(self.num_samples),
            f"timing/{prefix}_s": self.seconds,
        }
        by_agent: dict[str, list[float]] = {}
        for sample in self.samples:
            by_agent.setdefault(sample.agent, []).append(sample.reward)
        # One agent: its numbers are the overall ones, logged once.
        if len(by_agent) > 1:
            for agent, rewards in sorted(by_agent.items()):
                metrics[f"{prefix}/accuracy/{agent}"] = _accuracy(rewards)
                metrics[f"{prefix}/mean_reward/{agent}"] = sum(rewards) / len(rewards)
        return metrics


class Evaluator:
    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: object,
        dataset: Dataset,
        environment: Environment,
        *,
        max_new_tokens: int,
        max_samples: int | None = None,
        batch_size: int | None = None,
        episodes: EpisodesFactory | None = None,
    ) -> None:
        """``episodes``: with structured tool use, builds the episode loop over this
        evaluator's engine; each prompt is then answered by a (greedy) episode."""
        self.model = model
        # grpo.val_batch_size: prompts generated together (bounds the engine's batch memory);
        # None = every validation prompt in one batch.
        self.batch_size = batch_size
        self.tokenizer = tokenizer
        self.records = [dataset[i] for i in range(min(len(dataset), max_samples or len(dataset)))]
        with_images = [record.index for record in self.records if record.images]
        if with_images:
            # Validation generates on its own engine from the prompt text alone: image prompts
            # would be answered blind, a silent wrongness, so they are refused at launch.
            raise ValueError(
                f"validation records {with_images[:5]} carry images (fields.images); validation "
                "does not feed images to the model yet: validate on text prompts or set "
                "data.validation to a dataset without images"
            )
        self.environment = environment
        eos = tokenizer.eos_token_id  # type: ignore[attr-defined]  # tokenizer: object here (no transformers types in this package)
        pad = tokenizer.pad_token_id  # type: ignore[attr-defined]  # tokenizer: object here (no transformers types in this package)
        self.engine = TorchEngine(
            model, eos_token_ids=[eos], pad_token_id=pad if pad is not None else eos
        )
        self.params = make_sampling_params(max_new_tokens=max_new_tokens, temperature=0.0)
        self.requests = [
            GenerationRequest(tokenizer(record.prompt)["input_ids"], request_id=str(index))  # type: ignore[operator]  # a transformers tokenizer, typed object here
            for index, record in enumerate(self.records)
        ]
        self.episodes = None if episodes is None else episodes(self.engine, self.params)

    async def evaluate(self) -> EvalResult:
        started = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        try:
            size = self.batch_size or max(len(self.requests), 1)
            answers: list[SampleInput] = []
            for start in range(0, len(self.requests), size):
                batch = self.requests[start : start + size]
                answers += await (self._episodes(batch) if self.episodes else self._answers(batch))
        finally:
            self.model.train(was_training)
        rewards: list[float] = []
        samples: list[ValSample] = []
        for record, answer in zip(self.records, answers, strict=True):
            text = answer.response_text
            group = ScoringGroup(
                group_id=f"val-{record.index}",
                env_name=self.environment.name,
                prompt_text=record.prompt,
                samples=[answer],
                ground_truth=record.ground_truth,
                # What the record carries for its scorer (test cases, answer type, choices).
                extra=record.extra,
            )
            scored = (await self.environment.score(group)).rewards
            if len(scored) != 1:
                raise RuntimeError(
                    f"environment {self.environment.name!r} returned {len(scored)} rewards "
                    "for one validation answer"
                )
            reward = scored[0]
            rewards.append(reward)
            samples.append(
                ValSample(record.prompt, text, record.ground_truth, reward, record.agent_name)
            )
        return EvalResult(
            accuracy=_accuracy(rewards),
            mean_reward=sum(rewards) / len(rewards),
            num_samples=len(rewards),
            seconds=time.perf_counter() - started,
            samples=tuple(samples),
        )

    async def _answers(self, batch: Sequence[GenerationRequest]) -> list[SampleInput]:
        results = await self.engine.generate(list(batch), self.params, 1)
        return [
            SampleInput(response_text=self._decode(r.token_ids), finish_reason=r.finish_reason)
            for r in results
        ]

    async def _episodes(self, batch: Sequence[GenerationRequest]) -> list[SampleInput]:
        """Each prompt's episode in a fresh tool session; scored like a rollout's episode."""
        assert self.episodes is not None
        records = [self.records[int(request.request_id)] for request in batch]
        prompts = [
            (f"val-{record.index}", request.prompt_token_ids, record.extra)
            for request, record in zip(batch, records, strict=True)
        ]
        episodes = await self.episodes.run_prompts(self.environment.name, prompts)
        failed = [e.failure for e in episodes if e.failure is not None]
        if failed:  # the tool service was lost: scored 0 (no answer), and said so
            log.warning("validation.episodes_failed", count=len(failed), first=failed[0])
        return [
            SampleInput(
                response_text=self._decode(episode.token_ids),
                finish_reason=str(episode.finish_reason),
                final_turn_text=self._final_turn_text(episode),
                tool_calls=[
                    ToolCallRecord(c.name, c.arguments_json, c.result, c.error)
                    for c in episode.tool_calls
                ],
            )
            for episode in episodes
        ]

    def _final_turn_text(self, episode: EpisodeAnswer) -> str | None:
        turn = final_turn(episode.segments)
        return None if turn is None else self._decode(episode.token_ids[turn])

    def _decode(self, token_ids: Sequence[int] | np.ndarray) -> str:
        text: str = self.tokenizer.decode(token_ids, skip_special_tokens=False)  # type: ignore[attr-defined]  # tokenizer: object here (no transformers types in this package)
        return text

    def evaluate_blocking(self) -> EvalResult:
        """For synchronous callers (the SFT stage runs in a worker thread)."""
        return asyncio.run(self.evaluate())


def log_val_samples(samples: Sequence[ValSample], step: int) -> None:
    """One ``validation.sample`` event per sample, long texts cut (:data:`MAX_PRINTED_CHARS`)."""
    for index, sample in enumerate(samples):
        log.info(
            "validation.sample",
            step=step,
            index=index,
            reward=sample.reward,
            prompt=_cut(sample.prompt),
            response=_cut(sample.response),
            ground_truth=_cut(sample.ground_truth),
        )


def _cut(text: str) -> str:
    if len(text) <= MAX_PRINTED_CHARS:
        return text
    return f"[{len(text) - MAX_PRINTED_CHARS} chars cut]…{text[-MAX_PRINTED_CHARS:]}"
