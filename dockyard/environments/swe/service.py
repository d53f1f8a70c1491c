"""The SWE sandbox service behind ``dockyard sandbox serve``: stdlib HTTP, one thread per request.

A job is a patch against a repository snapshot under ``--repos``; everything else (framework,
test paths, protected paths) is the service's :class:`ServicePolicy`. Each job gets a throwaway
checkout inside a sandbox session (its own directory and, as root, its own uid) and:

1. applies the patch with ``git apply`` *inside the sandbox*;
2. compares the protected (test / runner) files of the result with the pristine snapshot's:
   whatever path ``git apply`` really touched counts, not what the diff headers say;
3. plants canary tests that must fail (:mod:`.canaries`: one plain, one beside each target test
   module with its imports), and makes the protected files root-owned and their directories
   sealed or sticky, so the run cannot change, swap or delete them;
4. runs the tests with :mod:`._suite_runner` (copied in from outside the checkout, ``python -I``)
   which records each test's outcome and writes the report on a pipe only it inherited (no file
   the run could forge or swap); the job's result counts the tests collected from the pristine
   snapshot at start-up, by id, from that report, never from output.

Nothing the run could have written is opened as it stands: protected files are hashed through
:mod:`.untrusted_files` (no symlink followed, no FIFO, socket or device opened, a size cap).

The scoring threat model in docs/operations.md says what this defends against and what not.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import shutil
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.reward_hack_screen import Evidence, describe, screen_files
from dockyard.environments.sandbox import (
    Sandbox,
    SandboxResult,
    SandboxSession,
    SandboxUnavailableError,
)
from dockyard.environments.sandbox.results_pipe import ResultsPipe
from dockyard.environments.swe import canaries
from dockyard.environments.swe.auth import TOKEN_ENV, TokenError, is_loopback
from dockyard.environments.swe.integrity import (
    added_lines,
    escapes_repository,
    hash_protected_files,
    lock_protected,
    protected_changes,
    touched_paths,
)
from dockyard.environments.swe.policy import RepoPolicy, ServicePolicy
from dockyard.environments.swe.protocol import (
    AUTH_HEADER,
    BAD_ARGUMENTS,
    HEALTH_PATH,
    JOBS_PATH,
    POLICY_FIELDS,
    SESSION_CALL_PATH,
    SESSION_CLOSE_PATH,
    SESSION_DIFF_PATH,
    SESSIONS_PATH,
    JobStatus,
    SessionOpen,
    SessionOpened,
    SessionRequest,
    SWEJobRequest,
    SWEJobResult,
)
from dockyard.environments.swe.sessions import SESSION_TOOLS, EpisodeCheckouts, SessionError
from dockyard.environments.swe.test_report import (
    ReportError,
    Verdict,
    judge,
    read_outcomes,
    read_report,
    unexpected_xfails,
)
from dockyard.environments.swe.untrusted_files import UntrustedFileError, read_regular_file
from dockyard.environments.tools.toolbox import ToolArgumentError
from dockyard.utils.logging import get_logger

logger = get_logger(__name__)

MAX_REQUEST_BYTES = 16 * 1024 * 1024
_OUTPUT_TAIL_CHARS = 2000
_SCREENED_BYTES = 1024 * 1024  # of each changed Python file; beyond it, not screened
# A client must finish the TLS handshake within this; a stalled one costs a thread, not the service.
_TLS_HANDSHAKE_TIMEOUT_S = 10.0
# Each read of a request (and write of an answer) must progress within this, and an idle
# keep-alive connection is closed after it: a client that stalls mid-request holds a thread for
# at most this long (a job's own run is no socket operation: it is bounded by its deadline).
REQUEST_IO_TIMEOUT_S = 120.0
_CHECKOUT = "repo"
_SESSION_PATHS = (SESSIONS_PATH, SESSION_CALL_PATH, SESSION_DIFF_PATH, SESSION_CLOSE_PATH)
_RUNNER = Path(__file__).with_name("_suite_runner.py")


@dataclass(frozen=True)
class RepoBaseline:
    """What a repository's pristine snapshot looks like to the scorer; computed at start-up."""

    policy: RepoPolicy
    protected: Mapping[str, str]  # sha256 of every protected file
    tests: frozenset[str]  # test ids the runner collects
    # Tests the snapshot marks as expected to fail: only their "xfailed" counts as passed.
    expected_failures: frozenset[str] = frozenset()
    # Target test modules that get a canary of their own (those whose imports import alone).
    canary_modules: tuple[str, ...] = ()


