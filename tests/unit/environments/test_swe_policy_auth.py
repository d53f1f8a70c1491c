"""The sandbox service's policy file and bearer token: what is accepted, what is refused and why."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from dockyard.config.sections.env import EnvConfig, SWEEnvConfig
from dockyard.environments import InvalidScoringInput, SampleInput, ScoringGroup
from dockyard.environments.swe.auth import TOKEN_ENV, TokenError, is_loopback, read_token
from dockyard.environments.swe.environment import SWEEnvironment
from dockyard.environments.swe.integrity import (
    DEFAULT_PROTECTED_PATHS,
    integrity_problems,
    touched_paths,
)
from dockyard.environments.swe.policy import PolicyError, RepoPolicy, load_policy

TOKEN = "0123456789abcdef-token"


def _token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_token_from_file_then_environment(tmp_path: Path) -> None:
    path = _token_file(tmp_path, TOKEN + "\n")
    assert read_token(path, environ={TOKEN_ENV: "other-token-from-env"}) == TOKEN.encode()
    assert read_token(None, environ={TOKEN_ENV: TOKEN}) == TOKEN.encode()
    assert read_token(None, environ={}) is None


@pytest.mark.parametrize(
    ("text", "mode", "reason"),
    [
        (TOKEN, 0o644, "readable by others"),
        (TOKEN, 0o640, "readable by others"),
        ("short", 0o600, "under 16 bytes"),
        ("   \n", 0o600, "under 16 bytes"),
    ],
)
def test_unusable_token_files_are_refused(tmp_path: Path, text: str, mode: int, reason: str):
    with pytest.raises(TokenError, match=reason) as caught:
        read_token(_token_file(tmp_path, text, mode), environ={})
    assert TOKEN not in str(caught.value)


def test_a_missing_token_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenError, match="No such file"):
        read_token(tmp_path / "absent", environ={})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("sandbox-0", False),
        ("", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("repos:\n  calc: {framework: unittest, test_paths: [tests/unit/]}\n")
    policy = load_policy(path)
    assert policy.for_repo("calc") == RepoPolicy(framework="unittest", test_paths=("tests/unit",))
    assert policy.for_repo("other") == RepoPolicy()
    assert {"tests/unit", "tests/unit/*", "conftest.py"} <= set(
        policy.for_repo("calc").protected_patterns()
    )
    assert load_policy(None).default.framework == "pytest"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("default: {framework: nose}\n", "framework"),
        ("default: {test_paths: [../outside]}\n", "inside the repository"),
        ("default: {test_paths: [/abs]}\n", "inside the repository"),
        ("default: {test_paths: []}\n", "at least 1"),
        ("default: {test_command: [sh]}\n", "Extra inputs"),
        ("integrity_check: false\n", "Extra inputs"),
        ("default: [\n", "while parsing"),
    ],
)
def test_bad_policy_files_are_refused(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=reason) as caught:
        load_policy(path)
    assert str(path) in str(caught.value)


async def test_the_data_cannot_choose_the_test_command(tmp_path: Path) -> None:
    environment = SWEEnvironment(SWEEnvConfig(sandbox_urls=["http://127.0.0.1:9"]))
    group = ScoringGroup(
        group_id="g",
        env_name="swe",
        prompt_text="fix it",
        samples=[SampleInput("diff --git a/x b/x\n")],
        ground_truth={"repo": "calc", "test_command": ["/bin/sh", "-c", "id"]},
    )
    with pytest.raises(InvalidScoringInput, match="--policy decides"):
        await environment.score(group)


def test_the_client_refuses_an_unusable_token_file(tmp_path: Path) -> None:
    path = _token_file(tmp_path, TOKEN, 0o644)
    with pytest.raises(ValueError, match=r"env\.swe\.sandbox_token_file: .*readable by others"):
        SWEEnvironment(SWEEnvConfig(sandbox_token_file=str(path)))


def test_the_early_header_check_reads_quoted_paths_as_git_does() -> None:
    # git writes (and git apply reads) unusual names C-quoted with octal escapes: \145 is "e".
    name = r"t\145sts/t\145st_calc.py"
    patch = f'diff --git "a/{name}" "b/{name}"\n--- "a/{name}"\n+++ "b/{name}"\n@@ -1 +1 @@\n'
    assert touched_paths(patch) == {"tests/test_calc.py"}
    assert integrity_problems(patch, DEFAULT_PROTECTED_PATHS) == [
        "tests/test_calc.py is a test or test-runner file"
    ]
    utf8 = 'diff --git "a/caf\\303\\251.py" "b/caf\\303\\251.py"\n'
    assert touched_paths(utf8) == {"café.py"}


@pytest.mark.parametrize(
    ("settings", "issue"),
    [
        # TLS files with only http:// services would be read by nothing: refused, not ignored.
        ({"sandbox_urls": ["http://10.0.0.5:8085"], "sandbox_ca_file": "ca.pem"},
         ("swe.sandbox_ca_file", "no swe.sandbox_urls entry is https://")),
        ({"sandbox_urls": ["https://10.0.0.5:8085"], "sandbox_client_cert_file": "c.pem"},
         ("swe.sandbox_client_key_file", "go together")),
    ],
)  # fmt: skip
def test_tls_settings_that_would_not_take_effect_are_refused(
    settings: dict[str, object], issue: tuple[str, str]
) -> None:
    path, fragment = issue
    with pytest.raises(ValidationError, match=re.escape(f"{path}: ") + ".*" + re.escape(fragment)):
        EnvConfig(swe=SWEEnvConfig(**settings))
