"""The JSON the ``swe`` environment and ``dockyard sandbox serve`` exchange over HTTP.

``POST /v1/jobs`` with a :class:`SWEJobRequest` answers a :class:`SWEJobResult` once the job ran
(the request is held open for the job's duration). ``GET /healthz`` answers
``{"status": "ok", "repos": [...]}``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

JOBS_PATH = "/v1/jobs"
HEALTH_PATH = "/healthz"
PYTHON_PLACEHOLDER = "{python}"

JobStatus = Literal["passed", "failed", "patch_failed", "integrity_violation", "timeout"]


class SWEJobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo: str = Field(description="a snapshot directory name under the service's --repos")
    patch: str = Field(description="unified diff, paths relative to the repository root")
    test_command: list[str] = Field(
        default_factory=lambda: [
            PYTHON_PLACEHOLDER,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        min_length=1,
        description=f"argv run in the checkout; {PYTHON_PLACEHOLDER} is the sandbox interpreter",
    )
    protected_paths: list[str] = Field(
        default_factory=list, description="globs the patch may not touch, beyond the defaults"
    )
    integrity_check: bool = True
    timeout_s: PositiveFloat = Field(600.0, description="wall clock of the test run")


class SWEJobResult(BaseModel):
    status: JobStatus
    tests_passed: int = 0
    tests_total: int = 0
    exit_code: int | None = None
    detail: str = ""
    output_tail: str = ""
