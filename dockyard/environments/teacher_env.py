"""``teacher``: the teacher's log-probs of the sampled response tokens (on-policy distillation).

The teacher is chosen per sample from ``on_policy_distillation.teacher_model_by_agent_name`` (the
sample's agent name, else the group's), falling back to ``default_teacher_alias`` unless
``strict_agent_name_match`` is set, in which case an unknown agent is invalid input (dead-letter).
Teachers share the student's tokenizer (an OPD requirement), so token ids are used as they come.

A teacher with a ``base_url`` is an engine server (``dockyard model serve`` or vLLM's OpenAI
server): the scorer sends it prompt + response and reads back ``prompt_logprobs``. A server that
is down or answers wrongly raises, so the scorer retries the rollout and dead-letters it after
its last delivery (``environment_error``, the URL in the message): nothing is dropped. A teacher
without one is loaded into the scorer's process, lazily, once per alias, its forwards in a
worker thread.

The reward is 0: under the ``opd`` advantage estimator the trainer builds the advantage from
``teacher_logprobs`` and the behaviour log-probs.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np
import torch

from dockyard.config.sections.distillation import OnPolicyDistillationConfig, TeacherModelConfig
from dockyard.config.sections.env import TeacherEnvConfig
from dockyard.engines.prompt_logprobs_client import PromptLogprobsClient
from dockyard.engines.token_logprobs import continuation_logprobs
from dockyard.environments.base import (
    Environment,
    EnvironmentContext,
    GroupScore,
    InvalidScoringInput,
    SampleInput,
    SampleScore,
    ScoringGroup,
)
from dockyard.environments.registry import register_environment

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def select_teacher_alias(agent_name: str | None, distillation: OnPolicyDistillationConfig) -> str:
    mapping = distillation.teacher_model_by_agent_name
    if agent_name is not None and agent_name in mapping:
        return mapping[agent_name]
    if distillation.strict_agent_name_match:
        raise InvalidScoringInput(
            "unknown_agent", f"agent {agent_name!r} has no teacher and strict matching is on"
        )
    if distillation.default_teacher_alias is None:
        raise InvalidScoringInput("no_teacher", f"agent {agent_name!r} has no teacher, no default")
    return distillation.default_teacher_alias


_PRECISION_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def load_teacher(model_name: str, precision: str, device: str) -> PreTrainedModel:
    """A teacher as the policy is loaded: an HF directory or name, or a ``tiny://`` recipe (the
    CPU presets' teachers), in ``precision`` (an unknown one is refused, not read as float32)."""
    from dockyard.models import load_policy

    model, _ = load_policy(model_name, _PRECISION_ALIASES.get(precision, precision))
    # nn.Module.to, not transformers' wrapper (whose annotation mypy misreads); eval as loaded.
    return torch.nn.Module.to(model, device)


# The precision a teacher loaded in-process gets when its config leaves it unset.
DEFAULT_TEACHER_PRECISION = "bfloat16"


@register_environment
class TeacherEnvironment(Environment):
    name = "teacher"
    settings: TeacherEnvConfig

    def __init__(
        self, settings: TeacherEnvConfig, distillation: OnPolicyDistillationConfig
    ) -> None:
        super().__init__(settings)
        self.distillation = distillation
        self._models: dict[str, PreTrainedModel] = {}
        self._servers: dict[str, PromptLogprobsClient] = {}
        self._load_lock = threading.Lock()
        # One forward at a time: torch already uses every core for one batch.
        self._forward_lock = threading.Lock()

    @classmethod
    def from_context(cls, context: EnvironmentContext) -> TeacherEnvironment:
        return cls(context.env.teacher, context.distillation)

    def teacher(self, alias: str) -> TeacherModelConfig:
        teacher = self.distillation.teachers.get(alias)
        if teacher is None:
            raise InvalidScoringInput("unknown_teacher", f"no teacher named {alias!r}")
        return teacher

    def model(self, alias: str) -> PreTrainedModel:
        with self._load_lock:
            if alias not in self._models:
                teacher = self.teacher(alias)
                self._models[alias] = load_teacher(
                    teacher.model_name,
                    teacher.precision or DEFAULT_TEACHER_PRECISION,
                    self.settings.device,
                )
            return self._models[alias]

    def server(self, alias: str, base_url: str) -> PromptLogprobsClient:
        if alias not in self._servers:
            self._servers[alias] = PromptLogprobsClient(
                base_url,
                self.teacher(alias).model_name,
                timeout_s=self.settings.task_timeout,
                batch_size=self.settings.batch_size,
            )
        return self._servers[alias]

    async def score(self, group: ScoringGroup) -> GroupScore:
        if group.prompt_token_ids is None:
            raise InvalidScoringInput("missing_tokens", f"group {group.group_id} has no prompt ids")
        by_alias: dict[str, list[int]] = defaultdict(list)
        for index, sample in enumerate(group.samples):
            if sample.response_token_ids is None:
                raise InvalidScoringInput("missing_tokens", f"sample {index} has no token ids")
            by_alias[select_teacher_alias(group.agent_of(index), self.distillation)].append(index)
        scores: list[SampleScore | None] = [None] * len(group.samples)
        for alias, indices in by_alias.items():
            responses = [_response_ids(group.samples[i]) for i in indices]
            logprobs = await self._logprobs(alias, group.prompt_token_ids, responses)
            for index, values in zip(indices, logprobs, strict=True):
                mean = float(values.mean()) if len(values) else 0.0
                scores[index] = SampleScore(
                    reward=0.0,
                    components={"teacher_logprob_mean": mean},
                    detail=f"teacher {alias}",
                    teacher_logprobs=values,
                )
        return GroupScore(group_id=group.group_id, samples=[s for s in scores if s is not None])

    async def _logprobs(
        self, alias: str, prompt: np.ndarray, responses: list[np.ndarray]
    ) -> list[np.ndarray]:
        base_url = self.teacher(alias).base_url
        if base_url is not None:
            return await self.server(alias, base_url).continuation_logprobs(prompt, responses)
        return await asyncio.to_thread(self._logprobs_in_process, alias, prompt, responses)

    def _logprobs_in_process(
        self, alias: str, prompt: np.ndarray, responses: list[np.ndarray]
    ) -> list[np.ndarray]:
        model = self.model(alias)
        with self._forward_lock:
            return continuation_logprobs(
                model,
                prompt,
                responses,
                batch_size=self.settings.batch_size,
                device=self.settings.device,
            )

    async def aclose(self) -> None:
        for client in self._servers.values():
            await client.aclose()
        self._servers.clear()


def _response_ids(sample: SampleInput) -> np.ndarray:
    assert sample.response_token_ids is not None  # checked in score()
    return sample.response_token_ids
