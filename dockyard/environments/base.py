"""The environment interface: what a scorer hands an environment and what it gets back.

Environments are transport-free: the scorer adapts broker messages to a :class:`ScoringGroup`,
awaits :meth:`Environment.score`, and adapts the :class:`GroupScore` back. ``score`` is a
coroutine; environments whose work is blocking (sympy, subprocesses, torch) run it in a worker
thread with :func:`asyncio.to_thread` so one scorer instance can keep ``max_concurrency`` groups
in flight on one event loop.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, TypeAlias

import numpy as np

from dockyard.config.sections.distillation import OnPolicyDistillationConfig
from dockyard.config.sections.env import EnvConfig, EnvSettings

# Datasets differ in what they carry as ground truth, so extra data stays JSON-shaped.
JSONValue: TypeAlias = (
    str | int | float | bool | Sequence["JSONValue"] | Mapping[str, "JSONValue"] | None
)


class ScoreFlag(enum.StrEnum):
    """Why a sample's reward is what it is, beyond the number. Travels as its string value."""

    TIMEOUT = "timeout"  # the whole scoring task ran past env.<name>.task_timeout
    INVALID_ACTION = "invalid_action"  # no answer / no code / no patch could be extracted
    INTEGRITY_VIOLATION = "integrity_violation"  # the response touched tests or the runner
    TRUNCATED = "truncated"  # generation stopped on the length limit, not on EOS
    TEST_TIMEOUT = "test_timeout"  # a sandboxed run hit its wall or CPU limit
    OUTPUT_LIMIT = "output_limit"  # a sandboxed run printed more than max_output_bytes
    PATCH_FAILED = "patch_failed"  # the diff did not apply to the snapshot
    CHECK_TIMEOUT = "check_timeout"  # an answer check ran past env.<name>.check_timeout_s
    CHECK_CRASHED = "check_crashed"  # the worker process checking an answer died
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"  # no sandbox URL answered
    INVALID_TOOL_CALL = "invalid_tool_call"  # a turn holds a tool call that cannot be read
    MALFORMED_THINKING = "malformed_thinking"  # a turn's <think> block is broken
    # the response has a reward-hack shape (reward_hack_screen.py): scored 0, its group
    # dead-lettered as suspected_reward_hack with the evidence (the detail)
    SUSPECTED_REWARD_HACK = "suspected_reward_hack"


class InvalidScoringInput(ValueError):
    """The group itself is unusable (missing ground truth, unknown agent under strict matching).

    Retrying cannot help, so a scorer should dead-letter the rollout with ``reason_code`` rather
    than nak it for redelivery.
    """

    def __init__(self, reason_code: str, message: str) -> None:
        super().__init__(f"{reason_code}: {message}")
        self.reason_code = reason_code


@dataclass(frozen=True)
class SampleInput:
    """One generated sample of a group."""

    response_text: str
    # Token ids are only needed by environments that look at tokens (the teacher).
    response_token_ids: np.ndarray | None = None
    # "stop" (EOS or a stop string) or "length"; None when the producer did not say.
    finish_reason: str | None = None
    # Overrides the group's agent name for multi-agent rollouts.
    agent_name: str | None = None
    # The tool calls of a multi-turn episode, in order; None: not an episode (single turn).
    tool_calls: Sequence[ToolCallRecord] | None = None
    # An episode's last model turn (its answer); None: not an episode.
    final_turn_text: str | None = None

    @property
    def answer_text(self) -> str:
        """What an answer-judging environment reads: an episode's last model turn, never the
        calls and observations before it (a tool's output is not the model's answer)."""
        return self.response_text if self.final_turn_text is None else self.final_turn_text


class TurnSpan(Protocol):
    """A span of an episode's tokens (the wire's ``Segment``, the episode loop's own)."""

    @property
    def role(self) -> str: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...


def final_turn(segments: Sequence[TurnSpan]) -> slice | None:
    """The tokens of an episode's last model turn; None without one."""
    for segment in reversed(segments):
        if segment.role == "assistant":
            return slice(segment.start, segment.end)
    return None


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call of an episode as the rollout recorded it (the wire's ``ToolCall``)."""

    name: str
    arguments_json: str
    #: The observation the model read; None for a call recorded but not run (the turn limit).
    result: str | None
    #: Why ``result`` is an error (the wire's ``ToolCall.error``); None: the tool answered.
    error: str | None = None


@dataclass(frozen=True)
class ScoringGroup:
    """One prompt and its G samples, as an environment sees them."""

    group_id: str
    env_name: str
    prompt_text: str
    samples: Sequence[SampleInput]
    agent_name: str | None = None
    ground_truth: JSONValue = None
    extra: Mapping[str, JSONValue] = field(default_factory=dict)
    prompt_token_ids: np.ndarray | None = None

    def agent_of(self, index: int) -> str | None:
        return self.samples[index].agent_name or self.agent_name


@dataclass(frozen=True)
class SampleScore:
    reward: float
    components: Mapping[str, float] = field(default_factory=dict)
    flags: frozenset[ScoreFlag] = frozenset()
    detail: str = ""
    # Attached by the teacher environment only: log pi_teacher(token) per response token.
    teacher_logprobs: np.ndarray | None = None


@dataclass(frozen=True)
class GroupScore:
    group_id: str
    samples: Sequence[SampleScore]

    @property
    def rewards(self) -> list[float]:
        return [sample.reward for sample in self.samples]

    @classmethod
    def uniform(
        cls, group: ScoringGroup, reward: float, flags: frozenset[ScoreFlag], detail: str
    ) -> GroupScore:
        """The same score for every sample (a timed-out or refused group)."""
        score = SampleScore(reward=reward, flags=flags, detail=detail)
        return cls(group_id=group.group_id, samples=[score] * len(group.samples))


@dataclass(frozen=True)
class EnvironmentContext:
    """What an environment may be built from: the typed config, nothing else."""

    env: EnvConfig = field(default_factory=EnvConfig)
    distillation: OnPolicyDistillationConfig = field(default_factory=OnPolicyDistillationConfig)


class Environment(abc.ABC):
    """A reward environment. Subclasses set ``name`` and register with ``@register_environment``."""

    name: ClassVar[str]

    def __init__(self, settings: EnvSettings) -> None:
        self.settings = settings

    @classmethod
    def from_context(cls, context: EnvironmentContext) -> Environment:
        """Build from the config; the default reads ``env.<name>``."""
        return cls(getattr(context.env, cls.name))

    @abc.abstractmethod
    async def score(self, group: ScoringGroup) -> GroupScore:
        """Score every sample of ``group``. Raise :class:`InvalidScoringInput` for bad input."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most environments hold nothing
        """Release held resources (HTTP clients, models)."""
