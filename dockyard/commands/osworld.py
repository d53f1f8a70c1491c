"""``dockyard osworld serve``: the desktop simulator service the ``osworld`` environment and its
episode toolbox call (``env.osworld.simulator_url``). ``dockyard osworld prompts``: a dataset's
records with their prompts rendered for an action space (``env.osworld.action_space``).

A STAND-IN for OSWorld's VMs, which cannot run here: simulated desktops of widgets behind the
real controller API's requests (docs/configuration.md, "Computer use on simulated desktops";
docs/operations.md, "The desktop simulator")."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from pathlib import Path

from dockyard.commands._cli import CliError, CommandRegistrar, add_subcommands


async def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from dockyard.environments.osworld.simulator import create_app
    from dockyard.utils.logging import get_logger

    if args.max_desktops < 1:
        raise CliError("--max-desktops must be at least 1")
    listener = socket.socket()
    try:
        listener.bind((args.host, args.port))
        # Listening before the URL is printed: a client that connects at once waits in the
        # backlog until the server accepts, instead of being refused while it starts.
        listener.listen(128)
    except OSError as error:
        raise CliError(f"--port {args.port}: cannot listen on {args.host}: {error}") from None
    host, port = listener.getsockname()[:2]
    url = f"http://{host}:{port}"
    # One line on stdout that launchers (and the tests) read to learn the bound port.
    print(f"listening on {url}", flush=True)
    get_logger(__name__).info("desktop simulator up", url=url, max_desktops=args.max_desktops)
    config = uvicorn.Config(create_app(args.max_desktops), log_level="warning", lifespan="off")
    await uvicorn.Server(config).serve(sockets=[listener])
    return 0


def _prompts(args: argparse.Namespace) -> int:
    """Each record's ``prompt`` rendered from its ``task`` for the action space; every other
    field kept. A record that is not JSON or has no readable task is refused with its line."""
    from dockyard.environments.osworld.prompts import task_prompt
    from dockyard.environments.osworld.tasks import TaskError, parse_task

    try:
        lines = Path(args.input).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"{args.input}: cannot read: {error}") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{args.input}:{number}"
        try:
            record = json.loads(line)
        except ValueError as error:
            raise CliError(f"{where}: not JSON: {error}") from None
        if not isinstance(record, dict) or "task" not in record:
            raise CliError(f"{where}: a record is a JSON object with its 'task'")
        try:
            task = parse_task(record["task"])
        except TaskError as error:
            raise CliError(f"{where}: {error}") from None
        record["prompt"] = task_prompt(task, args.action_space)
        records.append(json.dumps(record) + "\n")
    Path(args.output).write_text("".join(records), encoding="utf-8")
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add("osworld", help="The desktop simulator for OSWorld computer-use tasks")
    commands = add_subcommands(parser, dest="osworld_command")
    serve = commands.add(
        "serve", help="Serve simulated desktops behind OSWorld's VM controller API (a stand-in)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="listen address (default loopback)")
    serve.add_argument("--port", type=int, default=0, help="default 0: any free port")
    serve.add_argument(
        "--max-desktops", type=int, default=256, help="desktops open at once (one per episode)"
    )
    serve.set_defaults(handler=lambda args: asyncio.run(_serve(args)))
    prompts = commands.add(
        "prompts",
        help="Render a task dataset's prompts for an action space (env.osworld.action_space)",
    )
    prompts.add_argument("input", help="JSONL records, each with its 'task'")
    prompts.add_argument("output", help="where the records go, their 'prompt' rendered anew")
    prompts.add_argument(
        "--action-space", choices=["pyautogui", "computer_13"], default="pyautogui"
    )
    prompts.set_defaults(handler=_prompts)
