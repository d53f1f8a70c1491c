"""W3C trace context across the roles over a real nats-server (issue #26): a group's prompt,
rollout and scored rollout are published and received in one trace, each span the child of the
publish it came from, and another group is another trace.

The roles' own publish calls are the ones used here (``MessagePlane.publish(..., answers=)``,
as the rollout worker and the scorer call it); the spans are read back from the SDK's in-memory
exporter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.trace_context import HEADER_TRACEPARENT
from dockyard.broker.typed import MessagePlane
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.consumers.score_conversion import to_scored_rollout
from dockyard.environments.registry import build_environment
from dockyard.schemas import PromptGroup, Rollout, ScoredRollout
from tests.integration.roles.factories import TOKENIZER, prompt_group, rollout

# W3C Trace Context, version 00: version-traceid-parentid-flags.
TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-(?P<flags>[0-9a-f]{2})$")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the process's first SDK provider
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    try:
        yield exporter
    finally:
        processor.shutdown()  # stops exporting into this test's exporter


async def _one_path_per_group(config: DataPlaneConfig, groups: list[str]) -> list[str]:
    """Dispatcher -> rollout worker -> scorer -> trainer, through the plane; the traceparent
    headers the stored rollouts carry."""
    from dockyard.consumers.score_conversion import to_scoring_group

    async with JetStreamPlane(config) as plane:
        names = plane.names
        dispatcher = MessagePlane(plane, stage="dispatcher")
        await dispatcher.publish_many([prompt_group(g) for g in groups])

        worker = MessagePlane(plane, stage="rollout")
        prompts = await worker.fetch(names.prompt_consumer, PromptGroup, batch=len(groups))
        made = [rollout(p.message, ["46", "45"]) for p in prompts]
        await worker.publish_many(made, answers=[p.delivery for p in prompts])
        for item in prompts:
            await item.ack()

        scorer = MessagePlane(plane, stage="scorer")
        environment = build_environment("arithmetic")
        for item in await scorer.fetch(names.rollout_consumer, Rollout, batch=len(groups)):
            score = await environment.score(to_scoring_group(item.message, TOKENIZER))
            await scorer.publish(
                to_scored_rollout(item.message, score, "s-test"), answers=item.delivery
            )
            await item.ack()

        trainer = MessagePlane(plane, stage="trainer")
        received = await trainer.fetch(names.scored_consumer, ScoredRollout, batch=len(groups))
        assert sorted(r.message.group_id for r in received) == sorted(groups)
        return [m.headers[HEADER_TRACEPARENT] async for m in plane.replay(names.rollouts)]


def _by_name(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


async def test_a_groups_path_is_one_trace_across_the_roles(
    data_plane_config: DataPlaneConfig, spans: InMemorySpanExporter
) -> None:
    headers = await _one_path_per_group(data_plane_config, ["g-a", "g-b"])
    assert len(headers) == 2
    for header in headers:
        match = TRACEPARENT.match(header)
        assert match and int(match["flags"], 16) & 0x01, header  # well formed, and sampled

    finished = spans.get_finished_spans()
    by_group: dict[str, list[ReadableSpan]] = {}
    for span in finished:
        by_group.setdefault(str(span.attributes["dockyard.group_id"]), []).append(span)
    assert set(by_group) == {"g-a", "g-b"}
    traces = set()
    for group, group_spans in by_group.items():
        named = _by_name(group_spans)
        assert set(named) == {
            "publish PromptGroup",
            "receive PromptGroup",
            "publish Rollout",
            "receive Rollout",
            "publish ScoredRollout",
            "receive ScoredRollout",
        }, group
        # One trace, started by the dispatcher.
        assert len({s.context.trace_id for s in group_spans}) == 1
        assert named["publish PromptGroup"].parent is None
        traces.add(named["publish PromptGroup"].context.trace_id)
        # Each span is the child of the publish its message (or its answered message) came from.
        parent_of = {
            "receive PromptGroup": "publish PromptGroup",
            "publish Rollout": "publish PromptGroup",
            "receive Rollout": "publish Rollout",
            "publish ScoredRollout": "publish Rollout",
            "receive ScoredRollout": "publish ScoredRollout",
        }
        for child, parent in parent_of.items():
            assert named[child].parent.span_id == named[parent].context.span_id, child
        stages = [span.attributes["dockyard.stage"] for span in group_spans]
        assert set(stages) == {"dispatcher", "rollout", "scorer", "trainer"}
        # The stored rollout's header names its own publish span.
        rollout_span = named["publish Rollout"].context
        assert f"-{rollout_span.trace_id:032x}-{rollout_span.span_id:016x}-" in " ".join(headers)
    assert len(traces) == 2  # another group, another trace
