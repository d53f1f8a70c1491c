"""The SWE sandbox service behind ``dockyard sandbox serve``: stdlib HTTP, one thread per request.

Each job gets an isolated temporary checkout (a copy of ``--repos/<repo>`` inside a sandbox
session, i.e. its own directory and, as root, its own uid), applies the patch with ``git apply``
*inside the sandbox*, runs the test command there under the same limits as the ``code``
environment, and compares hashes of the protected (test / runner) files before and after.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pydantic import ValidationError

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.sandbox import Sandbox, SandboxResult, SandboxSession
from dockyard.environments.swe.integrity import (
    DEFAULT_PROTECTED_PATHS,
    hash_protected_files,
    integrity_problems,
    touched_paths,
)
from dockyard.environments.swe.protocol import (
    HEALTH_PATH,
    JOBS_PATH,
    PYTHON_PLACEHOLDER,
    SWEJobRequest,
    SWEJobResult,
)
from dockyard.environments.swe.test_report import parse_test_counts
from dockyard.utils.logging import get_logger

logger = get_logger(__name__)

MAX_REQUEST_BYTES = 16 * 1024 * 1024
_OUTPUT_TAIL_CHARS = 2000
_CHECKOUT = "repo"


class SWEJobRunner:
    """Runs jobs against the snapshots in ``repos_dir``; safe to call from many threads."""

    def __init__(self, repos_dir: Path, limits: SandboxLimits) -> None:
        self.repos_dir = repos_dir.resolve()
        self.limits = limits
        self.sandbox = Sandbox(limits)

    def repositories(self) -> list[str]:
        return sorted(entry.name for entry in self.repos_dir.iterdir() if entry.is_dir())

    def run(self, request: SWEJobRequest) -> SWEJobResult:
        snapshot = self.repos_dir / request.repo
        if "/" in request.repo or request.repo.startswith(".") or not snapshot.is_dir():
            return SWEJobResult(status="patch_failed", detail=f"unknown repo {request.repo!r}")
        patterns = [*DEFAULT_PROTECTED_PATHS, *request.protected_paths]
        if not touched_paths(request.patch):
            return SWEJobResult(status="patch_failed", detail="the patch touches no file")
        problems = integrity_problems(request.patch, patterns)
        if request.integrity_check and problems:
            return SWEJobResult(status="integrity_violation", detail="; ".join(problems))
        deadline = time.monotonic() + request.timeout_s
        with self.sandbox.session() as session:
            checkout = session.directory / _CHECKOUT
            shutil.copytree(snapshot, checkout, symlinks=True)
            session.give_to_sandbox(checkout)
            before = hash_protected_files(checkout, patterns)
            applied = self._apply(session, checkout, request.patch, deadline)
            if not applied.ok:
                return SWEJobResult(
                    status="timeout" if applied.timed_out else "patch_failed",
                    exit_code=applied.returncode,
                    detail="git apply failed",
                    output_tail=_tail(applied),
                )
            tests = self._run_tests(session, checkout, request.test_command, deadline)
            after = hash_protected_files(checkout, patterns)
        if request.integrity_check and before != after:
            changed = sorted(set(before.items()) ^ set(after.items()))
            names = sorted({path for path, _ in changed})
            return SWEJobResult(
                status="integrity_violation",
                detail=f"protected files changed during the run: {', '.join(names)}",
            )
        return self._result(tests)

    def _apply(
        self, session: SandboxSession, checkout: Path, patch: str, deadline: float
    ) -> SandboxResult:
        patch_file = session.write_file("change.diff", patch.encode())
        git = shutil.which("git")
        if git is None:
            argv = ["patch", "-p1", "--batch", "--forward", "-i", str(patch_file)]
        else:
            argv = [git, "apply", "--whitespace=nowarn", str(patch_file)]
        # GIT_CEILING_DIRECTORIES: never discover (and obey) a repository above the checkout.
        return session.run(
            argv,
            cwd=checkout,
            env={"GIT_CEILING_DIRECTORIES": str(session.directory)},
            deadline=deadline,
        )

    def _run_tests(
        self, session: SandboxSession, checkout: Path, command: list[str], deadline: float
    ) -> SandboxResult:
        argv = [self.sandbox.python if arg == PYTHON_PLACEHOLDER else arg for arg in command]
        return session.run(argv, cwd=checkout, deadline=deadline)

    @staticmethod
    def _result(tests: SandboxResult) -> SWEJobResult:
        output = (tests.stdout + b"\n" + tests.stderr).decode(errors="replace")
        counts = parse_test_counts(output)
        status = "passed" if tests.returncode == 0 else "failed"
        if tests.timed_out:
            status = "timeout"
        return SWEJobResult(
            status=status,
            tests_passed=counts.passed if counts else int(status == "passed"),
            tests_total=counts.total if counts else 1,
            exit_code=tests.returncode,
            detail="output limit exceeded" if tests.output_limit_exceeded else "",
            output_tail=_tail(tests),
        )


def _tail(result: SandboxResult) -> str:
    text = (result.stdout + b"\n" + result.stderr).decode(errors="replace").strip()
    return text[-_OUTPUT_TAIL_CHARS:]


class _Handler(BaseHTTPRequestHandler):
    server: SandboxHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("http", client=self.client_address[0], line=format % args)

    def _send_json(self, status: HTTPStatus, payload: dict[str, object]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path != HEALTH_PATH:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})
            return
        self._send_json(HTTPStatus.OK, {"status": "ok", "repos": self.server.runner.repositories()})

    def do_POST(self) -> None:
        if self.path != JOBS_PATH:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_REQUEST_BYTES:
            self.close_connection = True  # the unread body must not be parsed as a request
            self._send_json(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                {"error": f"body must be 1..{MAX_REQUEST_BYTES} bytes"},
            )
            return
        try:
            request = SWEJobRequest.model_validate_json(self.rfile.read(length))
        except ValidationError as error:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(error)})
            return
        with self.server.job_slots:
            started = time.monotonic()
            result = self.server.runner.run(request)
        logger.info(
            "job done",
            repo=request.repo,
            status=result.status,
            passed=result.tests_passed,
            total=result.tests_total,
            seconds=round(time.monotonic() - started, 3),
        )
        self._send_json(HTTPStatus.OK, result.model_dump(mode="json"))


class SandboxHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Jobs hold their connection open while they run; queue connections beyond max_jobs.
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], runner: SWEJobRunner, max_jobs: int) -> None:
        super().__init__(address, _Handler)
        self.runner = runner
        self.job_slots = threading.BoundedSemaphore(max_jobs)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"
