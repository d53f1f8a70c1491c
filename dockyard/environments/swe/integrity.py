"""Which files are tests or the test runner, what a patch changed of them, and locking them.

Two uses: :func:`integrity_problems` reads a diff's header text, a quick early refusal for the
client (it can be fooled by quoting, so the sandbox service does not rely on it); the service
applies the patch and compares :func:`hash_protected_files` of the result with the pristine
snapshot's, i.e. decides on what ``git apply`` actually did.

Pattern semantics: a glob without ``/`` matches any single path component (``tests`` protects
every ``tests/`` directory, ``test_*.py`` every such file anywhere); a glob with ``/`` is matched
against the whole repository-relative path.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from dockyard.environments.swe.untrusted_files import (
    UntrustedFileError,
    kind_of,
    read_regular_file,
)

_PYCACHE = "__pycache__"

# Every file a test framework reads its configuration (and so its plugins) from, anywhere:
# pytest reads pytest.ini, .pytest.ini, pytest.toml / .pytest.toml (pytest 9), pyproject.toml,
# tox.ini and setup.cfg; conftest.py files are plugins. (Bytecode next to a test is
# lock_protected's: it seals every __pycache__ where a test's could be.)
DEFAULT_PROTECTED_PATHS = (
    "tests",
    "test",
    "testing",
    "test_*.py",
    "*_test.py",
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
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


def _unquote(path: str) -> str:
    """Git's C-style quoting (``"t\\145sts/x"`` is ``tests/x``), undone as ``git apply`` does."""
    if "\\" not in path:
        return path
    try:
        raw = path.encode("latin-1", "backslashreplace").decode("unicode_escape")
        return raw.encode("latin-1").decode("utf-8", "replace")
    except (UnicodeError, ValueError):
        return path


def _strip_prefix(path: str) -> str | None:
    path = _unquote(path.strip().strip('"'))
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


_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def added_lines(diff: str) -> dict[str, set[int]]:
    """Per file (its new path), the line numbers in the new file of the lines the diff adds."""
    added: dict[str, set[int]] = {}
    current: set[int] | None = None
    line_number = 0
    for line in diff.splitlines():
        if line.startswith("+++ ") and (match := _FILE_HEADER.match(line)):
            path = _strip_prefix(match.group(1))
            current = None if path is None else added.setdefault(path, set())
        elif match := _HUNK.match(line):
            line_number = int(match.group(1))
        elif current is not None and line.startswith("+"):
            current.add(line_number)
            line_number += 1
        elif line.startswith(" "):
            line_number += 1
    return added


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
    """sha256 of every protected file under ``root``; what is no regular file (a symlink, FIFO,
    socket, device) by its kind (and a link by its text), never opened or followed."""
    patterns = list(patterns)
    digests: dict[str, str] = {}
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [name for name in subdirectories if name != ".git"]
        for name in files:
            path = Path(directory, name)
            relative = path.relative_to(root).as_posix()
            if is_protected(relative, patterns):
                digests[relative] = _digest(path)
    return digests


def _digest(path: Path) -> str:
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return "link:" + os.readlink(path)
    if not stat.S_ISREG(mode):
        return kind_of(mode)  # a FIFO or socket where a snapshot has none: a change
    try:
        return hashlib.sha256(read_regular_file(path)).hexdigest()
    except UntrustedFileError as error:  # swapped or grown past the cap since the lstat
        return f"unreadable:{error}"


def protected_changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """Protected paths added, removed or changed between two :func:`hash_protected_files`."""
    return sorted(
        path for path in before.keys() | after.keys() if before.get(path) != after.get(path)
    )


def lock_protected(root: Path, relative_paths: Iterable[str], sealed: Iterable[str] = ()) -> None:
    """Make protected files root-owned and read-only to the run, and their directories too.

    Directories under ``sealed`` (the policy's test paths) become root-owned ``0o755``: the run
    can add nothing there (no extension module or bytecode next to a test's source). Other
    directories holding a protected file (the repository root with its ``pyproject.toml``) are
    root-owned ``0o1777`` (like ``/tmp``): the run's uid may still create files there, but
    cannot delete, rename or replace what it does not own, so neither a test file nor a
    directory holding one can be swapped out, even for a moment. Every such directory gets a
    root-owned, read-only ``__pycache__``, so no bytecode of the run's making sits where an
    import looks for a test's. Needs root.
    """
    sealed_roots = [PurePosixPath(path) for path in sealed]
    directories: set[Path] = set()
    for relative in relative_paths:
        path = root / relative
        os.lchown(path, 0, 0)
        if not path.is_symlink():
            os.chmod(path, 0o644 | (path.stat().st_mode & 0o111))
        directories.update(root / parent for parent in PurePosixPath(relative).parents)
    for directory in directories:
        relative_dir = PurePosixPath(directory.relative_to(root).as_posix())
        under_tests = any(
            relative_dir == top or top in relative_dir.parents for top in sealed_roots
        )
        os.chown(directory, 0, 0)
        os.chmod(directory, 0o755 if under_tests else 0o1777)
        _seal_pycache(directory / _PYCACHE)


def _seal_pycache(pycache: Path) -> None:
    """A root-owned ``0o755`` directory at ``pycache`` with root-owned read-only contents (the
    snapshot's bytecode stays, hashed with it); a symlink or file there is replaced."""
    if pycache.is_symlink() or (pycache.exists() and not pycache.is_dir()):
        pycache.unlink()
    if not pycache.exists():
        pycache.mkdir(mode=0o755)
    for directory, subdirectories, files in os.walk(pycache):
        os.lchown(directory, 0, 0)
        os.chmod(directory, 0o755)
        for name in [*subdirectories, *files]:
            path = Path(directory, name)
            os.lchown(path, 0, 0)
            if not path.is_symlink() and path.is_file():
                os.chmod(path, 0o644)
