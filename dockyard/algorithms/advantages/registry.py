"""The estimator registry: one decorated class per ``grpo.adv_estimator.name``.

This module and :mod:`.estimators` import no torch at module level, so launch-time config
validation can list the estimator names without loading torch; the tensor math lives in
:mod:`.ops` and is imported when an estimator first computes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

if TYPE_CHECKING:
    import torch

    from dockyard.config.sections.grpo import GRPOConfig
    from dockyard.config.sections.loss import ClippedPGLossConfig


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read, for one full batch (never a micro-batch: group statistics
    need every member of a group).

    - ``rewards``: ``[B]`` total reward per sample (after shaping/scaling).
    - ``group_ids``: ``[B]`` explicit group identity (ints, strings, or an int tensor). Samples
      with the same id are the G generations of one prompt. Never derived from prompt tokens:
      two rows with identical prompts are still two groups.
    - ``token_mask``: ``[B, T]`` response tokens; advantages come back in this shape.
    - ``valid_mask``: ``[B]``; invalid samples neither vote in their group's statistics nor get
      an advantage (it is 0). ``None`` = all valid.
    - ``reward_components``: named per-sample rewards ``{name: [B]}`` (gdpo).
    - ``teacher_logprobs`` / ``prev_logprobs``: ``[B, T]`` (opd; ``prev`` also for KL-in-reward).
    - ``reference_logprobs``: ``[B, T]``, for ``loss_fn.use_kl_in_reward``.
    """

    rewards: torch.Tensor
    group_ids: torch.Tensor | Sequence[int] | Sequence[str]
    token_mask: torch.Tensor
    valid_mask: torch.Tensor | None = None
    reward_components: Mapping[str, torch.Tensor] | None = None
    teacher_logprobs: torch.Tensor | None = None
    prev_logprobs: torch.Tensor | None = None
    reference_logprobs: torch.Tensor | None = None


@dataclass(frozen=True)
class EstimatorSettings:
    """``grpo.adv_estimator`` with its inherited switches resolved, plus the KL settings."""

    normalize_rewards: bool
    use_leave_one_out_baseline: bool
    minus_baseline: bool
    reward_weights: Mapping[str, float] | None
    loss: ClippedPGLossConfig

    @classmethod
    def from_config(cls, grpo: GRPOConfig, loss: ClippedPGLossConfig) -> EstimatorSettings:
        est = grpo.adv_estimator
        return cls(
            normalize_rewards=(
                grpo.normalize_rewards if est.normalize_rewards is None else est.normalize_rewards
            ),
            use_leave_one_out_baseline=(
                grpo.use_leave_one_out_baseline
                if est.use_leave_one_out_baseline is None
                else est.use_leave_one_out_baseline
            ),
            minus_baseline=est.minus_baseline,
            reward_weights=est.reward_weights,
            loss=loss,
        )


class AdvantageEstimator(ABC):
    """Base of every estimator. Subclass, set ``name``, implement ``compute``, decorate with
    :func:`register_estimator` — that is all it takes to add one."""

    name: ClassVar[str]
    # True when the estimator applies loss_fn.use_kl_in_reward itself (at the right point of its
    # own computation); otherwise compute_advantages folds the KL in after it.
    folds_kl_in_reward: ClassVar[bool] = False

    def __init__(self, settings: EstimatorSettings) -> None:
        self.settings = settings

    @abstractmethod
    def compute(self, inputs: AdvantageInputs) -> torch.Tensor:
        """Advantages ``[B, T]`` (0 on masked tokens and invalid samples), detached."""


_REGISTRY: dict[str, type[AdvantageEstimator]] = {}
EstimatorT = TypeVar("EstimatorT", bound=type[AdvantageEstimator])


def register_estimator(cls: EstimatorT) -> EstimatorT:
    """Class decorator: make ``cls`` selectable as ``grpo.adv_estimator.name = cls.name``."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__qualname__} needs a non-empty class attribute `name`")
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"estimator {name!r} is already registered by {existing.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def estimator_names() -> list[str]:
    """Registered estimator names, in registration order."""
    return list(_REGISTRY)


def estimator_class(name: str) -> type[AdvantageEstimator]:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(_REGISTRY)
        raise ValueError(
            f"grpo.adv_estimator.name: unknown estimator {name!r}; choose one of {known}"
        ) from None


def build_estimator(grpo: GRPOConfig, loss: ClippedPGLossConfig) -> AdvantageEstimator:
    """The estimator ``grpo.adv_estimator.name`` selects, configured from both sections."""
    return estimator_class(grpo.adv_estimator.name)(EstimatorSettings.from_config(grpo, loss))
