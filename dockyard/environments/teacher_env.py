"""``teacher``: the teacher's log-probs of the sampled response tokens (on-policy distillation).

The teacher is chosen per sample from ``on_policy_distillation.teacher_model_by_agent_name`` (the
sample's agent name, else the group's), falling back to ``default_teacher_alias`` unless
``strict_agent_name_match`` is set, in which case an unknown agent is invalid input (dead-letter).
Teachers share the student's tokenizer (an OPD requirement), so token ids are used as they come.

The reward is 0: under the ``opd`` advantage estimator the trainer builds the advantage from
``teacher_logprobs`` and the behaviour log-probs. Models load lazily, once per alias, and the
forward passes run in a worker thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from dockyard.config.sections.distillation import OnPolicyDistillationConfig
from dockyard.config.sections.env import TeacherEnvConfig
from dockyard.environments.base import (
    Environment,
    EnvironmentContext,
    GroupScore,
    InvalidScoringInput,
    SampleScore,
    ScoringGroup,
)
from dockyard.environments.registry import register_environment

if TYPE_CHECKING:
    import torch
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


def teacher_logprobs(
    model: PreTrainedModel,
    prompt_ids: np.ndarray,
    responses: Sequence[np.ndarray],
    *,
    batch_size: int,
    device: str = "cpu",
) -> list[np.ndarray]:
    """``log p_teacher(response[t] | prompt, response[:t])`` for every response token.

    Sequences are right-padded into batches (causal attention: padding after a sequence cannot
    change its logits), and only the response positions go through ``log_softmax``.
    """
    import torch

    prompt = torch.as_tensor(np.asarray(prompt_ids, dtype=np.int64))
    results: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(responses)
    order = sorted(range(len(responses)), key=lambda i: len(responses[i]))
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            indices = [i for i in order[start : start + batch_size] if len(responses[i])]
            if not indices:
                continue
            sequences = [
                torch.cat([prompt, torch.as_tensor(np.asarray(responses[i], dtype=np.int64))])
                for i in indices
            ]
            longest = max(len(sequence) for sequence in sequences)
            input_ids = torch.zeros((len(sequences), longest), dtype=torch.long)
            attention = torch.zeros((len(sequences), longest), dtype=torch.long)
            for row, sequence in enumerate(sequences):
                input_ids[row, : len(sequence)] = sequence
                attention[row, : len(sequence)] = 1
            logits = model(
                input_ids=input_ids.to(device), attention_mask=attention.to(device)
            ).logits
            for row, index in enumerate(indices):
                results[index] = _response_logprobs(logits[row], sequences[row], len(prompt))
    return results


def _response_logprobs(
    logits: torch.Tensor, sequence: torch.Tensor, prompt_length: int
) -> np.ndarray:
    import torch

    # The token at position p is predicted by the logits at p - 1.
    positions = torch.arange(prompt_length - 1, len(sequence) - 1)
    targets = sequence[prompt_length:].to(logits.device)
    selected = torch.log_softmax(logits[positions].float(), dim=-1)
    return selected.gather(-1, targets.unsqueeze(-1)).squeeze(-1).cpu().numpy().astype(np.float32)


_PRECISION_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def load_teacher(model_name: str, precision: str, device: str) -> PreTrainedModel:
    """A teacher as the policy is loaded: an HF directory or name, or a ``tiny://`` recipe (the
    CPU presets' teachers), in ``precision`` (an unknown one is refused, not read as float32)."""
    from dockyard.models import load_policy

    model, _ = load_policy(model_name, _PRECISION_ALIASES.get(precision, precision))
    # Module.to and .eval move and switch the model in place and return it.
    model.to(device)  # type: ignore[arg-type]  # functools.wraps on transformers' .to mistypes self
    model.eval()  # type: ignore[no-untyped-call]  # transformers leaves eval() unannotated
    return model


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
        self._load_lock = threading.Lock()
        # One forward at a time: torch already uses every core for one batch.
        self._forward_lock = threading.Lock()

    @classmethod
    def from_context(cls, context: EnvironmentContext) -> TeacherEnvironment:
        return cls(context.env.teacher, context.distillation)

    def model(self, alias: str) -> PreTrainedModel:
        with self._load_lock:
            if alias not in self._models:
                teacher = self.distillation.teachers.get(alias)
                if teacher is None:
                    raise InvalidScoringInput("unknown_teacher", f"no teacher named {alias!r}")
                self._models[alias] = load_teacher(
                    teacher.model_name, teacher.precision, self.settings.device
                )
            return self._models[alias]

    async def score(self, group: ScoringGroup) -> GroupScore:
        if group.prompt_token_ids is None:
            raise InvalidScoringInput("missing_tokens", f"group {group.group_id} has no prompt ids")
        by_alias: dict[str, list[int]] = defaultdict(list)
        for index, sample in enumerate(group.samples):
            if sample.response_token_ids is None:
                raise InvalidScoringInput("missing_tokens", f"sample {index} has no token ids")
            by_alias[select_teacher_alias(group.agent_of(index), self.distillation)].append(index)
        return await asyncio.to_thread(self._score_sync, group, dict(by_alias))

    def _score_sync(self, group: ScoringGroup, by_alias: dict[str, list[int]]) -> GroupScore:
        scores: list[SampleScore | None] = [None] * len(group.samples)
        for alias, indices in by_alias.items():
            model = self.model(alias)
            # score() refused a group without prompt ids or a sample without token ids.
            responses = [
                ids for i in indices if (ids := group.samples[i].response_token_ids) is not None
            ]
            prompt_ids = group.prompt_token_ids
            assert prompt_ids is not None and len(responses) == len(indices)
            with self._forward_lock:
                logprobs = teacher_logprobs(
                    model,
                    prompt_ids,
                    responses,
                    batch_size=self.settings.batch_size,
                    device=self.settings.device,
                )
            for index, values in zip(indices, logprobs, strict=True):
                mean = float(values.mean()) if len(values) else 0.0
                scores[index] = SampleScore(
                    reward=0.0,
                    components={"teacher_logprob_mean": mean},
                    detail=f"teacher {alias}",
                    teacher_logprobs=values,
                )
        return GroupScore(group_id=group.group_id, samples=[s for s in scores if s is not None])
