"""``dockyard run`` with ``data_plane: null``: every role in this process over one MemoryPlane.

The roles are the ones the per-role commands build (``_roles.py``), as tasks of one event loop:
the trainer with its dispatcher, ``run.num_rollout_workers`` rollout workers and
``run.num_scorers`` scorers. Blocking work (model loading, generation, training steps,
checkpoints) runs in threads, so the loop keeps every role moving. All log lines go to
``logs/run.log`` (JSON, each tagged with its ``role``); stderr shows the progress display.
"""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from dockyard.commands._cli import CliError
from dockyard.commands._common import on_shutdown_signals
from dockyard.commands._roles import (
    EXIT_STARVED,
    build_rollout_worker,
    build_scorer,
    build_trainer,
    create_rollout_engine,
    describe_trainer_summary,
    metrics_endpoint,
    prepare_rollout,
    prepare_trainer,
    record_metrics_port,
    serve_rollout_worker,
    starting_status,
)
from dockyard.fleet.threads import available_cpus, threads_per_role

if TYPE_CHECKING:
    from dockyard.algorithms.grpo import MasterConfig
    from dockyard.broker.plane import DataPlane
    from dockyard.commands._roles import TrainerInputs
    from dockyard.engines.base import GenerationEngine, SamplingParams
    from dockyard.fleet.inprocess import InProcessFleet
    from dockyard.fleet.progress import ProgressDisplay
    from dockyard.observability.prometheus import MetricsServer

#: The one log file of an in-process run, under ``<run dir>/logs``.
LOG_FILE = "run.log"
#: How often the progress display is redrawn (as the multi-process ``dockyard run`` polls).
REFRESH_S = 0.5
EXIT_INTERRUPTED = 130


async def run_in_process(config: MasterConfig, run_dir: Path, progress: ProgressDisplay) -> int:
    """The trainer's exit status: 0, or 130 when stopped by Ctrl-C/SIGTERM. A role that fails
    ends the run with a :class:`CliError` naming it."""
    from dockyard.broker.factory import create_data_plane
    from dockyard.consumers.trainer.loop import TrainerStarved
    from dockyard.fleet.inprocess import RoleFailed
    from dockyard.observability.tracing import tracing
    from dockyard.utils.logging import logging_to_file

    log_file = run_dir / "logs" / LOG_FILE
    inputs = prepare_trainer(config)  # the launch checks, before any model loads
    params = prepare_rollout(config)
    _threads_per_role(config)
    engines: list[GenerationEngine] = []
    # One endpoint for the one process: the roles' series differ by their ``stage`` label.
    with (
        logging_to_file(log_file),
        metrics_endpoint(config) as metrics,
        # One process, one tracer provider: every role's spans go out under one service.
        tracing(config.run.tracing, role="fleet", instance="0"),
    ):
        try:
            for index in range(config.run.num_rollout_workers):
                engines.append(await _load_engine(config, f"rollout-{index}"))
            # The only plane of this run: every role gets this instance.
            async with create_data_plane(None) as plane:
                fleet = _fleet(config, plane, inputs, params, engines, run_dir, metrics)
                on_shutdown_signals(fleet.request_stop)
                with progress:
                    summary = await fleet.run(progress.refresh, REFRESH_S)
        except RoleFailed as failure:
            if isinstance(failure.error, TrainerStarved):
                raise CliError(str(failure.error), exit_code=EXIT_STARVED) from None
            raise CliError(f"{failure} (see {log_file})") from None
        finally:
            for engine in engines:  # idempotent: a worker that ran has shut its own down
                await engine.shutdown()
    print(describe_trainer_summary(summary))
    return EXIT_INTERRUPTED if fleet.stop_requested else 0


def _fleet(
    config: MasterConfig,
    plane: DataPlane,
    inputs: TrainerInputs,
    params: SamplingParams,
    engines: list[GenerationEngine],
    run_dir: Path,
    metrics: MetricsServer | None,
) -> InProcessFleet:
    """The trainer, one rollout worker per engine and ``run.num_scorers`` scorers over
    ``plane``, named as the multi-process run names its role processes."""
    from dockyard.fleet.inprocess import InProcessFleet, RoleTask

    status_dir = run_dir / "status"
    trainer = build_trainer(config, inputs, plane, run_dir=run_dir, status_dir=status_dir)
    workers = [
        build_rollout_worker(
            config,
            plane,
            engine,
            params,
            worker_id=f"w{i}",
            status=starting_status(status_dir, "rollout", f"w{i}", "waiting for weights"),
        )
        for i, engine in enumerate(engines)
    ]
    scorers = [
        build_scorer(
            config,
            plane,
            scorer_id=f"s{i}",
            status=starting_status(status_dir, "scorer", f"s{i}", "waiting for rollouts"),
        )
        for i in range(config.run.num_scorers)
    ]
    record_metrics_port(
        metrics, trainer.status, *(w.status for w in workers), *(s.status for s in scorers)
    )
    return InProcessFleet(
        RoleTask("trainer-0", trainer.run, trainer.stop),
        [
            *(
                RoleTask(f"rollout-{i}", functools.partial(serve_rollout_worker, w), w.stop)
                for i, w in enumerate(workers)
            ),
            *(RoleTask(f"scorer-{i}", s.run, s.stop) for i, s in enumerate(scorers)),
        ],
    )


def _threads_per_role(config: MasterConfig) -> None:
    """As the multi-process run gives each role its share of the cores (fleet/threads.py):
    the roles' threads compute at the same time, and kernels whose threads contend for a core
    spin-wait. Threads started later inherit the setting; a user's OMP_NUM_THREADS wins."""
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        roles = 1 + config.run.num_rollout_workers + config.run.num_scorers
        torch.set_num_threads(threads_per_role(available_cpus(), roles))


async def _load_engine(config: MasterConfig, role: str) -> GenerationEngine:
    """One at a time and before any role runs: loading seeds torch's global generator, which
    the trainer's own model construction must not race with."""
    import structlog

    try:
        with structlog.contextvars.bound_contextvars(role=role):  # its log lines name it
            return await asyncio.to_thread(create_rollout_engine, config)
    except Exception as error:
        raise CliError(
            f"{role} failed to start its engine: {type(error).__name__}: {error}"
        ) from error
