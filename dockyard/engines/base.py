"""The generation-engine interface every backend implements (torch, vLLM, SGLang).

The interface is **async**: a rollout worker awaits ``generate`` while it keeps its broker
connection alive, and engines that compute in-process run the compute in a thread
(``asyncio.to_thread``) so the event loop never blocks.

Token ids in, token ids out. For every generated token an engine returns the log-probability
under the distribution it actually sampled from (after temperature, top-k and top-p, i.e. the
log of the renormalised processed probabilities; 0.0 for greedy decoding, whose distribution is
a point mass) and the weight version that produced it.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

import numpy as np

if TYPE_CHECKING:
    import torch
    from PIL import Image

FinishReason = Literal["stop", "length", "abort"]
InflightRefitPolicy = Literal["finish_on_old", "continue_on_new"]

# A refit source: an HF directory or one .safetensors file (digest verified upstream), or an
# in-memory state dict (a colocated trainer).
WeightSource: TypeAlias = "str | os.PathLike[str] | Mapping[str, torch.Tensor]"


class EngineError(RuntimeError):
    """An engine failed or refused a request; the message says why."""


class InvalidSamplingParams(ValueError):
    """Sampling parameters that must not reach an engine (NaN, inf, out of range)."""


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling parameters; build with :func:`sampling_params_from_config` or
    :meth:`create`, which refuse invalid values. ``top_k=None`` disables top-k."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt; the engine generates ``num_samples`` completions for it.

    ``images`` are already normalised (see :mod:`dockyard.producers.multimodal`); engines that
    cannot forward images refuse a request that carries any. ``prompt_token_ids`` may hold each
    image as one placeholder (as the chat template writes it) or already expanded.
    """

    prompt_token_ids: Sequence[int]
    request_id: str = ""
    images: Sequence[Image.Image] = ()


@dataclass(frozen=True)
class GenerationTimings:
    """Seconds since the engine received the batch (``time.perf_counter`` based)."""

    first_token_s: float | None
    total_s: float


@dataclass(frozen=True)
class GenerationResult:
    """One completion. ``generate`` returns ``len(requests) * num_samples`` results, ordered by
    request then sample (index ``request_index * num_samples + sample_index``).

    ``token_ids`` include the stop token that ended the sample (EOS or a stop token id).
    ``logprobs`` (float32) and ``weight_versions`` (int64) align with ``token_ids``.
    """

    request_index: int
    sample_index: int
    request_id: str
    token_ids: np.ndarray
    logprobs: np.ndarray
    weight_versions: np.ndarray
    finish_reason: FinishReason
    timings: GenerationTimings
    #: The prompt ids the model attended to, when they differ from the request's (a
    #: vision-language prompt with its image placeholders expanded); None: the request's own.
    prompt_token_ids: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass(frozen=True)
class EngineHealth:
    ok: bool
    backend: str
    weight_version: int
    detail: str = ""
    extra: dict[str, str] = field(default_factory=dict)


class GenerationEngine(ABC):
    """What a rollout worker needs from a backend.

    ``current_version`` is the weight version that new tokens are generated with; it starts at
    the version given at construction (0 for the initial weights).
    """

    backend: str = "abstract"

    @property
    def accepts_images(self) -> bool:
        """Whether requests may carry images (a rollout worker refuses image samples otherwise)."""
        return False

    @property
    @abstractmethod
    def current_version(self) -> int: ...

    @abstractmethod
    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams, num_samples: int
    ) -> list[GenerationResult]:
        """``num_samples`` completions for every request (see :class:`GenerationResult`)."""

    @abstractmethod
    async def update_weights(self, version: int, source: WeightSource) -> None:
        """Load new weights and make ``version`` current. Returns once tokens are generated
        with the new weights (requests in flight follow the engine's in-flight refit policy)."""

    @abstractmethod
    async def health(self) -> EngineHealth: ...

    @abstractmethod
    async def shutdown(self) -> None:
        """Abort requests in flight (their results end with ``finish_reason="abort"``) and
        release resources. Idempotent."""

    async def __aenter__(self) -> GenerationEngine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()


def check_request_shapes(requests: Sequence[GenerationRequest], num_samples: int) -> None:
    """Refuse what no engine can do anything sensible with, before any compute starts."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    for index, request in enumerate(requests):
        if len(request.prompt_token_ids) == 0:
            raise ValueError(f"request {index} ({request.request_id!r}) has an empty prompt")


def refuse_images(requests: Sequence[GenerationRequest], backend: str) -> None:
    """For backends that cannot forward images: an explicit error, never a silent drop."""
    for request in requests:
        if request.images:
            raise EngineError(
                f"the {backend} backend does not forward images; request "
                f"{request.request_id!r} carries {len(request.images)} image(s)"
            )
