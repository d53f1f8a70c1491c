"""File tools in a sandbox session: run a command, read / write / edit / list files.

One implementation for every toolbox that works on files in a sandboxed directory — the
``gdpval`` toolbox (the episode's work directory) and the SWE toolbox (the repository checkout
of a session of ``dockyard sandbox serve``) pick the tools they offer from :data:`FILE_TOOLS`.

Every file operation runs *inside* the sandbox (a short Python program under the session's uid,
namespaces and limits), never in the calling process: the sandboxed commands can plant symbolic
links anywhere in their directory, and a host-side ``open`` would follow them to any file the
worker or the service may read or write. Paths are relative to the tool's root (the work
directory, the checkout); an absolute path or a ``..`` component is refused as a bad argument.

The same validation runs when a scorer replays an episode's calls (:func:`apply_call`), so the
replay runs exactly the calls the tool ran and refuses exactly the ones it refused.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.sandbox import SandboxResult, SandboxSession
from dockyard.environments.tools.toolbox import ToolArgumentError, ran_calls

BASH = "bash"
READ_FILE = "read_file"
WRITE_FILE = "write_file"
EDIT_FILE = "edit_file"
LIST_FILES = "list_files"

#: Tools that change the directory: a scorer replays these (and only these) in a fresh session.
MUTATING = frozenset({BASH, WRITE_FILE, EDIT_FILE})
#: At most this much of a file is shown by ``read_file`` (the call's output cap applies too).
MAX_READ_CHARS = 12_000
#: At most this many entries are listed by ``list_files``.
MAX_LISTED = 200

# Runs in the sandbox: argv = [op, path, payload-json]; stdin = the content to write. Exit 2 with
# a one-line reason is a refusal the model reads; anything else is printed as the tool's output.
_FILE_OPS = r"""
import json, os, sys
op, path, payload = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def refuse(text):
    sys.stdout.write(text)
    sys.exit(2)
try:
    if op == "read_file":
        with open(path, "rb") as f:
            data = f.read(payload["max_bytes"] + 1)
        if b"\0" in data:
            refuse(f"{path} is a binary file")
        text = data.decode("utf-8", errors="backslashreplace")
        lines = text.splitlines()
        first = payload["start_line"]
        last = payload["end_line"] or len(lines)
        shown = lines[first - 1:last]
        width = len(str(last))
        for number, line in enumerate(shown, first):
            sys.stdout.write(f"{number:>{width}}  {line}\n")
        if len(data) > payload["max_bytes"]:
            sys.stdout.write(f"[file cut at {payload['max_bytes']} bytes]\n")
    elif op == "write_file":
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        data = sys.stdin.buffer.read()
        with open(path, "wb") as f:
            f.write(data)
        sys.stdout.write(f"wrote {len(data)} bytes to {path}\n")
    elif op == "edit_file":
        with open(path, encoding="utf-8") as f:
            text = f.read()
        old, new = payload["old"], payload["new"]
        count = text.count(old)
        if count != 1:
            refuse(f"old text occurs {count} times in {path}: it must occur exactly once")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(old, new, 1))
        sys.stdout.write(f"edited {path}\n")
    elif op == "list_files":
        names = sorted(os.listdir(path))
        for name in names[:payload["max_entries"]]:
            full = os.path.join(path, name)
            kind = "/" if os.path.isdir(full) and not os.path.islink(full) else ""
            sys.stdout.write(name + kind + "\n")
        if len(names) > payload["max_entries"]:
            sys.stdout.write(f"[{len(names) - payload['max_entries']} more entries]\n")
    else:
        refuse(f"no operation {op}")
except (OSError, UnicodeDecodeError) as error:
    refuse(f"{path}: {getattr(error, 'strerror', None) or error}")
"""


@dataclass(frozen=True)
class FileTool:
    name: str
    description: str
    #: JSON Schema of the arguments (the OpenAI / chat-template ``parameters``).
    parameters: Mapping[str, Any]

    def schema(self) -> dict[str, Any]:
        """The tool as chat templates take it (``tokenizer.apply_chat_template(tools=...)``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


def _object(required: Sequence[str], **properties: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: dict(spec) for name, spec in properties.items()},
        "required": list(required),
        "additionalProperties": False,
    }


