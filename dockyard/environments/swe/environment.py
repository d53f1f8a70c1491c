"""``swe``: score a generated patch by running the repository's tests in the sandbox service.

Ground truth (``group.ground_truth`` mapping, else ``group.extra``): ``repo`` (snapshot name on
the service) and optional ``protected_paths`` (globs added to the defaults and to
``env.swe.protected_paths`` for the early check below). How the tests run and what they protect
is the sandbox service's own policy; a ``test_command`` in the data is refused.

With ``env.swe.integrity_check`` a patch whose diff headers name a protected path is refused
here, without a round trip. That reads header text only; the service decides on what
``git apply`` really changed, whatever this check says. With a token
(``env.swe.sandbox_token_file`` or ``$DOCKYARD_SANDBOX_TOKEN``) every request carries it.

Samples of a group are sent concurrently. Each sample's job starts at URL
``crc32(group_id/index) % len(urls)`` (deterministic spreading) and moves to the next URL on a
connection failure or a 502/503/504, for ``connect_retries`` rounds over all URLs, all within
``task_timeout``. If no URL answers, :class:`SandboxServiceUnavailableError` is raised: an
infrastructure failure, for the scorer to nak and retry, never a reward of 0.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict

import httpx

from dockyard.config.sections.env import SWEEnvConfig
from dockyard.environments.base import (
    Environment,
    GroupScore,
    InvalidScoringInput,
    SampleInput,
    SampleScore,
    ScoreFlag,
    ScoringGroup,
)
from dockyard.environments.registry import register_environment
from dockyard.environments.swe.auth import TokenError, read_token
from dockyard.environments.swe.integrity import DEFAULT_PROTECTED_PATHS, integrity_problems
from dockyard.environments.swe.protocol import AUTH_HEADER, JOBS_PATH, SWEJobRequest, SWEJobResult
from dockyard.environments.swe.tls import TLSSetupError, client_context
from dockyard.utils.logging import get_logger

logger = get_logger(__name__)

_RETRYABLE_STATUS = {502, 503, 504}
#: The multi-turn tool whose answer is the checkout's diff (tools/swe.py).
SUBMIT_TOOL = "submit"
_DIFF_FENCE = re.compile(r"```(?:diff|patch)[ \t]*\n(.*?)```", re.DOTALL)
_BACKOFF_BASE_S = 0.1
_CONNECT_TIMEOUT_S = 5.0


class SandboxServiceUnavailableError(ConnectionError):
    """No sandbox URL accepted the job within the retries and the task timeout."""


def extract_patch(response: str) -> str | None:
    """The last ```diff block, or the response from its first diff header on."""
    fenced = _DIFF_FENCE.findall(response)
    if fenced:
        last: str = fenced[-1]  # the pattern has one group: findall yields its strings
        return last
    match = re.search(r"^(?:diff --git |--- )", response, re.MULTILINE)
    return response[match.start() :] if match else None


def url_order(urls: Sequence[str], group_id: str, sample_index: int, rounds: int) -> list[str]:
    """The URLs one sample's job tries, in order: spread by a stable hash, then round-robin."""
    start = zlib.crc32(f"{group_id}/{sample_index}".encode()) % len(urls)
    one_round = [urls[(start + offset) % len(urls)] for offset in range(len(urls))]
    return one_round * rounds


class _JobFields(TypedDict):
    """What a group's ground truth contributes to each of its sandbox jobs."""

    repo: str
    protected_paths: NotRequired[list[str]]


def _job_fields(group: ScoringGroup) -> _JobFields:
    truth = group.ground_truth if isinstance(group.ground_truth, Mapping) else group.extra
    repo = truth.get("repo")
    if not isinstance(repo, str) or not repo:
        raise InvalidScoringInput("missing_repo", f"group {group.group_id} names no repo")
    if truth.get("test_command") is not None:
        raise InvalidScoringInput(
            "test_command_in_data",
            f"group {group.group_id} sets test_command: the sandbox service's --policy decides "
            "how tests run",
        )
    fields: _JobFields = {"repo": repo}
    value = truth.get("protected_paths")
    if value is not None:
        if not isinstance(value, Sequence) or isinstance(value, str):
            raise InvalidScoringInput("bad_protected_paths", "protected_paths must be a list")
        fields["protected_paths"] = [str(item) for item in value]
    return fields


def _no_patch(detail: str) -> SampleScore:
    return SampleScore(0.0, {"tests_passed": 0.0}, frozenset({ScoreFlag.INVALID_ACTION}), detail)


def submission_of(sample: SampleInput) -> str | SampleScore:
    """The patch a sample submits, or its zero score saying why there is none: a single turn's
    diff in its text; an episode's (multi-turn, ``tool_calls`` recorded) last ``submit`` that
    answered — the checkout's diff the sandbox service returned, scored like any patch."""
    if sample.tool_calls is None:
        patch = extract_patch(sample.response_text)
        return _no_patch("no diff") if patch is None else patch
    submitted = [
        call for call in sample.tool_calls if call.name == SUBMIT_TOOL and call.result is not None
    ]
    if not submitted:
        return _no_patch("the episode submitted nothing")
    last = submitted[-1]
    if last.error is not None or last.result is None:
        return _no_patch(f"the last submission failed ({last.error})")
    if not last.result.strip():
        return _no_patch("the submitted checkout has no change")
    return last.result


def service_access(settings: SWEEnvConfig) -> tuple[dict[str, str], ssl.SSLContext | bool]:
    """The headers (the bearer token) and TLS verification of requests to the sandbox
    services; ValueError naming the ``env.swe`` key that is wrong."""
    try:
        token = read_token(settings.sandbox_token_file)
    except TokenError as error:
        raise ValueError(f"env.swe.sandbox_token_file: {error}") from None
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers[AUTH_HEADER] = f"Bearer {token.decode()}"
    tls: ssl.SSLContext | bool = True  # httpx's default: the system's CAs
    if any(url.startswith("https://") for url in settings.sandbox_urls):
        try:
            tls = client_context(
                settings.sandbox_ca_file,
                settings.sandbox_client_cert_file,
                settings.sandbox_client_key_file,
            )
        except TLSSetupError as error:
            raise ValueError(f"env.swe TLS settings: {error}") from None
    return headers, tls


@register_environment
class SWEEnvironment(Environment):
    name = "swe"
    settings: SWEEnvConfig

    def __init__(self, settings: SWEEnvConfig) -> None:
        super().__init__(settings)
        self._client: httpx.AsyncClient | None = None
        self._headers, self._tls = service_access(settings)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(verify=self._tls)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def score(self, group: ScoringGroup) -> GroupScore:
        if not self.settings.sandbox_urls:
            raise SandboxServiceUnavailableError("env.swe.sandbox_urls is empty")
        fields = _job_fields(group)
        deadline = time.monotonic() + self.settings.task_timeout
        scores = await asyncio.gather(
            *(
                self._score_sample(group, index, submission_of(sample), fields, deadline)
                for index, sample in enumerate(group.samples)
            )
        )
        return GroupScore(group_id=group.group_id, samples=list(scores))

    async def _score_sample(
        self,
        group: ScoringGroup,
        index: int,
        submission: str | SampleScore,
        fields: _JobFields,
        deadline: float,
    ) -> SampleScore:
        if isinstance(submission, SampleScore):
            return submission
        patch = submission
        protected = [*self.settings.protected_paths, *fields.get("protected_paths", [])]
        if self.settings.integrity_check:
            problems = integrity_problems(patch, [*DEFAULT_PROTECTED_PATHS, *protected])
            if problems:
                return _refused("; ".join(problems))
        request = SWEJobRequest(
            repo=fields["repo"], patch=patch, timeout_s=max(deadline - time.monotonic(), 0.001)
        )
        result = await self._submit(request, group.group_id, index, deadline)
        return self._to_score(result)

    async def _submit(
        self, request: SWEJobRequest, group_id: str, index: int, deadline: float
    ) -> SWEJobResult:
        urls = url_order(self.settings.sandbox_urls, group_id, index, self.settings.connect_retries)
        failures: list[str] = []
        for attempt, url in enumerate(urls):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if attempt and attempt % len(self.settings.sandbox_urls) == 0:
                rounds_done = attempt // len(self.settings.sandbox_urls)
                await asyncio.sleep(min(_BACKOFF_BASE_S * 2**rounds_done, remaining))
            request.timeout_s = max(deadline - time.monotonic(), 0.001)
            timeout = httpx.Timeout(request.timeout_s + 1.0, connect=_CONNECT_TIMEOUT_S)
            try:
                response = await self._http().post(
                    url.rstrip("/") + JOBS_PATH,
                    content=request.model_dump_json(),
                    headers=self._headers,
                    timeout=timeout,
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as error:
                failures.append(f"{url}: {type(error).__name__}")
                logger.warning("sandbox unreachable, trying the next", url=url, error=str(error))
                continue
            if response.status_code in _RETRYABLE_STATUS:
                failures.append(f"{url}: HTTP {response.status_code}")
                continue
            if response.status_code in (401, 403):
                # Not the sample's fault: a scorer without the service's token is misconfigured.
                raise SandboxServiceUnavailableError(
                    f"{url} refused the job (HTTP {response.status_code}): check "
                    "env.swe.sandbox_token_file"
                )
            response.raise_for_status()
            return SWEJobResult.model_validate_json(response.content)
        raise SandboxServiceUnavailableError(
            f"no sandbox accepted the job ({'; '.join(failures) or 'task timeout reached'})"
        )

    def _to_score(self, result: SWEJobResult) -> SampleScore:
        fraction = result.tests_passed / result.tests_total if result.tests_total else 0.0
        passed = result.status == "passed"
        reward = float(passed) if self.settings.reward_mode == "binary" else fraction
        flags: set[ScoreFlag] = set()
        if result.status == "integrity_violation":
            return _refused(result.detail)
        if result.status == "suspected_reward_hack":
            return SampleScore(
                0.0,
                {"tests_passed": 0.0, "pass_fraction": 0.0},
                frozenset({ScoreFlag.SUSPECTED_REWARD_HACK}),
                result.detail[:500],
            )
        if result.status == "patch_failed":
            flags.add(ScoreFlag.PATCH_FAILED)
            reward = 0.0
        if result.status == "timeout":
            flags.add(ScoreFlag.TEST_TIMEOUT)
        detail = f"{result.status}: {result.tests_passed}/{result.tests_total} tests passed"
        if result.detail:
            detail += f"; {result.detail}"
        return SampleScore(
            reward=reward,
            components={"tests_passed": float(result.tests_passed), "pass_fraction": fraction},
            flags=frozenset(flags),
            detail=detail[:500],
        )


def _refused(reason: str) -> SampleScore:
    return SampleScore(
        0.0,
        {"tests_passed": 0.0, "pass_fraction": 0.0},
        frozenset({ScoreFlag.INTEGRITY_VIOLATION}),
        f"refused: {reason}"[:500],
    )
