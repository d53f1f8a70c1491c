"""``dockyard tools serve --config PATH --toolbox NAME [overrides]``: serve one toolbox.

The process a rollout worker reaches for the environments listed in
``grpo.structured_tool_use.tool_services``: it connects to the run's data plane and serves the
toolbox with :class:`~dockyard.environments.tools.service.ToolService` until SIGTERM/SIGINT.
Run as many as the tools need; they share the work of opening sessions (docs/multiturn.md).
"""

from __future__ import annotations

import argparse
import asyncio

from dockyard.commands._cli import CliError, CommandRegistrar, add_config_arguments, add_subcommands
from dockyard.commands._common import EXIT_INVALID_CONFIG, load_role_config, on_shutdown_signals


async def _serve(args: argparse.Namespace) -> int:
    from dockyard.broker.jetstream import JetStreamPlane
    from dockyard.broker.plane import DataPlaneError
    from dockyard.environments.sandbox import SandboxUnavailableError
    from dockyard.environments.tools.service import ToolService
    from dockyard.environments.tools.toolbox import UnknownToolboxError, toolbox_class
    from dockyard.utils.logging import get_logger

    config = load_role_config(args)
    if config.data_plane is None or config.data_plane.is_embedded:
        # Either would be a NATS server of this process alone, which no rollout worker reaches.
        raise CliError(
            "data_plane.url: dockyard tools serve joins a run's NATS server; give its nats:// "
            f"URL (got {'null' if config.data_plane is None else 'embedded'})",
            exit_code=EXIT_INVALID_CONFIG,
        )
    try:
        toolbox = toolbox_class(args.toolbox).from_env_config(config.env)
    except UnknownToolboxError as error:
        raise CliError(f"--toolbox: {error}", exit_code=EXIT_INVALID_CONFIG) from None
    except (ValueError, SandboxUnavailableError) as error:  # settings it cannot run with
        raise CliError(
            f"--toolbox {args.toolbox}: {error}", exit_code=EXIT_INVALID_CONFIG
        ) from None
    plane = JetStreamPlane(config.data_plane, provision=False, client_name=f"tools-{args.toolbox}")
    try:
        await plane.start()
    except DataPlaneError as error:
        raise CliError(str(error)) from None
    stopped = asyncio.Event()
    on_shutdown_signals(stopped.set)
    service = ToolService(
        plane.nc, toolbox, prefix=config.grpo.structured_tool_use.tool_service_prefix
    )
    try:
        await service.start()
        # One line on stdout that launchers (and the tests) read: the service is reachable.
        print(f"serving toolbox {args.toolbox} as {service.prefix}", flush=True)
        get_logger(__name__).info("tools.serving", toolbox=args.toolbox, subject=service.prefix)
        await stopped.wait()
    finally:
        await service.stop()
        await toolbox.aclose()
        await plane.close()
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add("tools", help="Tool services for multi-turn episodes")
    commands = add_subcommands(parser, dest="tools_command")
    serve = commands.add(
        "serve", help="Serve a toolbox over the data plane (grpo.structured_tool_use.tool_services)"
    )
    add_config_arguments(serve)
    serve.add_argument(
        "--toolbox", required=True, help="the toolbox, named like its environment (arithmetic)"
    )
    serve.set_defaults(handler=lambda args: asyncio.run(_serve(args)))
