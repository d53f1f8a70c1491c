"""Toolboxes, the per-episode tool sessions they open, and running one call safely.

A :class:`Toolbox` is named like the environment whose prompts use it (``PromptGroup.environment``)
and opens one :class:`ToolSession` per episode: the episode's sandbox, where its tool side effects
live, so a redelivered prompt group replays its episodes from scratch against fresh sessions.

:func:`run_tool_call` is the boundary between the episode and a tool: whatever the tool does, the
episode gets back an observation in bounded time — the tool's output, or an error text with a
typed :class:`ToolFailure` — except when the tool service itself is gone
(:class:`ToolServiceUnavailable`), which fails the episode
(``grpo.async_grpo.max_generation_failures`` decides what that does to its group).
"""

from __future__ import annotations

import abc
import asyncio
import enum
import importlib
import json
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, TypeVar

from dockyard.config.sections.env import EnvConfig
from dockyard.environments.tools.calls import ParsedCall
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


class ToolFailure(enum.StrEnum):
    """Why a call's observation is an error, not the tool's answer."""

    MALFORMED_CALL = "malformed_call"  # the call could not be read (see calls.py)
    TOO_MANY_CALLS = "too_many_calls"  # past grpo.structured_tool_use.max_tool_calls_per_turn
    UNKNOWN_TOOL = "unknown_tool"
    BAD_ARGUMENTS = "bad_arguments"  # the tool refused its arguments (ToolArgumentError)
    TIMEOUT = "timeout"
    RAISED = "raised"  # the tool failed with any other exception
    OUTPUT_TOO_LARGE = "output_too_large"  # kept up to ToolLimits.max_output_bytes, marked cut
    INVALID_UTF8 = "invalid_utf8"


class ToolArgumentError(ValueError):
    """Raised by a tool for arguments it cannot use; the message is shown to the model."""


class ToolServiceUnavailable(RuntimeError):
    """The tool service cannot be reached: the episode cannot go on (not the model's fault)."""


class TaskRefused(ValueError):
    """The group's task cannot be set up (its setup script fails, a field is missing): the
    task's fault, so the group is dead-lettered with ``reason``, not replayed."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


#: The start of the observation of a call that was parsed but not run (past
#: ``max_tool_calls_per_turn``): a scorer that replays an episode's calls skips these.
NOT_RUN_PREFIX = "error: not run: "


class CallRecord(Protocol):
    """A recorded call as scorers see it (``environments.base.ToolCallRecord``)."""

    @property
    def name(self) -> str: ...

    @property
    def arguments_json(self) -> str: ...

    @property
    def result(self) -> str | None: ...


@dataclass(frozen=True)
class ToolLimits:
    #: A call that takes longer is abandoned; the model reads that it timed out.
    timeout_s: float = 30.0
    #: Output beyond this is cut (at a character boundary) and marked: a context is not a log.
    max_output_bytes: int = 16 * 1024


@dataclass(frozen=True)
class ToolOutput:
    """A tool's answer that shows images too (a desktop's screenshot): its text, and the encoded
    image files in the order the model is shown them. The episode gates, bounds and normalises
    the images as it does a prompt's (:mod:`dockyard.producers.multimodal`)."""

    text: str
    images: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class ToolOutcome:
    """What the model reads back for one call, and the failure it stands for (None: answered)."""

    text: str
    failure: ToolFailure | None = None
    #: Encoded image files shown after the text (a screenshot); none for an error.
    images: tuple[bytes, ...] = ()


class ToolSession(abc.ABC):
    """One episode's tools. Outputs are text or bytes (checked as UTF-8 by run_tool_call), or a
    :class:`ToolOutput` when the answer shows images."""

    @property
    @abc.abstractmethod
    def tool_names(self) -> frozenset[str]: ...

    @abc.abstractmethod
    async def call(self, name: str, arguments: Mapping[str, Any]) -> str | bytes | ToolOutput: ...

    async def initial_images(self) -> tuple[bytes, ...]:
        """What the episode is shown with its prompt, after the task's setup (OSWorld's first
        screenshot): encoded image files, filling the prompt's image placeholders. None by
        default."""
        return ()

    async def aclose(self) -> None:  # noqa: B027 - optional: most sessions hold nothing
        """Discard the episode's sandbox."""


NO_TASK: Mapping[str, Any] = MappingProxyType({})


class Toolbox(abc.ABC):
    """Opens sessions; subclasses set ``name`` and register with ``@register_toolbox``."""

    name: ClassVar[str]

    @classmethod
    def from_env_config(cls, env: EnvConfig) -> Toolbox:
        """Built from the run's ``env`` section; the default needs none of it."""
        return cls()

    @abc.abstractmethod
    async def open_session(self, episode_id: str, task: Mapping[str, Any] = NO_TASK) -> ToolSession:
        """The episode's session; ``task`` is its group's ``extra`` (a setup script, say).
        Raises :class:`TaskRefused` for a task that cannot be set up."""

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        """The tools a session offers, as chat templates take them (OpenAI function schemas,
        ``tokenizer.apply_chat_template(tools=...)``): what the prompt tells the model. A
        class method: prompts are rendered where no toolbox is built (the dispatcher). None
        by default (a toolbox whose prompts describe their tools themselves)."""
        return []

    async def aclose(self) -> None:  # noqa: B027 - optional: most toolboxes hold nothing
        """Release held resources (connections)."""


