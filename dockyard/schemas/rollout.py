"""``Rollout``: the G raw samples a rollout worker generated for one ``PromptGroup``."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

import msgspec
import numpy as np

from dockyard.schemas.arrays import LogProbArray, MaskArray, TokenIdArray, VersionArray
from dockyard.schemas.base import INT64_MAX, Count, Message, NonEmpty, WireModel, check_fields
from dockyard.schemas.columns import (
    RowColumns,
    check_columns,
    check_total,
    columns_from_given_rows,
    columns_from_rows,
    concatenate,
    offsets_of,
    plain_columns,
    rows_from_columns,
    split,
)
from dockyard.schemas.errors import ReasonCode, WireError
from dockyard.schemas.prompt import MAX_INLINE_IMAGE_BYTES, MAX_INLINE_IMAGES, PromptGroup


class FinishReason(StrEnum):
    STOP = "stop"  # an EOS or stop string
    LENGTH = "length"  # max_new_tokens (or the context) reached
    TOOL_CALL = "tool_call"  # stopped to run a tool (multi-turn, final segment)
    ABORT = "abort"  # generation aborted (e.g. refit with abort policy)
    ERROR = "error"  # the engine failed; the sample is kept for accounting


def finish_reason_of(value: Any) -> FinishReason:
    """A finish reason as its member (Python code may pass the value, a ``str``)."""
    if type(value) is FinishReason:
        return value
    try:
        return FinishReason(value)
    except ValueError:
        raise WireError(
            ReasonCode.INVALID_FIELD,
            f"finish reason {str(value)[:32]!r} is not one of "
            + ", ".join(reason.value for reason in FinishReason),
        ) from None


class SamplingParams(WireModel, frozen=True, kw_only=True):
    FINITE: ClassVar[dict[str, float | None]] = {"temperature": 0.0}

    temperature: float
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] = -1  # -1 = disabled
    max_new_tokens: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]
    seed: int | None = None  # any msgpack integer: [-2**63, 2**64)
    stop: list[str] = msgspec.field(default_factory=list)


class EngineInfo(WireModel, frozen=True, kw_only=True):
    name: NonEmpty  # vllm | sglang | torch | ...
    version: NonEmpty


class SampleTimings(WireModel, frozen=True, kw_only=True):
    """Wall-clock times in seconds; ``*_unix_s`` are Unix timestamps."""

    FINITE: ClassVar[dict[str, float | None]] = {
        "started_at_unix_s": 0.0,
        "finished_at_unix_s": 0.0,
        "time_to_first_token_s": 0.0,
        "queue_wait_s": 0.0,
    }

    started_at_unix_s: float
    finished_at_unix_s: float
    time_to_first_token_s: float | None = None
    queue_wait_s: float | None = None  # from delivery to start


class Segment(WireModel, frozen=True, kw_only=True):
    """A span ``[start, end)`` of the response tokens in a multi-turn rollout."""

    role: Literal["assistant", "tool", "user", "environment"]
    start: Count
    end: Count

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise WireError(ReasonCode.INVALID_FIELD, "segment end < start")


class ToolCallError(StrEnum):
    """Why a recorded call's ``result`` is an error text, not the tool's answer (``rollout`` 3.1).

    The first three are the model's doing — they earn ``grpo.invalid_tool_call_advantage``
    (:data:`INVALID_CALL_ERRORS`); the others are the tool's or the sandbox's. A call that
    cannot be read at all has no name to record: it is found in the turn's text by the scorer."""

    UNKNOWN_TOOL = "unknown_tool"  # no tool of that name in the episode's toolbox
    BAD_ARGUMENTS = "bad_arguments"  # the tool refused its arguments
    TOO_MANY_CALLS = "too_many_calls"  # past max_tool_calls_per_turn: not run
    TIMEOUT = "timeout"
    RAISED = "raised"  # the tool failed
    OUTPUT_TOO_LARGE = "output_too_large"  # the result is cut
    INVALID_UTF8 = "invalid_utf8"


#: The errors that make a call invalid: the model asked for something no tool could run.
INVALID_CALL_ERRORS = frozenset(
    {ToolCallError.UNKNOWN_TOOL, ToolCallError.BAD_ARGUMENTS, ToolCallError.TOO_MANY_CALLS}
)
#: An error code on the wire: a snake_case identifier. Codes this build does not know (a newer
#: minor's) are read, and count as the tool's failures, not invalid calls.
TOOL_CALL_ERROR_PATTERN = r"^[a-z][a-z0-9_]{0,63}\Z"
ToolCallErrorCode = Annotated[str, msgspec.Meta(pattern=TOOL_CALL_ERROR_PATTERN)]


