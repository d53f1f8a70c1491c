"""This process's OpenTelemetry tracer provider, from ``run.tracing`` (docs/operations.md,
"Traces").

The spans themselves are made where messages are published and received
(:mod:`dockyard.broker.trace_context`); this module only decides where they go. With
``exporter: off`` no provider is installed: the API's tracer records nothing, and a
``traceparent`` that arrives with a message is passed on unchanged.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)

from dockyard.utils.logging import get_logger

if TYPE_CHECKING:
    from dockyard.config.sections.run import TracingConfig

log = get_logger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def span_file(directory: Path, role: str, instance: str) -> Path:
    """Where one role process writes its spans with ``exporter: file``."""
    return directory / f"spans-{_UNSAFE.sub('_', role)}-{_UNSAFE.sub('_', instance)}.jsonl"


@contextlib.contextmanager
def tracing(config: TracingConfig, *, role: str, instance: str) -> Iterator[None]:
    """Install this process's tracer provider while the block runs; its spans are flushed and
    the exporter closed when the block ends (however it ends)."""
    if config.exporter == "off":
        yield
        return
    resource = Resource.create({SERVICE_NAME: f"dockyard-{role}", SERVICE_INSTANCE_ID: instance})
    provider = TracerProvider(resource=resource)
    with contextlib.ExitStack() as stack:
        if config.exporter == "file":
            assert config.directory is not None  # TracingConfig refuses file without one
            directory = Path(config.directory)
            directory.mkdir(parents=True, exist_ok=True)
            path = span_file(directory, role, instance)
            out = stack.enter_context(path.open("a", encoding="utf-8", buffering=1))
            # One span a line, written as it ends: a role that is killed loses none it ended.
            exporter = ConsoleSpanExporter(
                out=out, formatter=lambda s: s.to_json(indent=None) + "\n"
            )
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            log.info("tracing.to_file", path=str(path))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(config.endpoint)))
            log.info("tracing.to_otlp", endpoint=config.endpoint or "(from the environment)")
        # The global provider can be set once per process; the broker's tracer reads it.
        trace.set_tracer_provider(provider)
        try:
            yield
        finally:
            provider.shutdown()