class SWEJobRunner:
    """Runs jobs against the snapshots in ``repos_dir``; safe to call from many threads."""

    def __init__(self, repos_dir: Path, limits: SandboxLimits, policy: ServicePolicy) -> None:
        self.repos_dir = repos_dir.resolve()
        self.limits = limits
        self.sandbox = Sandbox(limits)
        git = shutil.which("git")
        if git is None:
            raise SandboxUnavailableError("git is needed to apply patches; install git")
        self.git = git
        unknown = sorted(set(policy.repos) - set(self.repositories()))
        if unknown:
            raise SandboxUnavailableError(f"the policy names repos not under --repos: {unknown}")
        self.baselines = {
            repo: self._baseline(repo, policy.for_repo(repo)) for repo in self.repositories()
        }

    def repositories(self) -> list[str]:
        return sorted(
            entry.name
            for entry in self.repos_dir.iterdir()
            if entry.is_dir() and not entry.name.startswith(".")
        )

    def _baseline(self, repo: str, policy: RepoPolicy) -> RepoBaseline:
        snapshot = self.repos_dir / repo
        for path in policy.test_paths:
            if not (snapshot / path).is_dir():
                raise SandboxUnavailableError(f"repo {repo}: test path {path!r} is no directory")
        with self.sandbox.session() as session:
            checkout = self._checkout(session, snapshot)
            planted = canaries.plant(checkout, policy.test_paths[0], ())
            nonce = planted.nonce
            run = self._run_suite(session, checkout, policy, "collect", None)
            try:
                collected = read_outcomes(run.results)
            except ReportError as error:
                raise SandboxUnavailableError(
                    f"repo {repo}: collecting its tests failed: {error}; {_tail(run)}"
                ) from None
            for canary_file in planted.paths:
                canary_file.unlink()
            modules = self._collectable_canary_modules(
                session, checkout, policy, [t for t in collected if nonce not in t]
            )
        broken = sorted(test for test, outcome in collected.items() if outcome == "failed")
        if broken:
            # Tests that cannot be collected from the snapshot could never be counted.
            raise SandboxUnavailableError(f"repo {repo}: tests fail to collect: {broken}")
        tests = frozenset(test for test in collected if nonce not in test)
        if len(tests) == len(collected) or not tests:
            raise SandboxUnavailableError(
                f"repo {repo}: {'the canary' if tests else 'no test'} is collected from "
                f"{list(policy.test_paths)} ({policy.framework}); {_tail(run)}"
            )
        protected = hash_protected_files(snapshot, policy.protected_patterns())
        logger.info("repo baseline", repo=repo, tests=len(tests), protected_files=len(protected))
        xfail = frozenset(test for test in tests if collected[test] == "collected_xfail")
        return RepoBaseline(
            policy=policy,
            protected=protected,
            tests=tests,
            expected_failures=xfail,
            canary_modules=modules,
        )

    def _collectable_canary_modules(
        self, session: SandboxSession, checkout: Path, policy: RepoPolicy, tests: list[str]
    ) -> tuple[str, ...]:
        """The target test modules whose canary (their imports, a failing test) collects:
        one whose imports do not import on their own gets none (logged), not a refusal."""
        modules = canaries.test_module_files(tests, checkout)
        planted = canaries.plant(checkout, policy.test_paths[0], modules)
        run = self._run_suite(session, checkout, policy, "collect", None)
        try:
            collected = read_outcomes(run.results)
        except ReportError:
            collected = {}
        for path in planted.paths:
            path.unlink()
        kept = []
        for index, module in enumerate(modules):
            name = f"{planted.nonce}_{index}"
            outcomes = [outcome for test, outcome in collected.items() if name in test]
            if outcomes and "failed" not in outcomes:
                kept.append(module)
            else:
                logger.warning("no canary beside a test module", module=module)
        return tuple(kept)

    def run(self, request: SWEJobRequest) -> SWEJobResult:
        baseline = self.baselines.get(request.repo)
        if baseline is None:
            return SWEJobResult(status="patch_failed", detail=f"unknown repo {request.repo!r}")
        deadline = time.monotonic() + request.timeout_s
        with self.sandbox.session() as session:
            checkout = self._checkout(session, self.repos_dir / request.repo)
            applied = self._apply(session, checkout, request.patch, deadline)
            if not applied.ok:
                return SWEJobResult(
                    status="timeout" if applied.timed_out else "patch_failed",
                    exit_code=applied.returncode,
                    detail="git apply failed",
                    output_tail=_tail(applied),
                )
            if touched := _protected_changes(checkout, baseline):
                return SWEJobResult(
                    status="integrity_violation",
                    detail=f"the patch changes test or test-runner files: {', '.join(touched)}",
                )
            if baseline.policy.screen_reward_hacks and (
                evidence := _screen_patch(checkout, request.patch)
            ):
                logger.warning("suspected reward hack", repo=request.repo, evidence=len(evidence))
                return SWEJobResult(
                    status="suspected_reward_hack",
                    tests_total=len(baseline.tests),
                    detail=describe(evidence),
                    evidence=[str(item) for item in evidence],
                )
            planted = canaries.plant(
                checkout, baseline.policy.test_paths[0], baseline.canary_modules
            )
            if session.identity is not None:
                lock_protected(
                    checkout,
                    [
                        *baseline.protected,
                        *(str(path.relative_to(checkout)) for path in planted.paths),
                    ],
                    sealed=baseline.policy.test_paths,
                )
            tests = self._run_suite(session, checkout, baseline.policy, "run", deadline)
            # Without root the run could have put a directory there: then it stays, and the
            # check below finds a protected path the snapshot does not have.
            for path in planted.paths:
                with contextlib.suppress(OSError):
                    path.unlink()
            changed = _protected_changes(checkout, baseline)
            signals: list[str] = []
            try:
                if tests.results_overflowed:
                    raise ReportError("the test report is over its size cap")
                report = read_report(tests.results)
                failures = baseline.expected_failures
                verdict = judge(
                    report.outcomes, baseline.tests, planted.nonce, failures, planted.count
                )
                signals = report.signals + unexpected_xfails(
                    report.outcomes, baseline.tests, failures
                )
                report_problem = ""
            except ReportError as error:
                verdict, report_problem = Verdict(0, len(baseline.tests)), str(error)
        if changed:
            return SWEJobResult(
                status="integrity_violation",
                detail=f"protected files changed during the run: {', '.join(changed)}",
            )
        if signals and baseline.policy.screen_reward_hacks and not verdict.tampered:
            # What the runner caught the code doing (the static screen missed it): the tests
            # it fooled already count as failed; this names it, for the run's hack metrics.
            logger.warning("suspected reward hack (run)", repo=request.repo, signals=len(signals))
            return SWEJobResult(
                status="suspected_reward_hack",
                tests_total=len(baseline.tests),
                detail="suspected reward hack: " + "; ".join(signals)[:1500],
                evidence=signals,
                output_tail=_tail(tests),
            )
        return _result(tests, verdict, report_problem)

    def _checkout(self, session: SandboxSession, snapshot: Path) -> Path:
        checkout = session.directory / _CHECKOUT
        shutil.copytree(snapshot, checkout, symlinks=True)
        session.give_to_sandbox(checkout)
        return checkout

    def _apply(
        self, session: SandboxSession, checkout: Path, patch: str, deadline: float
    ) -> SandboxResult:
        patch_file = session.write_file("change.diff", patch.encode())
        # GIT_CEILING_DIRECTORIES: never discover (and obey) a repository above the checkout.
        return session.run(
            [self.git, "apply", "--whitespace=nowarn", str(patch_file)],
            cwd=checkout,
            env={"GIT_CEILING_DIRECTORIES": str(session.directory)},
            deadline=deadline,
        )

    def _run_suite(
        self,
        session: SandboxSession,
        checkout: Path,
        policy: RepoPolicy,
        mode: str,
        deadline: float | None,
    ) -> SandboxResult:
        # Outside the checkout, written after the patch was applied: nothing the patch brought
        # can replace it, and nothing of the run's uid ran in between.
        runner = session.write_file("runner/_suite_runner.py", _RUNNER.read_bytes(), mode=0o444)
        results = ResultsPipe.open()
        argv = [
            self.sandbox.python,
            "-I",  # ignores PYTHONDONTWRITEBYTECODE with the rest of PYTHON*, hence -B
            "-B",
            str(runner),
            "--framework",
            policy.framework,
            "--mode",
            mode,
            "--checkout",
            str(checkout),
            "--results-fd",
            str(results.write_fd),
            "--",
            *policy.test_paths,
        ]
        # No entry-point plugins: only what the operator's pristine config loads.
        env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        return session.run(argv, cwd=checkout, env=env, deadline=deadline, results=results)