class ToolCall(WireModel, frozen=True, kw_only=True):
    call_id: NonEmpty
    name: NonEmpty
    arguments_json: str  # the arguments as the model wrote them (JSON text)
    result: str | None = None  # tool output fed back to the model
    segment_index: Count | None = None  # the assistant segment
    #: Why ``result`` is an error (a :class:`ToolCallError` value); None: the tool answered, or
    #: the call was recorded but not run (``result`` None). Added in ``rollout`` 3.1.
    error: ToolCallErrorCode | None = None

    @property
    def invalid(self) -> bool:
        """The model's call was invalid (an unknown tool, refused arguments, over the limit)."""
        return self.error in INVALID_CALL_ERRORS


#: The first bytes of every PNG file (RFC 2083 §3.1).
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: A sample's images (``rollout`` 3.2): PNG files, bounded like ``PromptGroup.images``.
SampleImages = Annotated[
    list[Annotated[bytes, msgspec.Meta(max_length=MAX_INLINE_IMAGE_BYTES)]],
    msgspec.Meta(max_length=MAX_INLINE_IMAGES),
]


def check_png(images: Sequence[bytes], what: str) -> None:
    """Every image is a PNG file (by its signature): the one lossless form images travel in
    after the engine, so the trainer sees exactly the pixels the engine did."""
    for index, image in enumerate(images):
        if not image.startswith(PNG_SIGNATURE):
            raise WireError(
                ReasonCode.INVALID_FIELD, f"{what}[{index}] is not a PNG file (no PNG signature)"
            )


class RolloutSample(WireModel, frozen=True, kw_only=True):
    """One generation. Response arrays share one length T (one entry per response token)."""

    sample_index: Count  # 0 .. G-1 within the group
    prompt_token_ids: TokenIdArray
    response_token_ids: TokenIdArray
    #: log p_behaviour(token) in nats under the policy that sampled it; finite, ≤ 0 expected.
    behaviour_logprobs: LogProbArray
    #: The weight version that produced each token: a refit may land mid-generation.
    token_weight_versions: VersionArray
    #: 1 = generated by the policy (trained on), 0 = inserted (tool output, user turn).
    loss_mask: MaskArray
    finish_reason: FinishReason
    sampling: SamplingParams
    engine: EngineInfo
    worker_id: NonEmpty
    timings: SampleTimings
    segments: list[Segment] = msgspec.field(default_factory=list)
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    #: Since 3.2. The images the model attended to, as PNG files, one per run of image
    #: placeholders in prompt + response token order (the prompt's images first, then e.g. the
    #: screenshots of observations); the token ids hold the placeholders expanded, as the model
    #: saw them (docs/wire-format.md). ``[]`` for a text sample.
    images: SampleImages = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        check_fields(self)
        check_png(self.images, "images")
        if type(self.finish_reason) is not FinishReason:
            msgspec.structs.force_setattr(
                self, "finish_reason", finish_reason_of(self.finish_reason)
            )
        length = len(self.response_token_ids)
        for name in ("behaviour_logprobs", "token_weight_versions", "loss_mask"):
            other = len(getattr(self, name))
            if other != length:
                raise WireError(
                    ReasonCode.LENGTH_MISMATCH,
                    f"{name} has {other} entries for {length} response tokens",
                )
        for segment in self.segments:
            if segment.end > length:
                raise WireError(
                    ReasonCode.LENGTH_MISMATCH,
                    f"segment [{segment.start}, {segment.end}) exceeds {length} response tokens",
                )

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_token_ids.shape[0])

    def min_weight_version(self) -> int | None:
        versions = self.token_weight_versions
        return int(np.min(versions)) if versions.size else None


#: The columns of a group's sampling parameters, engines and timings (one list per field).
SamplingParamsColumns = plain_columns(SamplingParams)
EngineInfoColumns = plain_columns(EngineInfo)
SampleTimingsColumns = plain_columns(SampleTimings)

TokenCount = Count
WorkerId = NonEmpty

#: The response-aligned arrays: one entry per response token of every sample.
_RESPONSE_ARRAYS = (
    "response_token_ids",
    "behaviour_logprobs",
    "token_weight_versions",
    "loss_mask",
)


