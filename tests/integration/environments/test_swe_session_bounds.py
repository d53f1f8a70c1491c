"""Episode sessions of the sandbox service are bounded like jobs (issue 41): a session step takes
one of the ``--max-jobs`` slots (three session calls once ran at once under ``--max-jobs 2``),
and a client that stalls mid-request is dropped after the service's I/O timeout."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from swe_repo import make_calc

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.swe.policy import RepoPolicy, ServicePolicy
from dockyard.environments.swe.protocol import SESSION_CALL_PATH, SESSIONS_PATH
from dockyard.environments.swe.service import SandboxHTTPServer, SWEJobRunner


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxHTTPServer]:
    repos = make_calc(tmp_path_factory.mktemp("repos"))
    policy = ServicePolicy(repos={"calc": RepoPolicy(framework="unittest")})
    runner = SWEJobRunner(repos, SandboxLimits(wall_time_s=60, cpu_time_s=30), policy)
    served = SandboxHTTPServer(("127.0.0.1", 0), runner, max_jobs=1)
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    yield served
    served.shutdown()
    served.server_close()
    thread.join(timeout=30)


def test_a_session_call_waits_for_a_job_slot(server: SandboxHTTPServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        opened = client.post(SESSIONS_PATH, json={"repo": "calc"})
        assert opened.status_code == 200, opened.text
        session_id = opened.json()["session_id"]
        answers: list[httpx.Response] = []
        body = {"session_id": session_id, "name": "bash", "arguments": {"command": "echo hi"}}
        caller = threading.Thread(
            target=lambda: answers.append(client.post(SESSION_CALL_PATH, json=body))
        )
        # The only slot is held (by a job, as far as the service knows): the call must wait.
        with server.job_slots:
            caller.start()
            caller.join(timeout=2.0)
            assert caller.is_alive(), "the session call ran without a job slot"
        caller.join(timeout=60)
        assert [a.status_code for a in answers] == [200]
        assert answers[0].json()["output"].startswith("hi\n")


def test_a_client_that_stalls_mid_request_is_dropped(tmp_path: Path) -> None:
    # Headers promise a body that never comes: the handler's thread must not wait for ever.
    repos = make_calc(tmp_path)
    policy = ServicePolicy(repos={"calc": RepoPolicy(framework="unittest")})
    runner = SWEJobRunner(repos, SandboxLimits(wall_time_s=60, cpu_time_s=30), policy)
    served = SandboxHTTPServer(("127.0.0.1", 0), runner, max_jobs=1, request_io_timeout_s=0.5)
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = served.server_address[:2]
        with socket.create_connection((str(host), port), timeout=30) as client:
            client.sendall(b'POST /v1/jobs HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"repo"')
            # recv returns once the service closes the connection (b"": no answer was owed).
            assert client.recv(4096) == b""
    finally:
        served.shutdown()
        served.server_close()
        thread.join(timeout=30)
