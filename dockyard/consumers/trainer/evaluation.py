"""Validation in the trainer: greedy answers on held-out prompts, scored by the environment.

Greedy decoding makes the number a property of the weights alone (no sampling noise), so the
curve of validation accuracy per step is comparable across runs and restarts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import torch

from dockyard.data.base import Dataset
from dockyard.engines.base import GenerationRequest
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.torch_engine import TorchEngine
from dockyard.environments.base import Environment, SampleInput, ScoringGroup


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    mean_reward: float
    num_samples: int
    seconds: float

    def as_metrics(self, prefix: str = "val") -> dict[str, float]:
        return {
            f"{prefix}/accuracy": self.accuracy,
            f"{prefix}/mean_reward": self.mean_reward,
            f"{prefix}/num_samples": float(self.num_samples),
            f"timing/{prefix}_s": self.seconds,
        }


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
    ) -> None:
        self.model = model
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
            results = await self.engine.generate(self.requests, self.params, 1)
        finally:
            self.model.train(was_training)
        rewards: list[float] = []
        for record, result in zip(self.records, results, strict=True):
            text = self.tokenizer.decode(result.token_ids, skip_special_tokens=False)  # type: ignore[attr-defined]
            group = ScoringGroup(
                group_id=f"val-{record.index}",
                env_name=self.environment.name,
                prompt_text=record.prompt,
                samples=[SampleInput(response_text=text, finish_reason=result.finish_reason)],
                ground_truth=record.ground_truth,
            )
            rewards.extend((await self.environment.score(group)).rewards)
        correct = sum(1 for reward in rewards if reward >= 1.0)
        return EvalResult(
            accuracy=correct / len(rewards),
            mean_reward=sum(rewards) / len(rewards),
            num_samples=len(rewards),
            seconds=time.perf_counter() - started,
        )

    def evaluate_blocking(self) -> EvalResult:
        """For synchronous callers (the SFT stage runs in a worker thread)."""
        return asyncio.run(self.evaluate())
