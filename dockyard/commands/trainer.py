"""``dockyard trainer --config PATH --run-dir DIR [overrides]``: dispatcher + trainer."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from dockyard.commands._cli import CliError, CommandRegistrar, add_config_arguments
from dockyard.commands._common import add_status_argument, load_role_config, on_shutdown_signals
from dockyard.commands._roles import (
    EXIT_STARVED,
    build_trainer,
    describe_trainer_summary,
    metrics_endpoint,
    prepare_trainer,
    record_metrics_port,
    refuse_in_memory_plane,
)
from dockyard.utils.private_files import private_dir


async def _serve(args: argparse.Namespace) -> int:
    from dockyard.broker.factory import create_data_plane
    from dockyard.broker.heartbeats import publishing_heartbeats
    from dockyard.consumers.trainer.loop import TrainerStarved
    from dockyard.utils.tracing import tracing

    config = load_role_config(args)
    refuse_in_memory_plane(config, "trainer")
    run_dir = Path(args.run_dir or Path(config.run.output_dir) / config.run.name)
    private_dir(run_dir)  # logs, checkpoints, metrics: its owner's only
    inputs = prepare_trainer(config)  # before any server or model starts
    plane = create_data_plane(config.data_plane, client_name="trainer")
    with (
        metrics_endpoint(config) as metrics,
        tracing(config.run.tracing, role="trainer", instance="0"),
    ):
        async with plane:
            loop = build_trainer(config, inputs, plane, run_dir=run_dir, status_dir=args.status_dir)
            record_metrics_port(metrics, loop.status)
            on_shutdown_signals(loop.stop)
            try:
                async with publishing_heartbeats(plane, loop.status, loop.messages):
                    summary = await loop.run()
            except TrainerStarved as error:
                raise CliError(str(error), exit_code=EXIT_STARVED) from None
    print(describe_trainer_summary(summary))
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "trainer", help="Run the dispatcher and the async-GRPO trainer (one process)"
    )
    add_config_arguments(parser)
    parser.add_argument("--run-dir", default=None, help="default: <run.output_dir>/<run.name>")
    add_status_argument(parser)
    parser.set_defaults(handler=lambda args: asyncio.run(_serve(args)))
