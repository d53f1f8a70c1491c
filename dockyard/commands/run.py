"""``dockyard run --config PATH [overrides]``: the whole pipeline on this machine.

With a ``data_plane`` section the roles are separate processes over JetStream (an embedded
``nats-server`` for ``url: embedded``); with ``data_plane: null`` they are tasks of this process
over one in-memory plane (``_inprocess.py``). Both write the same run directory and show the
same progress display.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from dockyard.commands._cli import CliError, CommandRegistrar, add_config_arguments
from dockyard.commands._common import EXIT_INVALID_CONFIG, load_role_config
from dockyard.utils.private_files import private_dir, write_private_text

if TYPE_CHECKING:
    from dockyard.algorithms.grpo import MasterConfig
    from dockyard.fleet.progress import ProgressDisplay

POLL_S = 0.5


def _run(args: argparse.Namespace) -> int:
    from dockyard.commands._inprocess import run_in_process
    from dockyard.commands._roles import build_datasets
    from dockyard.commands._services import refuse_unanswered_services
    from dockyard.fleet.progress import ProgressDisplay, RunFiles
    from dockyard.observability.metrics.jsonl_backend import METRICS_FILE

    config = load_role_config(args)
    _refuse_metrics_ports_out_of_range(config)
    trainer_ranks = _trainer_ranks(config, args.trainer_ranks)
    if config.data_plane is not None:
        # A dataset file that is missing or does not parse is refused here, before any role
        # starts. (What needs the tokenizer, the chat template and tools, the trainer refuses
        # at its own start: exit 2, shown here with its message and never restarted.)
        build_datasets(config)
    refuse_unanswered_services(config)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.run_dir or Path(config.run.output_dir) / f"{config.run.name}-{stamp}")
    private_dir(run_dir)  # config.yaml may hold data_plane.credentials; logs, checkpoints
    resolved = run_dir / "config.yaml"
    write_private_text(resolved, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    files = RunFiles(config.logger.directory(run_dir) / METRICS_FILE, resolved)
    progress = ProgressDisplay(run_dir / "status", config.grpo.max_num_steps, run_files=files)
    try:
        if config.data_plane is None:
            return asyncio.run(run_in_process(config, run_dir, progress))
        return _run_processes(config, resolved, run_dir, progress, trainer_ranks)
    finally:
        print(progress.final_summary(), file=sys.stderr)
        print(f"run directory: {run_dir}")


def _refuse_metrics_ports_out_of_range(config: MasterConfig) -> None:
    """Over a data plane every role process gets its own port, ``run.metrics_port`` + its
    offset (:class:`~dockyard.fleet.supervisor.Supervisor`): the last one must exist."""
    base = config.run.metrics_port
    if not base or config.data_plane is None:
        return
    last = base + config.run.num_rollout_workers + config.run.num_scorers
    if last > 65535:
        raise CliError(
            f"run.metrics_port: the last role's port ({last} = metrics_port + "
            "num_rollout_workers + num_scorers) must be at most 65535",
            exit_code=EXIT_INVALID_CONFIG,
        )


def _trainer_ranks(config: MasterConfig, requested: int | None) -> int:
    """How many trainer ranks to start (``cluster``, ``--trainer-ranks``, this machine's GPUs)."""
    from dockyard.fleet.trainer_ranks import (
        LaunchRefused,
        check_jax_devices,
        check_ranks_can_run,
        ranks_for_run,
    )

    cuda_devices = 0
    if config.cluster.gpus_per_node:  # only then are GPUs counted (torch is seconds to import)
        import torch

        cuda_devices = torch.cuda.device_count()
    try:
        ranks = ranks_for_run(config.cluster, requested=requested, cuda_devices=cuda_devices)
        check_ranks_can_run(config, ranks)
        check_jax_devices(config)
    except LaunchRefused as refused:
        raise CliError(str(refused), exit_code=EXIT_INVALID_CONFIG) from None
    if ranks > 1 and config.data_plane is None:
        raise CliError(
            f"{ranks} trainer ranks need processes: data_plane: null runs every role in this "
            "one process; configure a data_plane (url: embedded starts one here)",
            exit_code=EXIT_INVALID_CONFIG,
        )
    return ranks


def _run_processes(
    config: MasterConfig,
    resolved: Path,
    run_dir: Path,
    progress: ProgressDisplay,
    trainer_ranks: int,
) -> int:
    from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
    from dockyard.fleet.supervisor import Supervisor

    assert config.data_plane is not None  # the caller runs data_plane: null in-process
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
        metrics_port=config.run.metrics_port,
        trainer_ranks=trainer_ranks,
    )
    # SIGTERM (a scheduler, `kill`) stops the fleet the same way Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    code: int | None = None
    try:
        supervisor.start()
        with progress:
            try:
                while (code := supervisor.check()) is None:
                    time.sleep(POLL_S)
                    progress.refresh()
            except KeyboardInterrupt:
                print("dockyard run: interrupted, stopping every role", file=sys.stderr)
                code = 130
            # Drained while the display is up, so the frame it leaves shows how the roles ended.
            supervisor.stop()
    except KeyboardInterrupt:  # a second Ctrl-C while the roles drain
        code = 130
    finally:
        supervisor.stop()
        if server is not None:
            server.stop()
    if code not in (0, 130):
        message = supervisor.trainer.error_message()
        detail = f": {message}\n" if message else "; "
        raise CliError(f"the trainer exited with status {code}{detail}see {run_dir / 'logs'}", code)
    return code


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "run",
        help="Run the whole pipeline on this machine: trainer, rollout workers, scorers (and "
        "a broker); with data_plane: null, all in this process",
    )
    add_config_arguments(parser)
    parser.add_argument("--run-dir", default=None, help="default: <run.output_dir>/<name>-<time>")
    parser.add_argument(
        "--trainer-ranks",
        type=int,
        default=None,
        help="data-parallel trainer processes (torchrun; gloo on the CPU); default: "
        "cluster.gpus_per_node when set, else 1",
    )
    parser.set_defaults(handler=_run)
