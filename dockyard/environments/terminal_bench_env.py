"""``terminal_bench`` (single turn): the response is a command script run in a sandboxed work
directory; the task's check script decides the reward.

A task (``data.*.fields.metadata``) carries ``check`` (a shell script: exit status 0 = solved)
and optionally ``setup`` (a shell script preparing the work directory). Each sample gets its own
sandbox session (fresh tmpfs work directory and, as root, uid): ``setup`` runs first and must
succeed (a failing setup is the task's fault: the group is refused, not scored 0), then the
response's commands, then ``check``. The command script is the last ```` ```bash ```` /
``sh`` / ``shell`` fenced block of the response, else the whole response (up to its first
end-of-turn marker). Reward 1 when ``check`` exits 0, else 0 with the check's last output line.

The scripts of the task are written only when they run and under names the response cannot
predict, and each run is killed whole before the next starts (bubblewrap + cgroup), so the
commands can neither replace the check nor leave a process to interfere with it.

Multi-turn (``grpo.structured_tool_use``): the agent runs commands with the ``bash`` tool of
:mod:`dockyard.environments.tools.terminal` and reads their output between turns. A sample that
is an episode (its tool calls recorded) is scored by replaying, in a fresh session, setup, the
commands the tool ran in order (:func:`replayed_commands`), then ``check``: the reward is the
check's on the final state, never the worker's word.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dockyard.config.sections.env import TerminalBenchEnvConfig
from dockyard.environments.arithmetic_env import answer_before_eos
from dockyard.environments.base import (
    Environment,
    GroupScore,
    InvalidScoringInput,
    SampleScore,
    ScoreFlag,
    ScoringGroup,
    ToolCallRecord,
)
from dockyard.environments.code_env import score_samples_in_thread
from dockyard.environments.registry import register_environment
from dockyard.environments.sandbox import Sandbox, SandboxResult, SandboxSession
from dockyard.environments.tools.toolbox import ToolArgumentError, ran_calls

#: The multi-turn tool's name, and what runs ahead of each of its commands: stderr into stdout,
#: so the model reads them interleaved as on a terminal (the replay runs the same script).
BASH_TOOL = "bash"
MERGE_STDERR = "exec 2>&1\n"

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_SHELL_TAGS = {"bash", "sh", "shell", "console", "zsh"}


@dataclass(frozen=True)
class TerminalTask:
    setup: str
    check: str


def extract_commands(response: str) -> str | None:
    """The last shell-fenced block (else the last fenced block), or the unfenced response."""
    blocks = _FENCE.findall(response)
    shell_blocks = [body for tag, body in blocks if tag.lower() in _SHELL_TAGS]
    chosen = shell_blocks or [body for _, body in blocks]
    text = chosen[-1] if chosen else response
    return text if text.strip() else None


def parse_task(group: ScoringGroup) -> TerminalTask:
    check = group.extra.get("check")
    if not isinstance(check, str) or not check.strip():
        raise InvalidScoringInput(
            "missing_check_script", f"group {group.group_id} has no 'check' script"
        )
    setup = group.extra.get("setup", "")
    if not isinstance(setup, str):
        raise InvalidScoringInput("bad_setup_script", "'setup' must be a shell script (a string)")
    return TerminalTask(setup=setup, check=check)


def run_script(
    session: SandboxSession,
    shell: str,
    script: str,
    deadline: float | None,
    cancel: threading.Event | None,
) -> SandboxResult:
    """Run ``script`` with ``shell`` in ``session``'s work directory.

    The script gets a fresh name and is removed after its run: a command script cannot plant a
    file (or a directory) where the task's next script will be written, nor read it ahead."""
    path = session.write_file(f".task-{secrets.token_hex(8)}.sh", script.encode())
    try:
        return session.run([shell, path.name], deadline=deadline, cancel=cancel)
    finally:
        path.unlink(missing_ok=True)


def command_script(
    response: str, settings: TerminalBenchEnvConfig, where: str
) -> str | SampleScore:
    """The response's command script, or the zero score saying why there is none usable."""
    text, _ = answer_before_eos(response, settings.eos_markers)
    commands = extract_commands(text)
    invalid = frozenset({ScoreFlag.INVALID_ACTION})
    if commands is None:
        return SampleScore(0.0, {}, invalid, "no commands in the response")
    if len(commands) > settings.max_script_chars:
        return SampleScore(
            0.0,
            {},
            invalid,
            f"command script of {len(commands)} characters is over "
            f"{where}.max_script_chars={settings.max_script_chars}",
        )
    return commands


def command_of(arguments: Mapping[str, Any], settings: TerminalBenchEnvConfig) -> str:
    """A ``bash`` call's command; ToolArgumentError (the model reads why) for anything else.
    The replay uses this same rule, so it runs exactly the calls the tool ran."""
    command = arguments.get("command")
    if set(arguments) != {"command"} or not isinstance(command, str) or not command.strip():
        raise ToolArgumentError('needs exactly {"command": "<shell command>"}')
    if len(command) > settings.max_script_chars:
        raise ToolArgumentError(
            f"command of {len(command)} characters is over {settings.max_script_chars}"
        )
    return command


