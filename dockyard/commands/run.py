"""``dockyard run --config PATH [overrides]``: the whole pipeline on this machine."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import yaml

from dockyard.cli import CliError, CommandRegistrar, add_config_arguments
from dockyard.commands._common import load_role_config

POLL_S = 0.5
PLAIN_PROGRESS_EVERY_S = 10.0


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
    from dockyard.fleet.progress import render, summary_line
    from dockyard.fleet.supervisor import Supervisor

    config = load_role_config(args)
    if config.data_plane is None:
        raise CliError(
            "dockyard run starts separate processes, which need a data plane: set "
            "data_plane.url (embedded or nats://...); data_plane: null is for one process",
            exit_code=2,
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.run_dir or Path(config.run.output_dir) / f"{config.run.name}-{stamp}")
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = run_dir / "config.yaml"
    resolved.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))

    server = None
    overrides: list[str] = []
    if config.data_plane.is_embedded:
        plane_cfg = config.data_plane
        server = EmbeddedNatsServer(
            EmbeddedServerSettings(
                store_dir=Path(plane_cfg.embedded.store_dir or run_dir / "nats"),
                host=plane_cfg.embedded.host,
                port=plane_cfg.embedded.port,
                max_payload=plane_cfg.max_payload,
                max_pending=plane_cfg.max_pending,
            )
        )
        overrides.append(f"data_plane.url={server.start()}")
    supervisor = Supervisor(
        resolved,
        overrides,
        run_dir,
        num_rollout_workers=config.run.num_rollout_workers,
        num_scorers=config.run.num_scorers,
    )
    console = Console(stderr=True)
    started = time.time()
    # SIGTERM (a scheduler, `kill`) stops the fleet the same way Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    code: int | None = None
    try:
        supervisor.start()
        if console.is_terminal:
            with Live(
                render(supervisor.status_dir, started, config.grpo.max_num_steps),
                console=console,
                refresh_per_second=2,
            ) as live:
                while (code := supervisor.check()) is None:
                    time.sleep(POLL_S)
                    live.update(render(supervisor.status_dir, started, config.grpo.max_num_steps))
        else:
            last_line = 0.0
            while (code := supervisor.check()) is None:
                time.sleep(POLL_S)
                if time.time() - last_line >= PLAIN_PROGRESS_EVERY_S:
                    print(
                        summary_line(supervisor.status_dir, started, config.grpo.max_num_steps),
                        file=sys.stderr,
                        flush=True,
                    )
                    last_line = time.time()
    except KeyboardInterrupt:
        print("dockyard run: interrupted, stopping every role", file=sys.stderr)
        code = 130
    finally:
        supervisor.stop()
        if server is not None:
            server.stop()
    print(summary_line(supervisor.status_dir, started, config.grpo.max_num_steps), file=sys.stderr)
    print(f"run directory: {run_dir}")
    if code not in (0, 130):
        raise CliError(f"the trainer exited with status {code}; see {run_dir / 'logs'}", code)
    return code


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "run",
        help="Run the whole pipeline on this machine: broker, trainer, rollout workers, scorers",
    )
    add_config_arguments(parser)
    parser.add_argument("--run-dir", default=None, help="default: <run.output_dir>/<name>-<time>")
    parser.set_defaults(handler=_run)
