"""The swe environment end to end: a real ``dockyard sandbox serve`` process, real patches, a
real (tiny) repository with a bug and a unittest suite, and a dead URL in front of it."""

from __future__ import annotations

import difflib
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dockyard.config.sections.env import SWEEnvConfig
from dockyard.environments import (
    EnvironmentContext,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    build_environment,
)
from dockyard.environments.swe.environment import SandboxServiceUnavailableError, url_order

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a * b\n"
TESTS = """import unittest

from calc import add


class AddTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_add_zero(self):
        self.assertEqual(add(0, 0), 0)


if __name__ == "__main__":
    unittest.main()
"""
TEST_COMMAND = ["{python}", "-m", "unittest", "discover", "-s", "tests", "-t", "."]


def _diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repos")
    package = root / "calc" / "calc"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(BUGGY)
    (root / "calc" / "tests").mkdir()
    (root / "calc" / "tests" / "__init__.py").write_text("")
    (root / "calc" / "tests" / "test_calc.py").write_text(TESTS)
    return root


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def service_url(repos: Path) -> Iterator[str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dockyard",
            "--log-format",
            "json",
            "sandbox",
            "serve",
            "--port",
            "0",
            "--repos",
            str(repos),
            "--wall-time-s",
            "30",
            "--cpu-time-s",
            "10",
            "--memory-mb",
            "512",
            "--max-jobs",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=30), "sandbox service did not start"
        line = process.stdout.readline()
        assert line.startswith("listening on "), line
        yield line.split()[-1]
    finally:
        process.kill()
        process.wait(timeout=10)


def _environment(urls: list[str], **settings: object):
    context = EnvironmentContext()
    context.env.swe = SWEEnvConfig(sandbox_urls=urls, task_timeout=60, **settings)
    return build_environment("swe", context)


def _group(*responses: str, group_id: str = "swe-1") -> ScoringGroup:
    return ScoringGroup(
        group_id=group_id,
        env_name="swe",
        prompt_text="Fix add().",
        samples=[SampleInput(text) for text in responses],
        ground_truth={"repo": "calc", "test_command": TEST_COMMAND},
    )


def test_health(service_url: str) -> None:
    answer = httpx.get(f"{service_url}/healthz", timeout=5).json()
    assert answer == {"status": "ok", "repos": ["calc"]}


async def test_correct_wrong_and_broken_patches(service_url: str) -> None:
    environment = _environment([service_url])
    fixed = _diff("calc/__init__.py", BUGGY, FIXED)
    wrong = _diff("calc/__init__.py", BUGGY, WRONG)
    not_applying = _diff("calc/__init__.py", "def add(x, y):\n    return 0\n", FIXED)
    try:
        score = await environment.score(
            _group(f"Here you go:\n```diff\n{fixed}```", wrong, not_applying, "no diff here")
        )
    finally:
        await environment.aclose()
    assert score.rewards == [1.0, 0.0, 0.0, 0.0]
    assert score.samples[0].components["tests_passed"] == 2.0
    assert score.samples[1].detail.startswith("failed: 1/2 tests passed")
    assert ScoreFlag.PATCH_FAILED in score.samples[2].flags
    assert ScoreFlag.INVALID_ACTION in score.samples[3].flags


async def test_fraction_reward_mode(service_url: str) -> None:
    environment = _environment([service_url], reward_mode="fraction")
    try:
        score = await environment.score(_group(_diff("calc/__init__.py", BUGGY, WRONG)))
    finally:
        await environment.aclose()
    assert score.rewards == [0.5]


async def test_patch_touching_tests_is_refused(service_url: str) -> None:
    weakened = TESTS.replace("add(2, 3), 5", "add(2, 3), -1")
    patch = _diff("calc/__init__.py", BUGGY, BUGGY + "\n") + _diff(
        "tests/test_calc.py", TESTS, weakened
    )
    environment = _environment([service_url])
    try:
        score = await environment.score(_group(patch))
    finally:
        await environment.aclose()
    assert score.rewards == [0.0]
    assert score.samples[0].flags == {ScoreFlag.INTEGRITY_VIOLATION}
    assert "tests/test_calc.py" in score.samples[0].detail
    # The service refuses it on its own too (a client with the check off cannot bypass it).
    answer = httpx.post(
        f"{service_url}/v1/jobs",
        json={"repo": "calc", "patch": patch, "test_command": TEST_COMMAND},
        timeout=30,
    ).json()
    assert answer["status"] == "integrity_violation"


async def test_tests_rewritten_at_run_time_are_caught_by_the_hashes(service_url: str) -> None:
    sneaky = FIXED + (
        "\nimport pathlib\n"
        "_tests = pathlib.Path(__file__).parent.parent / 'tests' / 'test_calc.py'\n"
        "_tests.write_text(_tests.read_text() + '\\n# tampered\\n')\n"
    )
    environment = _environment([service_url])
    try:
        score = await environment.score(_group(_diff("calc/__init__.py", BUGGY, sneaky)))
    finally:
        await environment.aclose()
    assert score.rewards == [0.0]
    assert ScoreFlag.INTEGRITY_VIOLATION in score.samples[0].flags
    assert "changed during the run" in score.samples[0].detail


async def test_unreachable_first_url_is_skipped(service_url: str) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    urls = [dead, service_url]
    group_id = next(f"g{n}" for n in range(100) if url_order(urls, f"g{n}", 0, 1)[0] == dead)
    environment = _environment(urls)
    try:
        score = await environment.score(
            _group(_diff("calc/__init__.py", BUGGY, FIXED), group_id=group_id)
        )
    finally:
        await environment.aclose()
    assert score.rewards == [1.0]


async def test_no_reachable_url_is_an_error_not_a_reward() -> None:
    dead = [f"http://127.0.0.1:{_free_port()}", f"http://127.0.0.1:{_free_port()}"]
    environment = _environment(dead, connect_retries=2)
    started = time.monotonic()
    try:
        with pytest.raises(SandboxServiceUnavailableError, match="ConnectError"):
            await environment.score(_group(_diff("calc/__init__.py", BUGGY, FIXED)))
    finally:
        await environment.aclose()
    assert time.monotonic() - started < 10


def test_service_left_the_snapshot_untouched(repos: Path, service_url: str) -> None:
    assert (repos / "calc" / "calc" / "__init__.py").read_text() == BUGGY
    assert (repos / "calc" / "tests" / "test_calc.py").read_text() == TESTS
    assert not any(p.name == "__pycache__" for p in repos.rglob("*")), os.listdir(repos / "calc")
