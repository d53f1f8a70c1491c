"""``dockyard trainer --config PATH --run-dir DIR [overrides]``: dispatcher + trainer."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from dockyard.cli import CliError, CommandRegistrar, add_config_arguments
from dockyard.commands._common import add_status_argument, load_role_config, on_shutdown_signals


async def _serve(args: argparse.Namespace) -> int:
    from dockyard.broker.factory import create_data_plane
    from dockyard.broker.typed import MessagePlane
    from dockyard.broker.weights.factory import create_weight_store
    from dockyard.consumers.trainer.loop import TrainerLoop, TrainerStarved
    from dockyard.data.base import UnknownDatasetError, build_dataset
    from dockyard.environments.registry import available_environments
    from dockyard.models import load_tokenizer
    from dockyard.producers.dispatcher import Dispatcher
    from dockyard.utils.status import StatusFile

    config = load_role_config(args)
    run_dir = Path(args.run_dir or Path(config.run.output_dir) / config.run.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:  # before any server or model starts
        dataset = build_dataset(config.data.train, config.data.default_env)
    except UnknownDatasetError as error:
        raise CliError(f"data.train.name: {error}", exit_code=2) from None
    if config.data.default_env not in available_environments():
        raise CliError(
            f"data.default_env: unknown environment {config.data.default_env!r} "
            f"(known: {', '.join(available_environments())})",
            exit_code=2,
        )
    tokenizer = load_tokenizer(config.policy.model_name, config.policy.tokenizer.name)
    plane = create_data_plane(config.data_plane, client_name="trainer")
    async with plane:
        messages = MessagePlane(plane, stage="trainer")
        # The trainer process hosts the dispatcher; the two meet here, not in each other's code.
        dispatcher = Dispatcher(config, messages, dataset, tokenizer, run_id=config.run.name)
        loop = TrainerLoop(
            config,
            messages,
            create_weight_store(plane),
            run_dir,
            dispatcher,
            status=StatusFile(args.status_dir, "trainer", "0"),
        )
        on_shutdown_signals(loop.stop)
        try:
            summary = await loop.run()
        except TrainerStarved as error:
            raise CliError(str(error), exit_code=3) from None
    print(
        f"trained {summary.steps} steps; validation accuracy "
        f"{summary.val_accuracy_start} -> {summary.val_accuracy_end}; "
        f"dropped stale {summary.dropped_stale}, duplicates skipped {summary.duplicates}"
    )
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "trainer", help="Run the dispatcher and the async-GRPO trainer (one process)"
    )
    add_config_arguments(parser)
    parser.add_argument("--run-dir", default=None, help="default: <run.output_dir>/<run.name>")
    add_status_argument(parser)
    parser.set_defaults(handler=lambda args: asyncio.run(_serve(args)))
