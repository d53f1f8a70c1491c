"""Multi-turn episodes: generate → parse tool calls → run them → append the observation → again.

Every sample of a prompt group is one episode. Episodes advance in lock-step: each turn is one
``engine.generate`` call holding every episode still running (one request each, so the batch
spans groups), then each episode's tool calls run against its own :class:`ToolSession`.

An episode ends when

- the model's turn asks for no tool (``stop``),
- the turn limit ``grpo.max_rollout_turns`` is reached while it still asks for tools
  (``tool_call``: the wire's "stopped to run a tool"; those calls are recorded, not run),
- the sequence budget ``policy.max_total_sequence_length`` is reached, in a turn or in the middle
  of an observation (``length``; the observation is cut to fit), or a turn hits
  ``policy.generation.max_new_tokens`` (``length``),
- an observation would show more images than ``policy.generation.max_images_per_sample``
  (``length``: the image budget, like the token budget; the observation is not appended and
  :attr:`Episode.ended_by` says why),
- the engine aborted the turn (``abort``), or the tool service is gone, or an image from the
  environment is refused (``error``: a *failed* episode, see
  ``grpo.async_grpo.max_generation_failures``).

What goes on the wire: the response is every token after the prompt — model turns and
observations — with a segment per turn (``assistant``) and per observation (``tool``). Only
model tokens are trained on (``loss_mask`` 1) and carry behaviour log-probs; observation tokens
are masked, with log-prob 0 and the weight version of the model token before them, so the
oldest token's version (staleness) is always a model token's.

Images (:mod:`dockyard.producers.episode_images`): an episode shows its prompt's images, then
the first screenshot of its environment (:meth:`ToolSession.initial_images`, filling the
prompt's remaining image placeholders), then each observation's; every turn's request carries
all of them, and the tokens hold each as its expanded placeholder run, in the same order.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from dockyard.config.sections.env import EnvConfig
from dockyard.data.tool_turns import (
    ChatTemplateError,
    Observations,
    PlainObservations,
    ToolResult,
)
from dockyard.engines.base import GenerationEngine, GenerationRequest, GenerationResult
from dockyard.engines.base import SamplingParams as EngineSamplingParams
from dockyard.environments.tools.calls import (
    ParsedCall,
    ParsedTurn,
    ToolCallFormat,
    parse_tool_calls,
)
from dockyard.environments.tools.toolbox import (
    NOT_RUN_PREFIX,
    TaskRefused,
    Toolbox,
    ToolFailure,
    ToolLimits,
    ToolOutcome,
    ToolServiceUnavailable,
    ToolSession,
    run_tool_call,
    toolbox_class,
)
from dockyard.producers.episode_images import EpisodeImages, ImagePlaceholderError
from dockyard.producers.multimodal import ImageInputError, MultimodalLimits
from dockyard.schemas import FinishReason, PromptGroup, Segment, ToolCall, ToolCallError
from dockyard.utils.logging import get_logger

if TYPE_CHECKING:
    from PIL import Image

    from dockyard.config.sections.grpo import GRPOConfig

log = get_logger(__name__)


class TextCodec(Protocol):
    """What an episode needs of a tokenizer (a ``transformers`` tokenizer is one)."""

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def encode(
        self, text: str, add_special_tokens: bool = ..., split_special_tokens: bool = ...
    ) -> list[int]: ...


@dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int
    tool_call_format: ToolCallFormat
    max_tool_calls_per_turn: int
    #: Prompt + response tokens of one episode (``policy.max_total_sequence_length``).
    max_total_sequence_length: int
    tool_limits: ToolLimits = field(default_factory=ToolLimits)

    @classmethod
    def from_config(cls, grpo: GRPOConfig, max_total_sequence_length: int) -> EpisodeSettings:
        tools = grpo.structured_tool_use
        if tools.tool_call_format not in ("hermes", "openai"):  # the launch check refuses it
            raise ValueError(f"unknown tool_call_format {tools.tool_call_format!r}")
        return cls(
            max_turns=grpo.max_rollout_turns,
            tool_call_format=tools.tool_call_format,  # type: ignore[arg-type]  # the config's str, checked against the formats at load
            max_tool_calls_per_turn=tools.max_tool_calls_per_turn,
            max_total_sequence_length=max_total_sequence_length,
        )


@dataclass(frozen=True)
class EpisodeStart:
    #: Unique per delivery of a sample (group, attempt, delivery, sample): names its sandbox.
    episode_id: str
    #: With each image's placeholder expanded.
    prompt_token_ids: Sequence[int]
    session: ToolSession
    #: Normalised, one per placeholder run of the prompt, in order.
    images: Sequence[Image.Image] = ()


@dataclass
class Episode:
    """One sample's episode as it grows; ``finish_reason`` is None while it runs."""

    start: EpisodeStart
    max_total_sequence_length: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_failures: list[ToolFailure] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    #: Why a failed episode failed (finish reason ``error``).
    failure: str | None = None
    #: Why an episode stopped that no finish reason says alone (the image budget).
    ended_by: str | None = None
    first_token_s: float | None = None
    #: The prompt's images, then each observation's: one per placeholder run, in order.
    images: list[Image.Image] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.images = list(self.start.images)

    @property
    def running(self) -> bool:
        return self.finish_reason is None

    @property
    def remaining(self) -> int:
        """Tokens the sequence budget still allows."""
        used = len(self.start.prompt_token_ids) + len(self.token_ids)
        return max(0, self.max_total_sequence_length - used)

    def context(self) -> list[int]:
        return [*self.start.prompt_token_ids, *self.token_ids]

    def last_turn_ids(self) -> list[int]:
        last = self.segments[-1]
        return self.token_ids[last.start : last.end]

    def finish(self, reason: FinishReason, failure: str | None = None) -> None:
        self.finish_reason = reason
        self.failure = failure

    def add_model_turn(self, result: GenerationResult) -> None:
        kept = min(result.num_tokens, self.remaining)
        start = len(self.token_ids)
        self.token_ids.extend(int(t) for t in result.token_ids[:kept])
        self.logprobs.extend(float(p) for p in result.logprobs[:kept])
        self.versions.extend(int(v) for v in result.weight_versions[:kept])
        self.loss_mask.extend([1] * kept)
        self.segments.append(Segment(role="assistant", start=start, end=len(self.token_ids)))
        if self.first_token_s is None:
            self.first_token_s = result.timings.first_token_s
        if result.finish_reason == "abort":
            self.finish(FinishReason.ABORT)
        elif kept < result.num_tokens or result.finish_reason == "length":
            self.finish(FinishReason.LENGTH)

    def add_observation(
        self,
        token_ids: Sequence[int],
        current_version: int,
        images: Sequence[Image.Image] = (),
        fits: tuple[int, int] | None = None,
    ) -> None:
        """Masked tokens; cut to the budget (and the episode ends) when they do not fit.
        ``fits``: ``(tokens, images)`` that may be kept of them (whole image runs only)."""
        length, shown = fits or (self.remaining, len(images))
        kept = list(token_ids[:length])
        self.images.extend(images[:shown])
        start = len(self.token_ids)
        version = self.versions[-1] if self.versions else current_version
        self.token_ids.extend(kept)
        self.logprobs.extend([0.0] * len(kept))
        self.versions.extend([version] * len(kept))
        self.loss_mask.extend([0] * len(kept))
        self.segments.append(Segment(role="tool", start=start, end=len(self.token_ids)))
        if len(kept) < len(token_ids) or self.remaining == 0:
            self.finish(FinishReason.LENGTH)