_REGISTRY: dict[str, type[Toolbox]] = {}
# Toolboxes are found by the environment a group is scored by; the arithmetic environment's
# tool is the calculator (configs/multiturn_tools.yaml), so both names open the same toolbox.
_BUILTIN_MODULES = {
    "calculator": "dockyard.environments.tools.calculator",
    "arithmetic": "dockyard.environments.tools.calculator",
    "terminal_bench": "dockyard.environments.tools.terminal",
    "osworld": "dockyard.environments.tools.desktop",
    "gdpval": "dockyard.environments.tools.gdpval",
    "swe": "dockyard.environments.tools.swe",
}
_ToolboxClass = TypeVar("_ToolboxClass", bound=type[Toolbox])


class UnknownToolboxError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def register_toolbox(cls: _ToolboxClass) -> _ToolboxClass:
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"toolbox {cls.name!r} is already registered by {existing.__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def available_toolboxes() -> list[str]:
    return sorted(set(_REGISTRY) | set(_BUILTIN_MODULES))


def toolbox_class(name: str) -> type[Toolbox]:
    if name not in _REGISTRY and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(available_toolboxes())
        raise UnknownToolboxError(f"no toolbox for environment {name!r} (known: {known})") from None


def ran_calls(
    calls: Iterable[CallRecord], names: Collection[str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, arguments)`` of the recorded calls of the tools ``names`` that ran, in order —
    what a scorer replays. Left out as the episode left them: calls of another name, calls
    recorded but not run (the turn limit; past the calls allowed per turn), arguments that are
    not a JSON object. The replay then refuses, by the tool's own rule, what the tool
    refused."""
    for call in calls:
        if call.name not in names or call.result is None:
            continue
        if call.result.startswith(NOT_RUN_PREFIX):
            continue
        try:
            arguments = json.loads(call.arguments_json)
        except ValueError:
            continue
        if isinstance(arguments, dict):
            yield call.name, arguments


def described_tools(
    describe: bool, environments: Iterable[str]
) -> dict[str, tuple[Mapping[str, Any], ...]]:
    """The tools each environment's prompts describe (``grpo.structured_tool_use
    .describe_tools``): its toolbox's schemas, or none when ``describe`` is off. Every
    environment is one whose episodes call tools. UnknownToolboxError: an environment whose
    toolbox is not in this build (served elsewhere) cannot have its tools described."""
    return {
        environment: tuple(toolbox_class(environment).tool_schemas()) if describe else ()
        for environment in sorted(set(environments))
    }


def _cut_utf8(data: bytes, limit: int) -> bytes:
    """At most ``limit`` bytes, not ending inside a UTF-8 sequence (a cut is not an error)."""
    cut = data[:limit]
    # Continuation bytes are 10xxxxxx: step back to the start of the last sequence if it is cut.
    for back in range(1, min(4, len(cut)) + 1):
        byte = cut[-back]
        if byte & 0xC0 != 0x80:
            width = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return cut if width <= back else cut[:-back]
    return cut


async def run_tool_call(session: ToolSession, call: ParsedCall, limits: ToolLimits) -> ToolOutcome:
    """The observation for ``call``; raises only :class:`ToolServiceUnavailable`."""
    if call.name not in session.tool_names:
        known = ", ".join(sorted(session.tool_names)) or "none"
        return ToolOutcome(
            f"error: unknown tool {call.name!r} (tools: {known})", ToolFailure.UNKNOWN_TOOL
        )
    try:
        async with asyncio.timeout(limits.timeout_s):
            output = await session.call(call.name, call.arguments)
    except TimeoutError:
        return ToolOutcome(
            f"error: {call.name} timed out after {limits.timeout_s:g}s", ToolFailure.TIMEOUT
        )
    except ToolServiceUnavailable:
        raise
    except ToolArgumentError as error:
        return ToolOutcome(f"error: {call.name}: {error}", ToolFailure.BAD_ARGUMENTS)
    except Exception as error:  # a tool's bug is the episode's observation, not a crash
        log.warning("tool.raised", tool=call.name, error=repr(error))
        return ToolOutcome(
            f"error: {call.name} failed: {type(error).__name__}: {error}", ToolFailure.RAISED
        )
    images = output.images if isinstance(output, ToolOutput) else ()
    answer = output.text if isinstance(output, ToolOutput) else output
    data = answer.encode("utf-8", errors="surrogatepass") if isinstance(answer, str) else answer
    failure = None
    if len(data) > limits.max_output_bytes:
        data, failure = _cut_utf8(data, limits.max_output_bytes), ToolFailure.OUTPUT_TOO_LARGE
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        return ToolOutcome(
            f"error: {call.name} returned bytes that are not UTF-8 (at byte {error.start})",
            ToolFailure.INVALID_UTF8,
        )
    if failure is ToolFailure.OUTPUT_TOO_LARGE:
        text += f"\n[output cut at {limits.max_output_bytes} bytes]"
    return ToolOutcome(text, failure, images)