def replayed_commands(
    calls: Sequence[ToolCallRecord], settings: TerminalBenchEnvConfig
) -> list[str]:
    """The scripts the episode's ``bash`` tool ran, in order. Left out as the tool left them:
    calls of another name, with arguments it refused, and calls not run (the turn limit, past
    the calls allowed per turn)."""
    scripts = []
    for _, arguments in ran_calls(calls, {BASH_TOOL}):
        try:
            scripts.append(MERGE_STDERR + command_of(arguments, settings))
        except ToolArgumentError:
            continue
    return scripts


def run_setup(
    session: SandboxSession,
    shell: str,
    setup: str,
    deadline: float | None,
    cancel: threading.Event | None,
) -> None:
    """Run a task's setup script; its failure is the task's fault, so the group is refused."""
    if not setup.strip():
        return
    result = run_script(session, shell, setup, deadline, cancel)
    if not result.ok:
        raise InvalidScoringInput(
            "setup_failed",
            f"the task's setup script failed (exit {result.returncode}): {_last_line(result)}",
        )


def _last_line(result: SandboxResult) -> str:
    text = (result.stdout + result.stderr).decode(errors="replace").strip().splitlines()
    return text[-1][:160] if text else ""


def _zero(detail: str, *flags: ScoreFlag, **components: float) -> SampleScore:
    return SampleScore(0.0, {"solved": 0.0, **components}, frozenset(flags), detail)


@register_environment
class TerminalBenchEnvironment(Environment):
    name = "terminal_bench"
    settings: TerminalBenchEnvConfig

    def __init__(self, settings: TerminalBenchEnvConfig) -> None:
        super().__init__(settings)
        self.sandbox = Sandbox(settings.limits)

    async def score(self, group: ScoringGroup) -> GroupScore:
        task = parse_task(group)
        if any(sample.tool_calls is not None for sample in group.samples):
            # Episodes: the work runs once per sample, in order, in one thread; it takes each
            # sample's replay from this iterator (it is handed the response text only).
            replays = iter(
                replayed_commands(sample.tool_calls or (), self.settings)
                for sample in group.samples
            )
            return await score_samples_in_thread(
                group,
                self.settings.task_timeout,
                lambda _, deadline, cancel: self.score_episode(
                    next(replays), task, deadline, cancel
                ),
            )
        return await score_samples_in_thread(
            group,
            self.settings.task_timeout,
            lambda text, deadline, cancel: self.score_commands(text, task, deadline, cancel),
        )

    def score_episode(
        self,
        scripts: Sequence[str],
        task: TerminalTask,
        deadline: float | None = None,
        cancel: threading.Event | None = None,
    ) -> SampleScore:
        """Setup, the episode's commands as its tool ran them (a command that was killed or
        failed did so in the episode too: the agent went on), then the check."""
        commands = {"commands": float(len(scripts))}
        with self.sandbox.session() as session:
            run_setup(session, self.settings.shell, task.setup, deadline, cancel)
            for script in scripts:
                run_script(session, self.settings.shell, script, deadline, cancel)
            check = run_script(session, self.settings.shell, task.check, deadline, cancel)
        if check.timed_out:
            return _zero("the check script timed out", ScoreFlag.TEST_TIMEOUT, **commands)
        if check.returncode != 0:
            return _zero(f"check failed (exit {check.returncode}): {_last_line(check)}", **commands)
        return SampleScore(1.0, {"solved": 1.0, **commands}, frozenset(), "check passed")

    def score_commands(
        self,
        response: str,
        task: TerminalTask,
        deadline: float | None = None,
        cancel: threading.Event | None = None,
    ) -> SampleScore:
        commands = command_script(response, self.settings, "env.terminal_bench")
        if isinstance(commands, SampleScore):
            return commands
        with self.sandbox.session() as session:
            run_setup(session, self.settings.shell, task.setup, deadline, cancel)
            ran = run_script(session, self.settings.shell, commands, deadline, cancel)
            exit_component = {"commands_exit": float(ran.returncode)}
            if ran.timed_out:
                return _zero("the commands timed out", ScoreFlag.TEST_TIMEOUT, **exit_component)
            if ran.output_limit_exceeded:
                return _zero("the commands printed past the limit", ScoreFlag.OUTPUT_LIMIT)
            check = run_script(session, self.settings.shell, task.check, deadline, cancel)
        if check.timed_out:
            return _zero("the check script timed out", ScoreFlag.TEST_TIMEOUT, **exit_component)
        if check.returncode != 0:
            return _zero(
                f"check failed (exit {check.returncode}): {_last_line(check)}", **exit_component
            )
        return SampleScore(1.0, {"solved": 1.0, **exit_component}, frozenset(), "check passed")
