"""The type check CI enforces: ``mypy`` with pyproject's ``[tool.mypy]`` (strict over
``dockyard/``) reports no error, and every ``type: ignore`` left in ``dockyard/`` names the error
code it silences and says why (``# type: ignore[code]  # reason``)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dockyard"
MYPY_CACHE = Path(
    os.environ.get("DOCKYARD_MYPY_CACHE", Path.home() / ".cache" / "dockyard" / "mypy")
)

# A code list in brackets, then (after at least one space) a comment with some text: the reason.
_REASONED_IGNORE = re.compile(r"type:\s*ignore\[[a-z-]+(?:\s*,\s*[a-z-]+)*\]\s+#\s*\S")
_ANY_IGNORE = re.compile(r"type:\s*ignore")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a cold run (no .mypy_cache) on 2 busy cores takes minutes
def test_mypy_strict_reports_no_error() -> None:
    # The cache makes later runs incremental: seconds instead of minutes. It lives outside the
    # checkout so that a fresh clone on the same machine (CI's) starts warm; mypy rechecks any
    # module whose source differs from what the cache recorded.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(MYPY_CACHE),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"mypy --strict failed:\n{result.stdout}{result.stderr}"


def _ignore_comments(path: Path) -> list[tuple[int, str]]:
    """(line, comment) of every comment of ``path`` that holds a ``type: ignore``; a string
    that merely mentions one is not a comment, so tokenize tells them apart."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [
        (token.start[0], token.string)
        for token in tokens
        if token.type == tokenize.COMMENT and _ANY_IGNORE.search(token.string)
    ]


def unreasoned_ignores(package: Path) -> list[str]:
    return [
        f"{path.relative_to(package.parent)}:{line}: {comment}"
        for path in sorted(package.rglob("*.py"))
        for line, comment in _ignore_comments(path)
        if not _REASONED_IGNORE.search(comment)
    ]


def test_every_type_ignore_names_its_code_and_reason() -> None:
    found = unreasoned_ignores(PACKAGE)
    assert not found, (
        "each `type: ignore` needs its error code and a reason, as "
        "`# type: ignore[code]  # why`:\n" + "\n".join(found)
    )


def test_the_ignore_rule_tells_reasoned_from_bare(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "a = f()  # type: ignore\n"
        "b = f()  # type: ignore[attr-defined]\n"
        "c = f()  # type: ignore[attr-defined]  # vLLM mixes this class into its worker\n"
        "d = f()  # type: ignore[arg-type, union-attr]  # both: the stub's union\n"
        'e = "# type: ignore"\n'
    )
    assert [entry.split(":")[1] for entry in unreasoned_ignores(package)] == ["1", "2"]