_PATH = {"type": "string", "description": "a path relative to the working directory"}

FILE_TOOLS: Mapping[str, FileTool] = {
    tool.name: tool
    for tool in (
        FileTool(
            BASH,
            "Run a shell command in the working directory; stdout and stderr are returned with "
            "the exit status. Each call is a fresh shell: files persist, variables do not.",
            _object(["command"], command={"type": "string"}),
        ),
        FileTool(
            READ_FILE,
            "Show a text file with line numbers, optionally only lines start_line..end_line.",
            _object(
                ["path"],
                path=_PATH,
                start_line={"type": "integer", "minimum": 1},
                end_line={"type": "integer", "minimum": 1},
            ),
        ),
        FileTool(
            WRITE_FILE,
            "Create or replace a file with the given content (parent directories are created).",
            _object(["path", "content"], path=_PATH, content={"type": "string"}),
        ),
        FileTool(
            EDIT_FILE,
            "Replace the one occurrence of old_text in a file with new_text.",
            _object(
                ["path", "old_text", "new_text"],
                path=_PATH,
                old_text={"type": "string", "minLength": 1},
                new_text={"type": "string"},
            ),
        ),
        FileTool(
            LIST_FILES,
            "List a directory (default: the working directory); directories end with '/'.",
            _object([], path=_PATH),
        ),
    )
}


@dataclass(frozen=True)
class FileToolSettings:
    shell: str
    #: A longer command or written content is refused (bounds the sandbox's input).
    max_input_chars: int


def _keys(
    arguments: Mapping[str, Any], required: set[str], optional: frozenset[str] = frozenset()
) -> None:
    keys = set(arguments)
    if not required <= keys or not keys <= required | optional:
        wanted = ", ".join([*sorted(required), *(f"{key}?" for key in sorted(optional))])
        raise ToolArgumentError(f"takes exactly the arguments {{{wanted}}}, got {sorted(keys)}")


def _text(arguments: Mapping[str, Any], key: str, limit: int, *, empty: bool = False) -> str:
    value = arguments.get(key)
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise ToolArgumentError(f"{key!r} must be a non-empty string")
    if len(value) > limit:
        raise ToolArgumentError(f"{key!r} of {len(value)} characters is over {limit}")
    return value


def _path(arguments: Mapping[str, Any], default: str | None = None) -> str:
    value = arguments.get("path", default)
    if not isinstance(value, str) or not value.strip():
        raise ToolArgumentError("'path' must be a non-empty string")
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or "\0" in value:
        raise ToolArgumentError(f"path {value!r} must be relative, without '..'")
    return str(path)


def _line(arguments: Mapping[str, Any], key: str) -> int | None:
    value = arguments.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ToolArgumentError(f"{key!r} must be a line number (an integer from 1)")
    return value


@dataclass(frozen=True)
class PreparedCall:
    """A validated call: what runs in the sandbox."""

    argv_tail: tuple[str, ...]  # after the interpreter: the shell script or the file operation
    stdin: bytes
    is_shell: bool