def wire_error(failure: ToolFailure | None) -> str | None:
    """The ``ToolCall.error`` code of a run call's failure (the wire's codes are the toolbox's;
    a malformed call is never recorded as a call: it has no name)."""
    if failure is None:
        return None
    return ToolCallError(failure.value).value


class EpisodeRunner:
    def __init__(
        self,
        engine: GenerationEngine,
        params: EngineSamplingParams,
        settings: EpisodeSettings,
        codec: TextCodec,
        env: EnvConfig | None = None,
        observations: Observations | None = None,
        images: EpisodeImages | None = None,
    ) -> None:
        self.engine = engine
        self.params = params
        self.settings = settings
        self.codec = codec
        #: How a turn's results become tokens: tool messages through the chat template where
        #: the prompts have one, else the call format's plain convention (data/tool_turns.py).
        self.observations = observations or PlainObservations(codec, settings.tool_call_format)
        #: The run's ``env`` section: the toolboxes' settings (the terminal's sandbox limits).
        self.env = env or EnvConfig()
        #: The image gate and placeholders (None: a run without images refuses any).
        self.images = images or EpisodeImages(
            MultimodalLimits(), engine.backend, engine.accepts_images
        )
        self.toolboxes: dict[str, Toolbox] = {}

    def toolbox(self, environment: str) -> Toolbox:
        """The toolbox of an environment, built once (UnknownToolboxError: it has none)."""
        if environment not in self.toolboxes:
            self.toolboxes[environment] = toolbox_class(environment).from_env_config(self.env)
        return self.toolboxes[environment]

    async def open_group(
        self, group: PromptGroup, images: Sequence[Image.Image], delivery: int
    ) -> list[EpisodeStart]:
        """A fresh session per sample: a redelivered group replays from scratch, never inside
        the sandbox an earlier delivery left behind (the delivery count is in the id)."""
        toolbox = self.toolbox(group.environment)
        prompt = group.prompt_token_ids.tolist()
        starts: list[EpisodeStart] = []
        try:
            for index in range(group.num_generations):
                episode_id = f"{group.group_id}:{group.attempt}:d{delivery}:s{index}"
                session = await toolbox.open_session(episode_id, group.extra)
                starts.append(EpisodeStart(episode_id, prompt, session))
                starts[-1] = await self.shown_start(starts[-1], images)
        except BaseException:
            await self.close(starts)
            raise
        return starts

    async def shown_start(self, start: EpisodeStart, images: Sequence[Image.Image]) -> EpisodeStart:
        """``start`` showing the prompt's ``images`` (normalised already) and the session's
        first screenshot, placeholders expanded. TaskRefused: they cannot be shown."""
        try:
            initial = self.images.admit(await start.session.initial_images(), len(images))
            shown = [*images, *initial]
            prompt = self.images.expand(start.prompt_token_ids, shown)
        except ImageInputError as error:
            raise TaskRefused(error.reason, f"the episode's first images: {error}") from None
        except ImagePlaceholderError as error:
            raise TaskRefused("image_placeholders", f"the prompt's images: {error}") from None
        return dataclasses.replace(start, prompt_token_ids=prompt, images=shown)

    async def run_prompts(
        self, environment: str, prompts: Sequence[tuple[str, Sequence[int], Mapping[str, Any]]]
    ) -> list[Episode]:
        """One episode per ``(episode_id, prompt token ids, task)``, each in a fresh session of
        ``environment``'s toolbox, closed when they end (the trainer's validation)."""
        toolbox = self.toolbox(environment)
        starts: list[EpisodeStart] = []
        try:
            for episode_id, prompt, task in prompts:
                session = await toolbox.open_session(episode_id, task)
                starts.append(EpisodeStart(episode_id, list(prompt), session))
                starts[-1] = await self.shown_start(starts[-1], ())
            return await self.run(starts)
        finally:
            await self.close(starts)

    async def close(self, starts: Sequence[EpisodeStart]) -> None:
        for start in starts:
            try:
                await start.session.aclose()
            except Exception as error:  # a sandbox that will not close must not lose the work
                log.warning(
                    "episode.session_close_failed", episode=start.episode_id, error=repr(error)
                )

    async def aclose(self) -> None:
        for toolbox in self.toolboxes.values():
            await toolbox.aclose()

    async def run(self, starts: Sequence[EpisodeStart]) -> list[Episode]:
        """Every episode to its end (none is left running)."""
        limit = self.settings.max_total_sequence_length
        episodes = [Episode(start, limit) for start in starts]
        for turn in range(self.settings.max_turns):
            for episode in episodes:
                if episode.running and episode.remaining == 0:
                    episode.finish(FinishReason.LENGTH)
            active = [episode for episode in episodes if episode.running]
            if not active:
                break
            await self.generate_turn(active)
            last_turn = turn + 1 == self.settings.max_turns
            calling = []
            for episode in active:
                if not episode.running:
                    continue
                parsed = parse_tool_calls(
                    self.codec.decode(episode.last_turn_ids(), skip_special_tokens=True),
                    self.settings.tool_call_format,
                )
                if not parsed.wants_tools:
                    episode.finish(FinishReason.STOP)
                elif last_turn:
                    self.record_unrun(episode, parsed)
                    episode.finish(FinishReason.TOOL_CALL)
                else:
                    calling.append(self.run_tools(episode, parsed))
            await asyncio.gather(*calling)
        return episodes

    async def generate_turn(self, active: Sequence[Episode]) -> None:
        # One call for every running episode; each is cut to its own budget afterwards.
        longest = max(episode.remaining for episode in active)
        params = dataclasses.replace(
            self.params, max_new_tokens=min(self.params.max_new_tokens, longest)
        )
        requests = [
            GenerationRequest(episode.context(), episode.start.episode_id, list(episode.images))
            for episode in active
        ]
        results = await self.engine.generate(requests, params, 1)
        for episode, result in zip(active, results, strict=True):
            episode.add_model_turn(result)

    def call_ids(self, episode: Episode, parsed: ParsedTurn) -> list[str]:
        turn = sum(1 for segment in episode.segments if segment.role == "assistant")
        return [call.call_id or f"t{turn}c{index}" for index, call in enumerate(parsed.calls)]

    def record_unrun(self, episode: Episode, parsed: ParsedTurn) -> None:
        segment = len(episode.segments) - 1
        for call, call_id in zip(parsed.calls, self.call_ids(episode, parsed), strict=True):
            episode.tool_calls.append(
                ToolCall(
                    call_id=call_id,
                    name=call.name,
                    arguments_json=call.arguments_json,
                    segment_index=segment,
                )
            )

    async def run_tools(self, episode: Episode, parsed: ParsedTurn) -> None:
        segment = len(episode.segments) - 1
        limits = self.settings.tool_limits
        allowed = self.settings.max_tool_calls_per_turn
        observed: list[ToolResult] = []
        shown: list[bytes] = []
        for malformed in parsed.malformed:
            text = f"error: malformed tool call: {malformed.reason}"
            observed.append(ToolResult("malformed", "malformed", text))
            episode.tool_failures.append(ToolFailure.MALFORMED_CALL)
        for index, (call, call_id) in enumerate(
            zip(parsed.calls, self.call_ids(episode, parsed), strict=True)
        ):
            outcome = await self.outcome(episode, call, index, allowed, limits)
            if outcome is None:
                return  # the tool service is gone: the episode failed
            if outcome.failure is not None:
                episode.tool_failures.append(outcome.failure)
            episode.tool_calls.append(
                ToolCall(
                    call_id=call_id,
                    name=call.name,
                    arguments_json=call.arguments_json,
                    result=outcome.text,
                    segment_index=segment,
                    error=wire_error(outcome.failure),
                )
            )
            observed.append(ToolResult(call_id, call.name, outcome.text, len(outcome.images)))
            shown.extend(outcome.images)
        images = self.admitted(episode, shown)
        if images is None:
            return
        # Tool output is untrusted: a literal "<|im_end|>" in it stays text, never becomes the
        # special token (a tool could otherwise end the turn or forge one of the model's).
        turn = episode.last_turn_ids()
        closed = bool(turn) and turn[-1] == getattr(self.codec, "eos_token_id", None)
        try:
            ids = self.images.expand(self.observations.token_ids(observed, closed), images)
        except (ImagePlaceholderError, ChatTemplateError) as error:
            # Launch refuses a template that cannot show images; here the episode fails rather
            # than go on without them.
            episode.finish(FinishReason.ERROR, f"the observation's images: {error}")
            return
        fits = self.images.complete_images(ids, episode.remaining)
        episode.add_observation(ids, self.engine.current_version, images, fits)

    def admitted(self, episode: Episode, shown: Sequence[bytes]) -> list[Image.Image] | None:
        """The observation's images, normalised; None: the episode ended on them — past
        ``max_images_per_sample`` (``length``, the image budget) or refused (``error``)."""
        try:
            return self.images.admit(shown, len(episode.images))
        except ImageInputError as error:
            log.warning(
                "episode.images_refused",
                episode=episode.start.episode_id,
                reason=error.reason,
                error=str(error),
            )
            if error.reason == "too_many_images":
                episode.ended_by = f"{error.reason}: {error}"
                episode.finish(FinishReason.LENGTH)
            else:
                episode.finish(FinishReason.ERROR, f"{error.reason}: {error}")
            return None

    async def outcome(
        self, episode: Episode, call: ParsedCall, index: int, allowed: int, limits: ToolLimits
    ) -> ToolOutcome | None:
        if index >= allowed:
            return ToolOutcome(
                f"{NOT_RUN_PREFIX}at most {allowed} tool calls per turn",
                ToolFailure.TOO_MANY_CALLS,
            )
        try:
            return await run_tool_call(episode.start.session, call, limits)
        except ToolServiceUnavailable as error:
            log.warning(
                "episode.tool_service_unavailable",
                episode=episode.start.episode_id,
                error=str(error),
            )
            episode.finish(FinishReason.ERROR, f"tool service unavailable: {error}")
            return None
