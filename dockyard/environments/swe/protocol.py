"""The JSON the ``swe`` environment and ``dockyard sandbox serve`` exchange over HTTP.

``POST /v1/jobs`` with a :class:`SWEJobRequest` answers a :class:`SWEJobResult` once the job ran
(the request is held open for the job's duration). ``GET /healthz`` answers
``{"status": "ok", "repos": [...]}``. When the service has a token, every request carries
``Authorization: Bearer <token>``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

JOBS_PATH = "/v1/jobs"
HEALTH_PATH = "/healthz"
AUTH_HEADER = "Authorization"
# Fields older clients sent; the service names them in its refusal (its policy decides them).
POLICY_FIELDS = ("test_command", "protected_paths", "integrity_check")

JobStatus = Literal[
    "passed", "failed", "patch_failed", "integrity_violation", "timeout", "suspected_reward_hack"
]


class SWEJobRequest(BaseModel):
    """What a client may ask: a patch against a repository. How it is tested is the service's."""

    model_config = ConfigDict(extra="forbid")

    repo: str = Field(description="a snapshot directory name under the service's --repos")
    patch: str = Field(description="unified diff, paths relative to the repository root")
    timeout_s: PositiveFloat = Field(600.0, description="wall clock of the test run")


class SWEJobResult(BaseModel):
    status: JobStatus
    tests_passed: int = 0
    tests_total: int = 0
    exit_code: int | None = None
    detail: str = ""
    output_tail: str = ""
    #: suspected_reward_hack: what the screen found, one "shape at file:line: text" each
    evidence: list[str] = Field(default_factory=list)


# -- episode sessions (multi-turn SWE: docs/multiturn.md, "swe") -------------------------------
#: ``POST`` with a :class:`SessionOpen`: a checkout of the repository for one episode, answered
#: with a :class:`SessionOpened`. The other paths take a :class:`SessionRequest`.
SESSIONS_PATH = "/v1/sessions"
SESSION_CALL_PATH = "/v1/sessions/call"  # a tool call in the checkout → {"output": str}
SESSION_DIFF_PATH = "/v1/sessions/diff"  # the checkout's changes as a unified diff → {"patch"}
SESSION_CLOSE_PATH = "/v1/sessions/close"  # discard the checkout → {}
#: The answer's ``kind`` when a call's arguments are refused (HTTP 400): the model's mistake.
BAD_ARGUMENTS = "bad_arguments"
#: The answer's ``kind`` when a diff is over the service's output cap (HTTP 413): a failed
#: submission, the model's (it scores 0, docs/multiturn.md), not the service's failure.
SUBMISSION_TOO_LARGE = "submission_too_large"


class SessionOpen(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo: str = Field(description="a snapshot directory name under the service's --repos")


class SessionOpened(BaseModel):
    session_id: str
    tools: list[str]


class SessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str = Field(min_length=1, max_length=128)
    name: str | None = Field(None, description="the tool (call only)")
    arguments: dict[str, Any] = Field(default_factory=dict, description="its arguments (call)")