def prepare(name: str, arguments: Mapping[str, Any], settings: FileToolSettings) -> PreparedCall:
    """Validate ``arguments`` for tool ``name``; :class:`ToolArgumentError` says why not."""
    limit = settings.max_input_chars
    if name == BASH:
        _keys(arguments, {"command"})
        # stderr into stdout, so the model reads them interleaved as on a terminal.
        script = "exec 2>&1\n" + _text(arguments, "command", limit)
        return PreparedCall(("-c", script), b"", True)
    if name == READ_FILE:
        _keys(arguments, {"path"}, frozenset({"start_line", "end_line"}))
        start, end = _line(arguments, "start_line") or 1, _line(arguments, "end_line")
        if end is not None and end < start:
            raise ToolArgumentError("'end_line' is before 'start_line'")
        payload = {"start_line": start, "end_line": end, "max_bytes": MAX_READ_CHARS}
        return PreparedCall((READ_FILE, _path(arguments), json.dumps(payload)), b"", False)
    if name == WRITE_FILE:
        _keys(arguments, {"path", "content"})
        content = _text(arguments, "content", limit, empty=True).encode()
        return PreparedCall((WRITE_FILE, _path(arguments), "{}"), content, False)
    if name == EDIT_FILE:
        _keys(arguments, {"path", "old_text", "new_text"})
        old = _text(arguments, "old_text", limit, empty=True)
        if not old:
            raise ToolArgumentError("'old_text' must not be empty")
        edit = {"old": old, "new": _text(arguments, "new_text", limit, empty=True)}
        return PreparedCall((EDIT_FILE, _path(arguments), json.dumps(edit)), b"", False)
    if name == LIST_FILES:
        _keys(arguments, set(), frozenset({"path"}))
        payload = {"max_entries": MAX_LISTED}
        return PreparedCall((LIST_FILES, _path(arguments, "."), json.dumps(payload)), b"", False)
    raise ToolArgumentError(f"no file tool {name!r}")


def run_prepared(
    session: SandboxSession,
    call: PreparedCall,
    settings: FileToolSettings,
    cwd: Path | None = None,
    deadline: float | None = None,
    cancel: threading.Event | None = None,
) -> SandboxResult:
    """Run a prepared call in ``session`` (in ``cwd``, default its work directory)."""
    program = settings.shell if call.is_shell else session.sandbox.python
    prefix = () if call.is_shell else ("-I", "-c", _FILE_OPS)
    return session.run(
        [program, *prefix, *call.argv_tail],
        stdin=call.stdin,
        cwd=cwd,
        deadline=deadline,
        cancel=cancel,
    )


def render_shell(result: SandboxResult, limits: SandboxLimits) -> str:
    """What the model reads of a command: the output as a terminal shows it (bytes that are not
    UTF-8 escaped, not refused: a binary file's ``cat`` is the command's doing), then how it
    ended."""
    text = result.stdout.decode("utf-8", errors="backslashreplace")
    if text and not text.endswith("\n"):
        text += "\n"
    if result.output_limit_exceeded:
        return text + f"[output over {limits.max_output_bytes} bytes: cut, killed]"
    if result.timed_out:
        return text + f"[killed: over the {limits.wall_time_s:g}s limit]"
    return text + f"[exit {result.returncode}]"


def render(call: PreparedCall, result: SandboxResult, limits: SandboxLimits) -> str:
    """What the model reads of a call: a command as :func:`render_shell`; a file operation's
    output, or its refusal's reason alone."""
    if call.is_shell or result.output_limit_exceeded or result.timed_out:
        return render_shell(result, limits)
    text = result.stdout.decode("utf-8", errors="backslashreplace")
    return text if result.returncode == 0 else f"error: {text.strip()}"


def apply_call(
    session: SandboxSession,
    name: str,
    arguments: Mapping[str, Any],
    settings: FileToolSettings,
    cwd: Path | None = None,
    deadline: float | None = None,
    cancel: threading.Event | None = None,
) -> str:
    """Validate and run one call; the observation text (ToolArgumentError for bad arguments)."""
    prepared = prepare(name, arguments, settings)
    result = run_prepared(session, prepared, settings, cwd, deadline, cancel)
    return render(prepared, result, session.sandbox.limits)


def replayed_calls(
    calls: Sequence[Any], tools: frozenset[str], settings: FileToolSettings
) -> list[PreparedCall]:
    """The mutating calls of an episode that ran, validated as the tool did, in order. Left
    out as the tool left them: tools not offered, read-only tools, refused arguments, calls
    not run (:func:`~dockyard.environments.tools.toolbox.ran_calls`)."""
    replay: list[PreparedCall] = []
    for name, arguments in ran_calls(calls, tools & MUTATING):
        try:
            replay.append(prepare(name, arguments, settings))
        except ToolArgumentError:
            continue
    return replay
