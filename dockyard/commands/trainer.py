"""``dockyard trainer --config PATH --run-dir DIR [overrides]``: dispatcher + trainer.

Under ``torchrun`` (several ranks): rank 0 is the trainer described here, the other ranks hold
shards of the policy and follow it (``dockyard.consumers.trainer.ranks``)::

    torchrun --standalone --nproc_per_node 2 -m dockyard trainer --config C --run-dir D
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from dockyard.commands._cli import CliError, CommandRegistrar, add_config_arguments
from dockyard.commands._common import (
    EXIT_INVALID_CONFIG,
    add_status_argument,
    load_role_config,
    on_shutdown_signals,
)
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

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from dockyard.algorithms.grpo import MasterConfig


def _trainer(args: argparse.Namespace) -> int:
    import torch

    from dockyard.consumers.trainer.ranks import World, join_ranks, leave_ranks, run_follower
    from dockyard.fleet.trainer_ranks import (
        LaunchRefused,
        check_jax_devices,
        check_ranks_can_run,
        check_torchrun_world,
    )

    config = load_role_config(args)
    refuse_in_memory_plane(config, "trainer")
    world = World.from_environment()
    try:
        check_torchrun_world(
            config.cluster,
            world_size=world.size,
            local_world_size=world.local_size,
            cuda_devices=torch.cuda.device_count(),
        )
        check_ranks_can_run(config, world.size)
        check_jax_devices(config)
    except LaunchRefused as refused:
        raise CliError(str(refused), exit_code=EXIT_INVALID_CONFIG) from None
    dtensor = config.policy.dtensor_cfg
    mesh = join_ranks(
        world,
        dtensor.tensor_parallel_size,
        dtensor.context_parallel_size,
        dtensor.expert_parallel_size,
    )
    try:
        if world.rank != 0:
            assert mesh is not None
            # Rank 0 leads the shutdown: it drains, checkpoints (a collective) and says stop.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            run_follower(config, mesh)
            return 0
        return asyncio.run(_serve(args, config, mesh))
    finally:
        leave_ranks()


async def _serve(args: argparse.Namespace, config: MasterConfig, mesh: DeviceMesh | None) -> int:
    from dockyard.broker.factory import create_data_plane
    from dockyard.broker.heartbeats import publishing_heartbeats
    from dockyard.consumers.trainer.loop import TrainerStarved
    from dockyard.observability.tracing import tracing

    run_dir = Path(args.run_dir or Path(config.run.output_dir) / config.run.name)
    private_dir(run_dir)  # logs, checkpoints, metrics: its owner's only
    inputs = prepare_trainer(config)  # before any server or model starts
    plane = create_data_plane(config.data_plane, client_name="trainer")
    with (
        metrics_endpoint(config) as metrics,
        tracing(config.run.tracing, role="trainer", instance="0"),
    ):
        async with plane:
            loop = build_trainer(
                config, inputs, plane, run_dir=run_dir, status_dir=args.status_dir, mesh=mesh
            )
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
        "trainer",
        help="Run the dispatcher and the async-GRPO trainer (under torchrun: rank 0 of several "
        "data-parallel ranks)",
    )
    add_config_arguments(parser)
    parser.add_argument("--run-dir", default=None, help="default: <run.output_dir>/<run.name>")
    add_status_argument(parser)
    parser.set_defaults(handler=_trainer)
