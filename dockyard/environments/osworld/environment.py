"""``osworld``: computer-use tasks scored by their evaluator on the desktop's final state.

Each sample is replayed on a fresh desktop of the simulator service (``env.osworld.simulator_url``,
a STAND-IN for OSWorld's VMs) laid out by the task (metadata ``task``, :mod:`.tasks`): an episode's
``computer`` calls as its tool took them (the same rules, :mod:`.session`: calls the tool refused
are refused again, calls not run are left out), or a single-turn response's actions (its last
fenced block, else the whole response, before the first end-of-turn marker), both read in the
run's action space (``env.osworld.action_space``: pyautogui code, or computer_13's JSON actions,
:mod:`.computer13`). Then the task's
evaluator reads the final accessibility tree: ``check_accessibility_tree`` rewards 1 when every
rule holds; ``infeasible`` rewards 1 only for the answer FAIL, and an agent answering FAIL to a
feasible task scores 0 (OSWorld's convention). The reward is never the worker's word.

Malformed model output (no readable action, a hostile program) scores 0 flagged
``invalid_action`` with the reason; a task that cannot be read is refused (dead-lettered), and a
simulator that cannot be reached fails the scoring (redelivered), neither scored 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from dockyard.config.sections.env import OsworldActionSpace, OsworldEnvConfig
from dockyard.environments.arithmetic_env import answer_before_eos
from dockyard.environments.base import (
    Environment,
    GroupScore,
    InvalidScoringInput,
    SampleInput,
    SampleScore,
    ScoreFlag,
    ScoringGroup,
    ToolCallRecord,
)
from dockyard.environments.osworld.accessibility import TreeError, rule_failures
from dockyard.environments.osworld.actions import ActionParseError
from dockyard.environments.osworld.controller_client import SimulatorClient
from dockyard.environments.osworld.session import (
    COMPUTER_TOOL,
    ActionRefused,
    DesktopSession,
    Step,
    call_step,
    response_steps,
)
from dockyard.environments.osworld.tasks import DesktopTask, TaskError, parse_task
from dockyard.environments.registry import register_environment
from dockyard.environments.tools.toolbox import ToolArgumentError, ran_calls


def replayed_steps(action_space: OsworldActionSpace, calls: Sequence[ToolCallRecord]) -> list[Step]:
    """The steps of the episode's ``computer`` calls that ran and the tool read, in order: a
    call the tool refused to read left the desktop unchanged, so the replay leaves it out."""
    steps = []
    for _, arguments in ran_calls(calls, {COMPUTER_TOOL}):
        try:
            steps.append(call_step(action_space, arguments))
        except (ToolArgumentError, ActionParseError):
            continue
    return steps


@register_environment
class OsworldEnvironment(Environment):
    name = "osworld"
    settings: OsworldEnvConfig

    def __init__(self, settings: OsworldEnvConfig) -> None:
        super().__init__(settings)
        if settings.simulator_url is None:
            raise ValueError(
                "env.osworld.simulator_url: not set; the desktops are the simulator's "
                "(dockyard osworld serve)"
            )
        self.simulator = SimulatorClient(settings.simulator_url, settings.request_timeout_s)

    async def score(self, group: ScoringGroup) -> GroupScore:
        try:
            task = parse_task(group.extra.get("task"))
        except TaskError as error:
            raise InvalidScoringInput(error.reason, str(error)) from None
        scores = [await self.score_sample(sample, task) for sample in group.samples]
        return GroupScore(group.group_id, scores)

    async def score_sample(self, sample: SampleInput, task: DesktopTask) -> SampleScore:
        space = self.settings.action_space
        if sample.tool_calls is not None:
            steps = replayed_steps(space, sample.tool_calls)
        else:
            text, _ = answer_before_eos(sample.response_text, self.settings.eos_markers)
            try:
                steps = response_steps(space, text)
            except ActionParseError as error:
                return _zero(f"no valid action: {error}", ScoreFlag.INVALID_ACTION)
        desktop_id, controller = await self.simulator.open_desktop(task)
        try:
            session = DesktopSession(controller, self.settings)
            for step in steps:
                try:
                    await session.act(step)
                except ActionRefused as error:
                    if sample.tool_calls is None:
                        return _zero(f"no valid action: {error}", ScoreFlag.INVALID_ACTION)
                    continue  # the tool refused it too: the episode went on without it
            try:
                nodes = await session.tree()
            except TreeError as error:
                raise InvalidScoringInput("bad_accessibility_tree", str(error)) from None
        finally:
            await self.simulator.close_desktop(desktop_id)
        actions = {"actions": float(session.actions_taken)}
        if task.evaluator.func == "infeasible":
            if session.finished == "FAIL":
                return SampleScore(1.0, {"solved": 1.0, **actions}, frozenset(), "infeasible: FAIL")
            return _zero("the task is infeasible: only FAIL solves it", **actions)
        if session.finished == "FAIL":
            return _zero("the agent answered FAIL to a feasible task", **actions)
        failures = rule_failures(nodes, task.evaluator.expected.rules)
        if failures:
            return _zero("; ".join(failures), **actions)
        return SampleScore(1.0, {"solved": 1.0, **actions}, frozenset(), "every rule holds")

    async def aclose(self) -> None:
        await self.simulator.aclose()


def _zero(detail: str, *flags: ScoreFlag, **components: float) -> SampleScore:
    return SampleScore(0.0, {"solved": 0.0, **components}, frozenset(flags), detail)
