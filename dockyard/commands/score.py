"""``dockyard score --config PATH [--env NAME] [overrides]``: one scorer of the shared pool."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket

from dockyard.commands._cli import CommandRegistrar, add_config_arguments
from dockyard.commands._common import add_status_argument, load_role_config, on_shutdown_signals
from dockyard.commands._roles import (
    build_scorer,
    metrics_endpoint,
    record_metrics_port,
    refuse_in_memory_plane,
    starting_status,
)


async def _serve(args: argparse.Namespace) -> int:
    from dockyard.broker.factory import create_data_plane
    from dockyard.broker.heartbeats import publishing_heartbeats
    from dockyard.observability.tracing import tracing

    config = load_role_config(args)
    refuse_in_memory_plane(config, "score")
    scorer_id = args.scorer_id or f"{socket.gethostname()}-{os.getpid()}"
    # ready once it takes rollouts
    status = starting_status(args.status_dir, "scorer", scorer_id, "loading the tokenizer")
    plane = create_data_plane(config.data_plane, client_name=f"scorer-{scorer_id}")
    with (
        metrics_endpoint(config) as metrics,
        tracing(config.run.tracing, role="scorer", instance=scorer_id),
    ):
        record_metrics_port(metrics, status)
        async with plane:
            scorer = build_scorer(
                config, plane, scorer_id=scorer_id, status=status, only_env=args.env
            )
            on_shutdown_signals(scorer.stop)
            async with publishing_heartbeats(plane, status, scorer.messages):
                await scorer.run()
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add("score", help="Run a scorer: rollouts in, scored rollouts out")
    add_config_arguments(parser)
    parser.add_argument(
        "--env",
        default=None,
        help="serve only this environment; groups of any other are dead-lettered "
        "(wrong_environment): use it only when the whole run has this one environment",
    )
    parser.add_argument("--scorer-id", default=None, help="default: host-pid")
    add_status_argument(parser)
    parser.set_defaults(handler=lambda args: asyncio.run(_serve(args)))
