"""The swe environment end to end: a real ``dockyard sandbox serve`` process, real patches, a
real (tiny) repository with a bug and a unittest suite, and a dead URL in front of it."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from swe_repo import BUGGY, FIXED, POLICY, TESTS, WRONG, make_calc
from swe_repo import diff as _diff

from dockyard.config.sections.env import SWEEnvConfig
from dockyard.environments import (
    EnvironmentContext,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    build_environment,
)
from dockyard.environments.swe.environment import SandboxServiceUnavailableError, url_order
from tests.sandbox_service import sandbox_service, serve_command

TOKEN = "s3cr3t-token-for-the-sandbox-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_calc(tmp_path_factory.mktemp("repos"))


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The service's policy and a 0600 token file, shared by service and clients."""
    directory = tmp_path_factory.mktemp("secrets")
    (directory / "policy.yaml").write_text(POLICY)
    token = directory / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return directory


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serve(repos: Path, secrets_dir: Path, *extra: str) -> list[str]:
    return serve_command(repos, secrets_dir / "policy.yaml", *extra)


@pytest.fixture(scope="module")
def service_url(repos: Path, secrets_dir: Path) -> Iterator[str]:
    command = [
        *_serve(repos, secrets_dir, "--token-file", str(secrets_dir / "token")),
        "--wall-time-s",
        "30",
        "--cpu-time-s",
        "10",
        "--memory-mb",
        "512",
        "--max-jobs",
        "2",
    ]
    with sandbox_service(command, env={"DOCKYARD_SANDBOX_TOKEN": ""}, start_timeout_s=30) as url:
        yield url


def _environment(urls: list[str], secrets_dir: Path, **settings: object):
    context = EnvironmentContext()
    settings.setdefault("sandbox_token_file", str(secrets_dir / "token"))
    context.env.swe = SWEEnvConfig(sandbox_urls=urls, task_timeout=60, **settings)
    return build_environment("swe", context)


def _group(*responses: str, group_id: str = "swe-1") -> ScoringGroup:
    return ScoringGroup(
        group_id=group_id,
        env_name="swe",
        prompt_text="Fix add().",
        samples=[SampleInput(text) for text in responses],
        ground_truth={"repo": "calc"},
    )


def test_health(service_url: str) -> None:
    answer = httpx.get(f"{service_url}/healthz", headers=AUTH, timeout=5).json()
    assert answer == {"status": "ok", "repos": ["calc"]}


async def test_correct_wrong_and_broken_patches(service_url: str, secrets_dir: Path) -> None:
    environment = _environment([service_url], secrets_dir)
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


async def test_fraction_reward_mode(service_url: str, secrets_dir: Path) -> None:
    environment = _environment([service_url], secrets_dir, reward_mode="fraction")
    try:
        score = await environment.score(_group(_diff("calc/__init__.py", BUGGY, WRONG)))
    finally:
        await environment.aclose()
    assert score.rewards == [0.5]


async def test_patch_touching_tests_is_refused(service_url: str, secrets_dir: Path) -> None:
    weakened = TESTS.replace("add(2, 3), 5", "add(2, 3), -1")
    patch = _diff("calc/__init__.py", BUGGY, BUGGY + "\n") + _diff(
        "tests/test_calc.py", TESTS, weakened
    )
    environment = _environment([service_url], secrets_dir)
    try:
        score = await environment.score(_group(patch))
    finally:
        await environment.aclose()
    assert score.rewards == [0.0]
    assert score.samples[0].flags == {ScoreFlag.INTEGRITY_VIOLATION}
    assert "tests/test_calc.py" in score.samples[0].detail
    # The service refuses it on its own too (a client with the check off cannot bypass it).
    answer = httpx.post(
        f"{service_url}/v1/jobs", json={"repo": "calc", "patch": patch}, headers=AUTH, timeout=30
    ).json()
    assert answer["status"] == "integrity_violation"


async def test_tests_rewritten_at_run_time_earn_nothing(
    service_url: str, secrets_dir: Path
) -> None:
    # As root the tests are root-owned (the write fails); without root the hashes catch it.
    sneaky = FIXED + (
        "\nimport pathlib\n"
        "_tests = pathlib.Path(__file__).parent.parent / 'tests' / 'test_calc.py'\n"
        "_tests.write_text(_tests.read_text() + '\\n# tampered\\n')\n"
    )
    environment = _environment([service_url], secrets_dir)
    try:
        score = await environment.score(_group(_diff("calc/__init__.py", BUGGY, sneaky)))
    finally:
        await environment.aclose()
    assert score.rewards == [0.0]


async def test_unreachable_first_url_is_skipped(service_url: str, secrets_dir: Path) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    urls = [dead, service_url]
    group_id = next(f"g{n}" for n in range(100) if url_order(urls, f"g{n}", 0, 1)[0] == dead)
    environment = _environment(urls, secrets_dir)
    try:
        score = await environment.score(
            _group(_diff("calc/__init__.py", BUGGY, FIXED), group_id=group_id)
        )
    finally:
        await environment.aclose()
    assert score.rewards == [1.0]


async def test_no_reachable_url_is_an_error_not_a_reward(secrets_dir: Path) -> None:
    dead = [f"http://127.0.0.1:{_free_port()}", f"http://127.0.0.1:{_free_port()}"]
    environment = _environment(dead, secrets_dir, connect_retries=2)
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


def test_requests_without_the_token_are_refused(service_url: str) -> None:
    patch = _diff("calc/__init__.py", BUGGY, FIXED)
    for headers in ({}, {"Authorization": "Bearer wrong-token-of-some-length"}, {"X": TOKEN}):
        jobs = httpx.post(
            f"{service_url}/v1/jobs",
            json={"repo": "calc", "patch": patch},
            headers=headers,
            timeout=30,
        )
        health = httpx.get(f"{service_url}/healthz", headers=headers, timeout=5)
        assert (jobs.status_code, health.status_code) == (401, 401), headers
        assert "token" in jobs.json()["error"]


@pytest.mark.parametrize(
    "field",
    [
        {"integrity_check": False},
        {"protected_paths": []},
        {"test_command": ["/bin/sh", "-c", "id"]},
    ],
)
def test_requests_cannot_set_the_policy(service_url: str, field: dict[str, object]) -> None:
    # A client that wants tests off, protection off, or its own command run gets a 400 that says
    # why; nothing of the job runs.
    body = {"repo": "calc", "patch": _diff("calc/__init__.py", BUGGY, FIXED), **field}
    answer = httpx.post(f"{service_url}/v1/jobs", json=body, headers=AUTH, timeout=30)
    assert answer.status_code == 400
    assert f"{next(iter(field))}: set by the service's --policy" in answer.json()["error"]


def test_listening_beyond_loopback_needs_a_token(repos: Path, secrets_dir: Path) -> None:
    finished = subprocess.run(
        [*_serve(repos, secrets_dir), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={key: value for key, value in os.environ.items() if key != "DOCKYARD_SANDBOX_TOKEN"},
    )
    assert finished.returncode == 1
    assert "refusing to listen on 0.0.0.0 without a token" in finished.stderr


def test_a_world_readable_token_file_is_refused(
    repos: Path, secrets_dir: Path, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o644)
    finished = subprocess.run(
        [*_serve(repos, secrets_dir), "--token-file", str(token)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 1
    assert "readable by others" in finished.stderr
    assert TOKEN not in finished.stderr + finished.stdout