def _screen_patch(checkout: Path, patch: str) -> list[Evidence]:
    """The reward-hack screen over the lines the applied patch added to Python files (the files
    read as git apply left them: no symlink followed, capped)."""
    sources: dict[str, str] = {}
    for path in sorted(touched_paths(patch)):
        if not path.endswith(".py") or escapes_repository(path):
            continue
        try:
            data = read_regular_file(checkout / path, _SCREENED_BYTES)
        except UntrustedFileError:  # deleted, a link, or too big to screen
            continue
        sources[path] = data.decode("utf-8", errors="replace")
    return screen_files(sources, added_lines(patch))


def _protected_changes(checkout: Path, baseline: RepoBaseline) -> list[str]:
    """Protected files of ``checkout`` that differ from (or are missing in) the snapshot."""
    current = hash_protected_files(checkout, baseline.policy.protected_patterns())
    return protected_changes(baseline.protected, current)


def _result(tests: SandboxResult, verdict: Verdict, report_problem: str) -> SWEJobResult:
    details = [report_problem] if report_problem else []
    status: JobStatus
    if tests.output_limit_exceeded:
        details.append("output limit exceeded")
    if verdict.tampered:
        status = "integrity_violation"
        details.insert(0, verdict.tampered)
    elif tests.timed_out:
        status = "timeout"
    else:
        status = "passed" if verdict.all_passed and not details else "failed"
    return SWEJobResult(
        status=status,
        tests_passed=verdict.passed,
        tests_total=verdict.total,
        exit_code=tests.returncode,
        detail="; ".join(details),
        output_tail=_tail(tests),
    )


