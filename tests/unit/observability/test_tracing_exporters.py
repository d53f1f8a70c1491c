"""``run.tracing``'s exporters in a process of their own (a process has one tracer provider):
OTLP/HTTP to a real HTTP server that decodes what it receives with the OTLP protobuf types, and
the file exporter's one JSON span a line. Spans are made by the broker's own publish path."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ROOT = Path(__file__).resolve().parents[3]

# A role process in small: its tracing context, one prompt group published and received over
# the in-memory plane (the broker's publish and receipt spans), then the process ends.
ROLE = textwrap.dedent(
    """
    import asyncio, json, sys
    from dockyard.broker.memory import MemoryPlane
    from dockyard.broker.typed import MessagePlane
    from dockyard.config.sections.run import TracingConfig
    from dockyard.schemas import PromptGroup
    from dockyard.observability.tracing import tracing
    from tests.integration.roles.factories import prompt_group

    async def main():
        async with MemoryPlane() as plane:
            messages = MessagePlane(plane, stage="rollout")
            await messages.publish(prompt_group("g-otlp"))
            await messages.fetch(plane.names.prompt_consumer, PromptGroup, timeout_s=5)

    with tracing(TracingConfig.model_validate(json.loads(sys.argv[1])), role="rollout",
                 instance="w9"):
        asyncio.run(main())
    """
)


def _role(config: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", ROLE, json.dumps(config)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    received: list[tuple[str, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received
    finally:
        server.shutdown()
        server.server_close()


def test_otlp_sends_the_roles_spans_to_the_collector(collector) -> None:  # type: ignore[no-untyped-def]
    endpoint, received = collector
    _role({"exporter": "otlp", "endpoint": endpoint})
    assert received and all(path == "/v1/traces" for path, _ in received)
    names, services = set(), set()
    for _, body in received:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            services.add((attributes["service.name"], attributes["service.instance.id"]))
            for scope in resource_spans.scope_spans:
                names.update(span.name for span in scope.spans)
    assert names == {"publish PromptGroup", "receive PromptGroup"}
    assert services == {("dockyard-rollout", "w9")}


def test_the_file_exporter_writes_one_json_span_a_line(tmp_path: Path) -> None:
    _role({"exporter": "file", "directory": str(tmp_path / "spans")})
    [path] = (tmp_path / "spans").iterdir()
    assert path.name == "spans-rollout-w9.jsonl"
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    assert [s["name"] for s in spans] == ["publish PromptGroup", "receive PromptGroup"]
    publish, receive = spans
    assert receive["parent_id"] == publish["context"]["span_id"]
    assert receive["context"]["trace_id"] == publish["context"]["trace_id"]
    assert {s["attributes"]["dockyard.group_id"] for s in spans} == {"g-otlp"}
