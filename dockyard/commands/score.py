"""``dockyard score --config PATH [--env NAME] [overrides]``: one scorer of the shared pool."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket

from dockyard.cli import CommandRegistrar, add_config_arguments
from dockyard.commands._common import add_status_argument, load_role_config, on_shutdown_signals


async def _serve(args: argparse.Namespace) -> int:
    from dockyard.broker.factory import create_data_plane
    from dockyard.broker.typed import MessagePlane
    from dockyard.consumers.scorer import Scorer
    from dockyard.environments.base import EnvironmentContext
    from dockyard.models import load_tokenizer
    from dockyard.utils.status import STARTING, StatusFile

    config = load_role_config(args)
    scorer_id = args.scorer_id or f"{socket.gethostname()}-{os.getpid()}"
    status = StatusFile(args.status_dir, "scorer", scorer_id)
    status.update(STARTING, detail="loading the tokenizer")  # ready once it takes rollouts
    tokenizer = load_tokenizer(config.policy.model_name, config.policy.tokenizer.name)
    env_settings = getattr(config.env, args.env) if args.env else None
    consumer = config.data_plane.consumer if config.data_plane else None
    plane = create_data_plane(config.data_plane, client_name=f"scorer-{scorer_id}")
    async with plane:
        scorer = Scorer(
            MessagePlane(plane, stage="scorer"),
            EnvironmentContext(env=config.env, distillation=config.on_policy_distillation),
            tokenizer,
            scorer_id=scorer_id,
            only_env=args.env,
            max_concurrency=env_settings.max_concurrency if env_settings else 8,
            max_deliver=consumer.max_deliver if consumer else 5,
            nak_delay_s=consumer.nak_delay_s if consumer else 1.0,
            status=status,
        )
        on_shutdown_signals(scorer.stop)
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