def _tail(result: SandboxResult) -> str:
    text = (result.stdout + b"\n" + result.stderr).decode(errors="replace").strip()
    return text[-_OUTPUT_TAIL_CHARS:]


class _Handler(BaseHTTPRequestHandler):
    server: SandboxHTTPServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Per connection (the class attribute StreamRequestHandler reads is one for all).
        self.connection.settimeout(self.server.request_io_timeout_s)

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("http", client=self.client_address[0], line=format % args)

    def _send_json(self, status: HTTPStatus, payload: dict[str, object]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        """Whether the request carries the service's token; answers 401 if it does not."""
        token = self.server.token
        if token is None:
            return True
        scheme, _, presented = (self.headers.get(AUTH_HEADER) or "").partition(" ")
        # compare_digest: the time taken does not tell how much of a guess was right.
        if scheme.lower() == "bearer" and hmac.compare_digest(presented.encode(), token):
            return True
        self.close_connection = True  # an unread body must not be parsed as a request
        body = json.dumps({"error": "missing or wrong bearer token"}).encode()
        self.send_response(HTTPStatus.UNAUTHORIZED)
        self.send_header("WWW-Authenticate", 'Bearer realm="dockyard-sandbox"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        logger.warning("request refused: no valid token", client=self.client_address[0])
        return False

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path != HEALTH_PATH:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})
            return
        self._send_json(HTTPStatus.OK, {"status": "ok", "repos": self.server.runner.repositories()})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        if self.path != JOBS_PATH and self.path not in _SESSION_PATHS:
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
            body = self.rfile.read(length)
        except TimeoutError:
            self.close_connection = True
            logger.warning("request body stalled: closed", client=self.client_address[0])
            return
        try:
            fields = json.loads(body)
        except ValueError as error:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": f"body is not JSON: {error}"})
            return
        if self.path in _SESSION_PATHS:
            self._session_request(fields)
            return
        policy = sorted(set(fields) & set(POLICY_FIELDS)) if isinstance(fields, dict) else []
        if policy:
            refusal = f"{', '.join(policy)}: set by the service's --policy, not by a request"
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": refusal})
            return
        try:
            request = SWEJobRequest.model_validate(fields)
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

    def _session_request(self, fields: Any) -> None:
        """An episode session's request (multi-turn SWE, :mod:`.sessions`)."""
        checkouts = self.server.checkouts
        try:
            # Every session step runs sandboxed processes: it takes a job slot as a job does,
            # so --max-jobs bounds what runs at once, sessions included.
            if self.path == SESSIONS_PATH:
                repo = SessionOpen.model_validate(fields).repo
                with self.server.job_slots:
                    session_id = checkouts.open(repo, self.server.runner.repositories())
                opened = SessionOpened(session_id=session_id, tools=list(SESSION_TOOLS))
                self._send_json(HTTPStatus.OK, opened.model_dump())
                return
            request = SessionRequest.model_validate(fields)
            if self.path == SESSION_CALL_PATH:
                if request.name is None:
                    raise ToolArgumentError("a call names its tool")
                with self.server.job_slots:
                    output = checkouts.call(request.session_id, request.name, request.arguments)
                self._send_json(HTTPStatus.OK, {"output": output})
            elif self.path == SESSION_DIFF_PATH:
                with self.server.job_slots:
                    patch = checkouts.diff(request.session_id)
                self._send_json(HTTPStatus.OK, {"patch": patch})
            else:
                checkouts.close(request.session_id)
                self._send_json(HTTPStatus.OK, {})
        except ValidationError as error:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(error)})
        except ToolArgumentError as error:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(error), "kind": BAD_ARGUMENTS})
        except SessionError as error:
            answer: dict[str, object] = {"error": str(error)}
            if error.kind:
                answer["kind"] = error.kind
            self._send_json(HTTPStatus(error.status), answer)


class SandboxHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Jobs hold their connection open while they run; queue connections beyond max_jobs.
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        runner: SWEJobRunner,
        max_jobs: int,
        token: bytes | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        allow_plaintext: bool = False,
        request_io_timeout_s: float = REQUEST_IO_TIMEOUT_S,
    ) -> None:
        mutual_tls = tls is not None and tls.verify_mode == ssl.CERT_REQUIRED
        if not is_loopback(address[0]):
            if token is None and not mutual_tls:
                raise TokenError(
                    f"refusing to listen on {address[0]} without a token: beyond loopback anyone "
                    f"who reaches the port could run jobs (give --token-file or ${TOKEN_ENV}, or "
                    "require client certificates with --tls-client-ca)"
                )
            if tls is None and not allow_plaintext:
                raise TokenError(
                    f"refusing to listen on {address[0]} over plain HTTP: the token and the "
                    "patches would cross the network in clear (give --tls-cert and --tls-key, "
                    "or --allow-plaintext on a private network)"
                )
        super().__init__(address, _Handler)
        self.runner = runner
        self.checkouts = EpisodeCheckouts(runner.sandbox, runner.repos_dir, runner.git)
        self.job_slots = threading.BoundedSemaphore(max_jobs)
        self.request_io_timeout_s = request_io_timeout_s
        self.token = token
        self.tls = tls
        if tls is not None:
            # The handshake runs in the request's thread (finish_request), not in the accept
            # loop, so a client that stalls it cannot stop other clients from connecting.
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )

    def server_close(self) -> None:
        self.checkouts.close_all()  # the episodes' sandboxes go with the service
        super().server_close()

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is not None:
            request.settimeout(_TLS_HANDSHAKE_TIMEOUT_S)
            try:
                request.do_handshake()
            except (ssl.SSLError, OSError) as error:
                # e.g. no client certificate under --tls-client-ca, or plain HTTP to a TLS port
                logger.warning("tls handshake refused", client=client_address[0], error=str(error))
                return
            request.settimeout(None)
        super().finish_request(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if isinstance(host, bytes):  # typeshed allows a bytes host; AF_INET gives str
            host = host.decode()
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host}:{port}"
