"""A small strict Dockerfile reader for the image tests (there is no Docker engine here).

It knows the instructions the images use and refuses anything else, so a typo in an instruction
fails the test rather than passing unchecked. Parser directives, heredocs and ``ARG``
substitution are not supported: the images do not use them.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

INSTRUCTIONS = frozenset(
    {"FROM", "RUN", "COPY", "ENV", "WORKDIR", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "LABEL"}
)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int

    def exec_form(self) -> list[str]:
        """ENTRYPOINT/CMD in JSON (exec) form; a shell form is refused."""
        value = json.loads(self.arguments)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"line {self.line}: {self.keyword} is not a JSON list of strings")
        return value


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment line inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        lines.append((start, " ".join(p for p in pending if p)))
        pending = []
    if pending:
        raise ValueError(f"line {start}: the file ends inside a continued instruction")
    return lines


def parse(path: Path) -> list[Stage]:
    stages: list[Stage] = []
    for number, line in _logical_lines(path.read_text()):
        keyword, _, arguments = line.partition(" ")
        keyword = keyword.upper()
        if keyword not in INSTRUCTIONS:
            raise ValueError(f"{path}:{number}: unknown or unsupported instruction {keyword}")
        if keyword == "FROM":
            words = arguments.split()
            if len(words) == 3 and words[1].upper() == "AS":
                stages.append(Stage(base=words[0], name=words[2]))
            elif len(words) == 1:
                stages.append(Stage(base=words[0], name=None))
            else:
                raise ValueError(f"{path}:{number}: FROM {arguments!r}")
            continue
        if not stages:
            raise ValueError(f"{path}:{number}: {keyword} before any FROM")
        stages[-1].instructions.append(Instruction(keyword, arguments.strip(), number))
    return stages


@dataclass(frozen=True)
class Copy:
    sources: list[str]
    destination: str
    from_stage: str | None


def parse_copy(instruction: Instruction) -> Copy:
    words = shlex.split(instruction.arguments)
    from_stage = None
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        if flag.startswith("--from="):
            from_stage = flag.removeprefix("--from=")
        elif not flag.startswith(("--chown=", "--chmod=")):
            raise ValueError(f"line {instruction.line}: COPY flag {flag} not supported")
    if len(words) < 2:
        raise ValueError(f"line {instruction.line}: COPY needs a source and a destination")
    return Copy(sources=words[:-1], destination=words[-1], from_stage=from_stage)
