"""``dockyard rollout --config PATH [overrides]``: one rollout worker."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket

from dockyard.commands._cli import CommandRegistrar, add_config_arguments
from dockyard.commands._common import add_status_argument, load_role_config, on_shutdown_signals
from dockyard.commands._roles import (
    build_rollout_worker,
    create_rollout_engine,
    metrics_endpoint,
    prepare_rollout,
    record_metrics_port,
    refuse_in_memory_plane,
    serve_rollout_worker,
    starting_status,
)


async def _serve(args: argparse.Namespace) -> int:
    from dockyard.broker.factory import create_data_plane
    from dockyard.broker.heartbeats import publishing_heartbeats
    from dockyard.observability.tracing import tracing

    config = load_role_config(args)
    refuse_in_memory_plane(config, "rollout")
    params = prepare_rollout(config)
    worker_id = args.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    # A real model's engine takes minutes to load: say so, or the trainer cannot tell this
    # worker from one that is up and silent.
    status = starting_status(
        args.status_dir,
        "rollout",
        worker_id,
        f"loading the {config.policy.generation.backend} engine",
    )
    # Bound before the engine loads: a port in use is refused at once, not minutes later.
    with (
        metrics_endpoint(config) as metrics,
        tracing(config.run.tracing, role="rollout", instance=worker_id),
    ):
        record_metrics_port(metrics, status)
        engine = create_rollout_engine(config)
        plane = create_data_plane(config.data_plane, client_name=f"rollout-{worker_id}")
        async with plane:
            worker = build_rollout_worker(
                config, plane, engine, params, worker_id=worker_id, status=status
            )
            on_shutdown_signals(worker.stop)
            async with publishing_heartbeats(plane, status, worker.messages):
                await serve_rollout_worker(worker)
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "rollout", help="Run a rollout worker: prompt groups in, rollouts out, weights followed"
    )
    add_config_arguments(parser)
    parser.add_argument("--worker-id", default=None, help="default: host-pid")
    add_status_argument(parser)
    parser.set_defaults(handler=lambda args: asyncio.run(_serve(args)))