class SampleColumns(RowColumns, frozen=True, kw_only=True):
    """A rollout's G samples field by field: entry i of every list, and the i-th run of every
    array (cut by ``prompt_lengths`` / ``response_lengths``), belong to sample i.

    It reads as a sequence of :class:`RolloutSample` (``len``, iteration, indexing), built on
    first access from the checked columns; the trainer reads the columns themselves.
    """

    #: Prompt tokens per sample.
    prompt_lengths: Annotated[list[TokenCount], msgspec.Meta(min_length=1)]
    #: The samples' prompts back to back; with ``prompt_shared``, the one prompt they all have.
    prompt_token_ids: TokenIdArray
    prompt_shared: bool = False
    #: Response tokens per sample (T_i); the four response arrays hold sum(T_i) entries.
    response_lengths: list[TokenCount]
    response_token_ids: TokenIdArray
    behaviour_logprobs: LogProbArray
    token_weight_versions: VersionArray
    loss_mask: MaskArray
    finish_reason: list[FinishReason]
    sampling: SamplingParamsColumns  # type: ignore[valid-type]  # built by plain_columns at import
    engine: EngineInfoColumns  # type: ignore[valid-type]  # built by plain_columns at import
    worker_id: list[WorkerId]
    timings: SampleTimingsColumns  # type: ignore[valid-type]  # built by plain_columns at import
    segments: list[list[Segment]]
    tool_calls: list[list[ToolCall]]
    #: Since 3.2: each sample's images (PNG files). Absent (a 3.1 frame): no sample has any.
    images: list[SampleImages] | None = None

    def __post_init__(self) -> None:
        count = len(self.prompt_lengths)
        check_columns(self, count, "samples")
        if self.images is None:
            # Read as the rows built in Python would be: every sample with no image.
            msgspec.structs.force_setattr(self, "images", [[] for _ in range(count)])
        else:
            for index, images in enumerate(self.images):
                check_png(images, f"samples.images.{index}")
        total = sum(self.response_lengths)
        for name in _RESPONSE_ARRAYS:
            check_total(getattr(self, name), self.response_lengths, name, "response tokens", total)
        if self.prompt_shared:
            shared = self.prompt_token_ids.shape[0]
            if self.prompt_lengths.count(shared) != count:
                raise WireError(
                    ReasonCode.LENGTH_MISMATCH,
                    f"a shared prompt of {shared} tokens, but prompt_lengths differ",
                )
        else:
            check_total(self.prompt_token_ids, self.prompt_lengths, "prompt_token_ids", "tokens")
            self._share_identical_prompts()
        if not any(self.segments):  # most groups have none (no multi-turn structure)
            return
        for index, (segments, length) in enumerate(
            zip(self.segments, self.response_lengths, strict=True)
        ):
            for segment in segments:
                if segment.end > length:
                    raise WireError(
                        ReasonCode.LENGTH_MISMATCH,
                        f"sample {index}: segment [{segment.start}, {segment.end}) exceeds "
                        f"{length} response tokens",
                    )

    def _share_identical_prompts(self) -> None:
        """Write G identical prompts as one shared prompt, as ``from_rows`` does: the same
        content then reads (and compares) the same whichever way an encoder wrote it."""
        lengths = self.prompt_lengths
        first = lengths[0]
        if len(lengths) < 2 or any(length != first for length in lengths):
            return
        prompts = self.prompt_token_ids.reshape(len(lengths), first)
        if bool((prompts == prompts[0]).all()):
            # Still in __post_init__: the struct is not handed out yet.
            msgspec.structs.force_setattr(self, "prompt_token_ids", prompts[0])
            msgspec.structs.force_setattr(self, "prompt_shared", True)

    @classmethod
    def from_rows(cls, rows: Sequence[RolloutSample]) -> SampleColumns:
        """The columns of ``rows`` (checked samples, in ``sample_index`` order 0..G-1)."""
        if any(row.sample_index != index for index, row in enumerate(rows)):
            raise WireError(ReasonCode.INVALID_FIELD, "sample_index must be 0..G-1 in order")
        prompts = [row.prompt_token_ids for row in rows]
        first = prompts[0]
        # One array object (how producers build a group) is shared at once; prompts equal by
        # value are joined, then shared by ``_share_identical_prompts``.
        shared = all(prompt is first for prompt in prompts)
        columns = cls(
            prompt_lengths=[prompt.shape[0] for prompt in prompts],
            prompt_token_ids=first if shared else concatenate(prompts),
            prompt_shared=shared,
            response_lengths=[row.num_response_tokens for row in rows],
            **{
                name: concatenate([getattr(row, name) for row in rows]) for name in _RESPONSE_ARRAYS
            },
            finish_reason=[row.finish_reason for row in rows],
            sampling=SamplingParamsColumns(
                **columns_from_rows(SamplingParams, [row.sampling for row in rows])
            ),
            engine=EngineInfoColumns(**columns_from_rows(EngineInfo, [row.engine for row in rows])),
            worker_id=[row.worker_id for row in rows],
            timings=SampleTimingsColumns(
                **columns_from_rows(SampleTimings, [row.timings for row in rows])
            ),
            segments=[row.segments for row in rows],
            tool_calls=[row.tool_calls for row in rows],
            images=[row.images for row in rows],
        )
        columns.keep_rows(rows)
        return columns

    def _build_rows(self) -> list[RolloutSample]:
        count = len(self.prompt_lengths)
        prompts = self.prompts()
        responses = {
            name: split(getattr(self, name), self.response_lengths) for name in _RESPONSE_ARRAYS
        }
        sampling = rows_from_columns(SamplingParams, self.sampling, count)
        engines = rows_from_columns(EngineInfo, self.engine, count)
        timings = rows_from_columns(SampleTimings, self.timings, count)
        return [
            RolloutSample(
                sample_index=index,
                prompt_token_ids=prompts[index],
                **{name: arrays[index] for name, arrays in responses.items()},
                finish_reason=self.finish_reason[index],
                sampling=sampling[index],
                engine=engines[index],
                worker_id=self.worker_id[index],
                timings=timings[index],
                segments=self.segments[index],
                tool_calls=self.tool_calls[index],
                images=self.sample_images(index),
            )
            for index in range(count)
        ]

    def __len__(self) -> int:
        return len(self.prompt_lengths)

    def sample_images(self, index: int) -> list[bytes]:
        """Sample ``index``'s images (PNG files; ``[]`` for a text sample)."""
        # Never None after __post_init__; the annotation keeps the 3.1 form decodable.
        return self.images[index] if self.images is not None else []

    def response_offsets(self) -> np.ndarray:
        """Where each sample's run starts in the response arrays (G + 1 entries)."""
        return offsets_of(self.response_lengths)

    def prompts(self) -> list[np.ndarray]:
        """Each sample's prompt ids (views; the same array for every sample when shared)."""
        if self.prompt_shared:
            return [self.prompt_token_ids] * len(self.prompt_lengths)
        return split(self.prompt_token_ids, self.prompt_lengths)

    def min_weight_version(self) -> int | None:
        """The oldest weight version of any token of the group (None: no tokens)."""
        versions = self.token_weight_versions
        return int(versions.min()) if versions.size else None


