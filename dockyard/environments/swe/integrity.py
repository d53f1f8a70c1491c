"""Which files a diff touches, which of them are tests or the test runner, and their hashes.

Pattern semantics: a glob without ``/`` matches any single path component (``tests`` protects
every ``tests/`` directory, ``test_*.py`` every such file anywhere); a glob with ``/`` is matched
against the whole repository-relative path.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

DEFAULT_PROTECTED_PATHS = (
    "tests",
    "test",
    "testing",
    "test_*.py",
    "*_test.py",
    "conftest.py",
    "pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "noxfile.py",
    "runtests.py",
    "run_tests.sh",
    "Makefile",
)

_DIFF_GIT = re.compile(r'^diff --git "?a/(.+?)"? "?b/(.+?)"?$')
_FILE_HEADER = re.compile(r'^(?:---|\+\+\+) "?(.+?)"?(?:\t.*)?$')
_RENAME_COPY = re.compile(r"^(?:rename|copy) (?:from|to) (.+)$")


def _strip_prefix(path: str) -> str | None:
    path = path.strip()
    if path == "/dev/null":
        return None
    if path.startswith(("a/", "b/")):
        path = path[2:]
    return path


def touched_paths(diff: str) -> set[str]:
    """Every path a unified / git diff creates, modifies, deletes, renames or copies."""
    paths: set[str] = set()
    for line in diff.splitlines():
        if match := _DIFF_GIT.match(line):
            candidates = [match.group(1), match.group(2)]
        elif (line.startswith(("--- ", "+++ ")) and (match := _FILE_HEADER.match(line))) or (
            match := _RENAME_COPY.match(line)
        ):
            candidates = [match.group(1)]
        else:
            continue
        for candidate in candidates:
            if (path := _strip_prefix(candidate)) is not None:
                paths.add(path)
    return paths


def escapes_repository(path: str) -> bool:
    pure = PurePosixPath(path)
    return pure.is_absolute() or ".." in pure.parts


def is_protected(path: str, patterns: Iterable[str]) -> bool:
    parts = PurePosixPath(path).parts
    for pattern in patterns:
        if "/" in pattern:
            if fnmatchcase(path, pattern.strip("/")):
                return True
        elif any(fnmatchcase(part, pattern) for part in parts):
            return True
    return False


def integrity_problems(diff: str, patterns: Iterable[str]) -> list[str]:
    """Why a patch must be refused: protected paths it touches, paths outside the repository."""
    patterns = list(patterns)
    problems = []
    for path in sorted(touched_paths(diff)):
        if escapes_repository(path):
            problems.append(f"{path} is outside the repository")
        elif is_protected(path, patterns):
            problems.append(f"{path} is a test or test-runner file")
    return problems


def hash_protected_files(root: Path, patterns: Iterable[str]) -> Mapping[str, str]:
    """sha256 of every protected file under ``root`` (symlinks by their target text)."""
    patterns = list(patterns)
    digests: dict[str, str] = {}
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [name for name in subdirectories if name != ".git"]
        for name in files:
            path = Path(directory, name)
            relative = path.relative_to(root).as_posix()
            if not is_protected(relative, patterns):
                continue
            if path.is_symlink():
                digests[relative] = "link:" + os.readlink(path)
            else:
                digests[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests
