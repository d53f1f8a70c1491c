"""A scripted oracle: each record's reference answer, written the way its environment reads an
answer, for ``dockyard oracle`` to score through that environment's own scorer.

Where a tiny model cannot learn a task, a run scores 0 at every step and cannot tell a broken
reward path from a policy that is not there yet. Scoring the reference answers proves the path:
the same environment code, sandboxes and services a run's scorer uses, on answers that are
right. The references come from the data (the record's ground truth: the answer, the solution,
the patch; osworld's recorded actions); an environment listed here says how a response states
it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from dockyard.environments.base import SampleInput, ScoringGroup, ToolCallRecord


class NoReference(ValueError):
    """A record the oracle cannot answer: its environment is not listed, or the data holds no
    reference for it."""


def _answer(text: str) -> SampleInput:
    return SampleInput(response_text=text, finish_reason="stop")


def _boxed(group: ScoringGroup) -> SampleInput:
    return _answer(f"The answer is \\boxed{{{group.ground_truth}}}.")


def _fenced(language: str) -> Callable[[ScoringGroup], SampleInput]:
    def write(group: ScoringGroup) -> SampleInput:
        body = str(group.ground_truth).rstrip("\n")
        return _answer(f"```{language}\n{body}\n```")

    return write


def _as_is(group: ScoringGroup) -> SampleInput:
    return _answer(str(group.ground_truth))


def _desktop_actions(group: ScoringGroup) -> SampleInput:
    """The record's ``solution`` (its actions, ``DONE`` or ``FAIL`` last) as an episode's
    ``computer`` calls, which the osworld scorer replays on a fresh desktop."""
    try:
        solution = json.loads(str(group.extra.get("solution")))
    except ValueError:
        solution = None
    if not isinstance(solution, list) or not all(isinstance(a, str) for a in solution):
        raise NoReference(
            f"group {group.group_id}: osworld's reference is the record's 'solution': its "
            "actions as a JSON list of strings, in data.*.fields.metadata"
        )
    calls = [ToolCallRecord("computer", json.dumps({"action": a}), result="") for a in solution]
    return SampleInput(response_text="", finish_reason="stop", tool_calls=calls)


#: How each environment's answers state the reference.
REFERENCE_WRITERS: dict[str, Callable[[ScoringGroup], SampleInput]] = {
    "arithmetic": _as_is,
    "math": _boxed,
    "hle": _boxed,
    "gpqa": _boxed,
    "program_bench": _fenced("python"),
    "code": _fenced("python"),
    "terminal_bench": _fenced("bash"),
    "swe": _as_is,  # the reference patch is the response (a unified diff)
    "osworld": _desktop_actions,
}


def reference_sample(group: ScoringGroup) -> SampleInput:
    """The reference answer of ``group`` as one sample its environment scores."""
    writer = REFERENCE_WRITERS.get(group.env_name)
    if writer is None:
        raise NoReference(
            f"environment {group.env_name!r}: the oracle writes reference answers for "
            f"{', '.join(sorted(REFERENCE_WRITERS))}"
        )
    if group.ground_truth in (None, "") and writer is not _desktop_actions:
        raise NoReference(f"group {group.group_id}: no ground truth to answer with")
    return writer(group)
