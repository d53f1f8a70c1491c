"""Validation in the trainer: greedy answers on held-out prompts, scored by the environment.

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
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dockyard.data.base import Dataset
from dockyard.engines.base import GenerationRequest
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.torch_engine import TorchEngine
from dockyard.environments.base import Environment, SampleInput, ScoringGroup
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

#: Longer prompts and answers keep their last this many characters in the log (where the
#: answer is), after a marker saying how many were cut.
MAX_PRINTED_CHARS = 2000


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
    ) -> None:
        self.model = model
        # grpo.val_batch_size: prompts generated together (bounds the engine's batch memory);
        # None = every validation prompt in one batch.
        self.batch_size = batch_size
        self.tokenizer = tokenizer
        self.records = [dataset[i] for i in range(min(len(dataset), max_samples or len(dataset)))]
        self.environment = environment
        eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
        pad = tokenizer.pad_token_id  # type: ignore[attr-defined]
        self.engine = TorchEngine(
            model, eos_token_ids=[eos], pad_token_id=pad if pad is not None else eos
        )
        self.params = make_sampling_params(max_new_tokens=max_new_tokens, temperature=0.0)
        self.requests = [
            GenerationRequest(tokenizer(record.prompt)["input_ids"], request_id=str(index))  # type: ignore[operator]
            for index, record in enumerate(self.records)
        ]

    async def evaluate(self) -> EvalResult:
        started = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        try:
            size = self.batch_size or max(len(self.requests), 1)
            results = [
                result
                for start in range(0, len(self.requests), size)
                for result in await self.engine.generate(
                    self.requests[start : start + size], self.params, 1
                )
            ]
        finally:
            self.model.train(was_training)
        rewards: list[float] = []
        samples: list[ValSample] = []
        for record, result in zip(self.records, results, strict=True):
            text = self.tokenizer.decode(result.token_ids, skip_special_tokens=False)  # type: ignore[attr-defined]
            group = ScoringGroup(
                group_id=f"val-{record.index}",
                env_name=self.environment.name,
                prompt_text=record.prompt,
                samples=[SampleInput(response_text=text, finish_reason=result.finish_reason)],
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
