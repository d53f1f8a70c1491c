"""An LLM judge over an OpenAI-compatible ``/v1/chat/completions`` endpoint (``httpx``).

:meth:`Judge.grade` asks for a judgement ``{"score": 0..max_score, "reason": "..."}`` (by JSON
schema when ``structured_output`` is set, which vLLM and OpenAI enforce while decoding) and
retries, up to ``max_retries`` more attempts with exponential backoff, on what a retry can fix:
a transport error, a 429 or 5xx status, or an answer that is not a judgement. Then:

- no answer at all: :class:`JudgeUnavailableError` (an infrastructure failure, for the scorer
  to nak and retry later, never a reward of 0);
- answers, but never a judgement (a refusal, prose, a score off the scale):
  :class:`JudgementRefused`, whose reason names what the judge said, for the environment to
  dead-letter.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass

import httpx

from dockyard.config.sections.env import JudgeConfig
from dockyard.environments.swe.auth import TokenError, read_token
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

API_KEY_ENV = "DOCKYARD_JUDGE_API_KEY"
CHAT_PATH = "/v1/chat/completions"
_RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_BACKOFF_BASE_S = 0.2
_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


class JudgeUnavailableError(ConnectionError):
    """The endpoint gave no usable HTTP answer within the retries."""


class JudgementRefused(ValueError):
    """The judge answered, but never with a judgement; ``reason`` says what it said."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Judgement:
    score: float  # on the rubric's scale, 0..max_score
    reason: str
    attempts: int


def judgement_schema(max_score: int) -> dict[str, object]:
    return {
        "type": "object",
        "properties": {
            "score": {"type": "integer", "minimum": 0, "maximum": max_score},
            "reason": {"type": "string", "maxLength": 300},
        },
        "required": ["score", "reason"],
        "additionalProperties": False,
    }


def parse_judgement(text: str, max_score: int) -> tuple[float, str]:
    """The score and reason of a judge's answer; :class:`JudgementRefused` if it holds none."""
    shown = " ".join(text.split())[:160] or "(empty)"
    match = _OBJECT.search(text)
    if match is None:
        raise JudgementRefused(f"the judge's answer holds no JSON object: {shown!r}")
    try:
        value = json.loads(match.group(0))
    except json.JSONDecodeError:
        raise JudgementRefused(f"the judge's answer is not valid JSON: {shown!r}") from None
    score = value.get("score") if isinstance(value, dict) else None
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise JudgementRefused(f"the judge's answer has no numeric score: {shown!r}")
    if not 0 <= score <= max_score:
        raise JudgementRefused(f"the judge's score {score} is off the scale 0..{max_score}")
    reason = value.get("reason")
    return float(score), reason if isinstance(reason, str) else ""


class Judge:
    def __init__(self, judge: JudgeConfig, where: str) -> None:
        """``where``: the key path of ``judge`` (``env.gdpval.judge``), for refusals."""
        if judge.base_url is None:
            raise ValueError(f"{where}.base_url: not set; the judge needs an endpoint")
        try:
            key = read_token(judge.api_key_file, variable=API_KEY_ENV)
        except TokenError as error:
            raise ValueError(f"{where}.api_key_file: {error}") from None
        self.judge = judge
        self.url = judge.base_url.rstrip("/") + CHAT_PATH
        self.headers = {"Authorization": f"Bearer {key.decode()}"} if key else {}
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.judge.request_timeout_s)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def request_body(self, system: str, user: str) -> dict[str, object]:
        body: dict[str, object] = {
            "model": self.judge.model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
            "temperature": self.judge.temperature,
            "max_tokens": self.judge.max_tokens,
        }
        if self.judge.structured_output:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "judgement",
                    "schema": judgement_schema(self.judge.max_score),
                },
            }
        return body

    async def grade(self, system: str, user: str) -> Judgement:
        body = self.request_body(system, user)
        attempts = self.judge.max_retries + 1
        last_refusal: JudgementRefused | None = None
        last_failure = ""
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                await asyncio.sleep(_BACKOFF_BASE_S * 2 ** (attempt - 2))  # backoff, not a sync
            try:
                response = await self._http().post(self.url, json=body, headers=self.headers)
            except httpx.TransportError as error:
                last_failure = f"{type(error).__name__}: {error}"
                continue
            if response.status_code in _RETRYABLE_STATUS:
                last_failure = f"HTTP {response.status_code}"
                continue
            if response.status_code != 200:
                # A 4xx other than those is the request's fault (model name, schema support):
                # no retry changes it, and it is no judgement of this sample either.
                raise JudgeUnavailableError(
                    f"the judge at {self.url} refused the request: HTTP {response.status_code} "
                    f"{response.text[:200]}"
                )
            try:
                text = response.json()["choices"][0]["message"]["content"] or ""
                score, reason = parse_judgement(text, self.judge.max_score)
            except (ValueError, KeyError, IndexError, TypeError) as error:
                refusal = error if isinstance(error, JudgementRefused) else None
                last_refusal = refusal or JudgementRefused(f"malformed response body: {error}")
                log.info("judge.no_judgement", attempt=attempt, reason=last_refusal.reason)
                continue
            return Judgement(score, reason, attempt)
        if last_refusal is not None:
            raise JudgementRefused(f"{last_refusal.reason} (after {attempts} attempts)")
        raise JudgeUnavailableError(
            f"the judge at {self.url} gave no answer in {attempts} attempts: {last_failure}"
        )