class Rollout(Message, frozen=True, kw_only=True):
    """The raw group: the prompt group it answers plus its G samples (as columns)."""

    SCHEMA_NAME: ClassVar[str] = "rollout"
    #: 3.0: the samples travel as columns (docs/wire-format.md); the first released version
    #: (the pre-release 1.x and 2.x are not read).
    #: 3.1 adds ``ToolCall.error`` (a minor: a field with a default; 3.0 messages still read).
    #: 3.2 adds the samples' ``images`` (a minor: 3.1 messages read with no images).
    SCHEMA_VERSION: ClassVar[str] = "3.2"
    FINITE: ClassVar[dict[str, float | None]] = {"created_at_unix_s": 0.0}

    group: PromptGroup
    #: Built in Python from a list of :class:`RolloutSample` as well.
    samples: SampleColumns
    created_at_unix_s: float = 0.0

    def __post_init__(self) -> None:
        columns_from_given_rows(self, "samples", RolloutSample, SampleColumns)
        check_fields(self)
        if len(self.samples) != self.group.num_generations:
            raise WireError(
                ReasonCode.LENGTH_MISMATCH,
                f"{len(self.samples)} samples for num_generations={self.group.num_generations}",
            )

    @property
    def group_id(self) -> str:
        return self.group.group_id

    def message_id(self) -> str:
        # Not the worker id: a group redelivered to another worker after a crash is the same
        # logical rollout, so JetStream's dedupe window drops the second publish and the
        # trainer's seen-set (keyed by group id) drops anything later.
        return self.group.message_id_as(self.SCHEMA_NAME)
