"""Recipes: a chain of ordinary runs, each stage's trained model feeding the later ones.

The V4 recipe (per-domain SFT → per-domain GRPO specialists → multi-teacher on-policy
distillation) is such a chain. Every stage is a normal ``dockyard run`` in a process of its own,
with its own run directory ``<recipe dir>/<stage name>``. When a stage's run ends well, its last
checkpoint is exported as a Hugging Face directory (``<stage dir>/model``) and a marker
(``<stage dir>/stage_done.json``) is written last, atomically. ``models_from`` maps config keys
of a later stage (``policy.model_name``, ``on_policy_distillation.teachers.<alias>.model_name``)
to the stage whose model they take.

``teacher_servers`` serves earlier stages' models as on-policy distillation teachers: for the
length of the stage, one ``dockyard model serve`` process per teacher alias, and the stage's
``on_policy_distillation.teachers.<alias>`` gets that model and the server's ``base_url`` (the V4
recipe's consolidation: one teacher server per specialist, its scorers asking them over HTTP).

Running the recipe again skips every stage with a marker, and re-runs an unfinished one in its
own run directory, where the trainer resumes from its last checkpoint; so a chain whose stage was
killed picks up there. Every stage's config is loaded and validated before the first stage runs,
so a typo in stage three is refused before hours of stage one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator

from dockyard.config.base import Section
from dockyard.config.errors import ConfigError, ConfigIssue
from dockyard.config.loader import load_config
from dockyard.config.master import MasterConfig
from dockyard.fleet.teacher_servers import TeacherServerError, teacher_server
from dockyard.models.loading import PRECISION_DTYPES
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

MARKER_FILE = "stage_done.json"
MODEL_DIR = "model"
STAGE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
TEACHER_KEY = "on_policy_distillation.teachers.{alias}.{key}"
# Where a stage's teacher servers will listen is known only when they start: planning validates
# the stage's config with this address in their place.
STAND_IN_URL = "http://127.0.0.1:1"


class RecipeError(ValueError):
    """A recipe that cannot run as written (``key``: the offending key's path), or a stage that
    failed."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


class _RecipeSection(Section):
    # Unlike a run config, a recipe file has no subsystem that may read extra keys: a
    # misspelt key (``models_form``) would be silently ignored, so it is refused.
    model_config = ConfigDict(extra="forbid")


class TeacherServerConfig(_RecipeSection):
    model_from: str = Field(description="the earlier stage whose exported model it serves")
    precision: str = Field("float32", description="the precision the server loads it in")

    @field_validator("precision")
    @classmethod
    def _known_precision(cls, value: str) -> str:
        if value not in PRECISION_DTYPES:
            raise ValueError(f"{value!r} is not one of {', '.join(PRECISION_DTYPES)}")
        return value


class StageConfig(_RecipeSection):
    name: str = Field(pattern=STAGE_NAME_PATTERN, description="also its run directory's name")
    config: str = Field(
        min_length=1, description="the stage's run config (relative to the recipe file)"
    )
    overrides: list[str] = Field(default_factory=list, description="KEY=VALUE, as on the CLI")
    models_from: dict[str, str] = Field(
        default_factory=dict,
        description="config key -> earlier stage whose exported model it is set to",
    )
    teacher_servers: dict[str, TeacherServerConfig] = Field(
        default_factory=dict,
        description="OPD teacher alias -> the earlier stage's model, served while this stage runs",
    )


class RecipeSettings(_RecipeSection):
    name: str = Field(pattern=STAGE_NAME_PATTERN)
    output_dir: str = Field(
        "runs", description="the recipe directory is <output_dir>/<name> (relative: to the cwd)"
    )


class RecipeConfig(_RecipeSection):
    recipe: RecipeSettings
    stages: list[StageConfig] = Field(min_length=1)

    def rule_issues(self) -> list[ConfigIssue]:
        seen: set[str] = set()
        issues: list[ConfigIssue] = []
        for index, stage in enumerate(self.stages):
            if stage.name in seen:
                issues.append(ConfigIssue(f"stages.{index}.name", f"{stage.name!r} is repeated"))
            sources = {
                **{f"models_from.{key}": source for key, source in stage.models_from.items()},
                **{
                    f"teacher_servers.{alias}.model_from": server.model_from
                    for alias, server in stage.teacher_servers.items()
                },
            }
            for key, source in sources.items():
                if source not in seen:
                    issues.append(
                        ConfigIssue(
                            f"stages.{index}.{key}",
                            f"{source!r} is not an earlier stage (earlier: "
                            f"{', '.join(sorted(seen)) or 'none'})",
                        )
                    )
            for alias in stage.teacher_servers:
                # A served teacher's model is the server's: naming it twice could disagree.
                taken = TEACHER_KEY.format(alias=alias, key="model_name")
                if taken in stage.models_from:
                    issues.append(
                        ConfigIssue(
                            f"stages.{index}.models_from.{taken}",
                            f"teacher {alias!r} is served (teacher_servers): its model comes "
                            "from there",
                        )
                    )
            seen.add(stage.name)
        return issues


@dataclass(frozen=True)
class PlannedStage:
    """A stage ready to run: its resolved config file, run directory and base overrides."""

    name: str
    config_path: Path
    run_dir: Path
    overrides: tuple[str, ...]
    models_from: dict[str, str]
    #: teacher alias -> (the stage whose model it serves, the server's precision)
    teacher_servers: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def marker(self) -> Path:
        return self.run_dir / MARKER_FILE

    def done_model(self) -> Path | None:
        """The exported model of a finished stage, or None when the stage has not finished."""
        if not self.marker.is_file():
            return None
        return Path(json.loads(self.marker.read_text())["model"])


def load_recipe(path: str | Path) -> RecipeConfig:
    source = Path(path)
    if not source.is_file():
        raise RecipeError("", f"recipe file {source} does not exist")
    try:
        return RecipeConfig.model_validate(yaml.safe_load(source.read_text()) or {})
    except ValidationError as error:
        detail = "; ".join(
            f"{'.'.join(map(str, item['loc']))}: {item['msg']}" for item in error.errors()
        )
        raise RecipeError("", f"{source}: {detail}") from None


def plan_recipe(path: str | Path, recipe_dir: str | Path | None = None) -> list[PlannedStage]:
    """The stages of the recipe at ``path``, each stage's config validated now (with a
    stand-in path for the models earlier stages will produce)."""
    source = Path(path)
    recipe = load_recipe(source)
    root = Path(recipe_dir or Path(recipe.recipe.output_dir) / recipe.recipe.name)
    planned = []
    for index, stage in enumerate(recipe.stages):
        config_path = (source.parent / stage.config).resolve()
        run_dir = (root / stage.name).resolve()
        models = {
            key: root.resolve() / earlier / MODEL_DIR for key, earlier in stage.models_from.items()
        }
        teachers = {
            alias: root.resolve() / server.model_from / MODEL_DIR
            for alias, server in stage.teacher_servers.items()
        }
        stand_ins = [
            *(f"{key}={model}" for key, model in models.items()),
            *served_teacher_overrides(
                {alias: (model, STAND_IN_URL) for alias, model in teachers.items()}
            ),
        ]
        try:
            config = load_config(config_path, [*stage.overrides, *stand_ins])
        except ConfigError as error:
            raise RecipeError(f"stages.{index} ({stage.name})", str(error)) from None
        except FileNotFoundError as error:
            raise RecipeError(f"stages.{index}.config", str(error)) from None
        _refuse_without_checkpoints(config, f"stages.{index} ({stage.name})")
        _refuse_unused_teacher_servers(config, stage, f"stages.{index}.teacher_servers")
        planned.append(
            PlannedStage(
                name=stage.name,
                config_path=config_path,
                run_dir=run_dir,
                overrides=tuple(stage.overrides),
                models_from=dict(stage.models_from),
                teacher_servers={
                    alias: (server.model_from, server.precision)
                    for alias, server in stage.teacher_servers.items()
                },
            )
        )
    return planned


def served_teacher_overrides(teachers: dict[str, tuple[Path, str]]) -> list[str]:
    """The overrides pointing each teacher alias at its model and the server serving it."""
    overrides = []
    for alias, (model, url) in teachers.items():
        overrides.append(f"{TEACHER_KEY.format(alias=alias, key='model_name')}={model}")
        overrides.append(f"{TEACHER_KEY.format(alias=alias, key='base_url')}={url}")
    return overrides


def _refuse_unused_teacher_servers(config: MasterConfig, stage: StageConfig, where: str) -> None:
    # A server no sample is routed to would run for the whole stage and teach nothing.
    distillation = config.on_policy_distillation
    used = {*distillation.teacher_model_by_agent_name.values(), distillation.default_teacher_alias}
    for alias in stage.teacher_servers:
        if not distillation.enabled or alias not in used:
            raise RecipeError(
                f"{where}.{alias}",
                "no sample would reach this teacher (on_policy_distillation is off, or no agent "
                "name and no default_teacher_alias selects it)",
            )


def _refuse_without_checkpoints(config: MasterConfig, where: str) -> None:
    # A stage's output is its last checkpoint: without one there is nothing to hand on.
    if not config.checkpointing.enabled:
        raise RecipeError(f"{where}.checkpointing.enabled", "a recipe stage must checkpoint")


StageRunner = Callable[[PlannedStage, Sequence[str]], int]


def run_stage_process(stage: PlannedStage, overrides: Sequence[str]) -> int:
    """``dockyard run`` for ``stage`` in a child process (inherits stdout/stderr)."""
    command = [
        sys.executable,
        "-m",
        "dockyard",
        "run",
        "--config",
        str(stage.config_path),
        "--run-dir",
        str(stage.run_dir),
        *overrides,
    ]
    return subprocess.run(command, check=False).returncode


def run_recipe(
    stages: Sequence[PlannedStage], runner: StageRunner = run_stage_process
) -> dict[str, Path]:
    """Run every unfinished stage in order; the exported model of every stage, by name."""
    models: dict[str, Path] = {}
    for stage in stages:
        done = stage.done_model()
        if done is not None:
            log.info("recipe.stage_skipped", stage=stage.name, model=str(done))
            models[stage.name] = done
            continue
        inputs = [f"{key}={models[source]}" for key, source in stage.models_from.items()]
        log.info("recipe.stage_started", stage=stage.name, run_dir=str(stage.run_dir))
        stage.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            code = _run_with_teacher_servers(stage, [*stage.overrides, *inputs], models, runner)
        except TeacherServerError as error:
            raise RecipeError("", f"stage {stage.name}: {error}") from None
        if code != 0:
            raise RecipeError(
                "", f"stage {stage.name} exited with status {code}; see {stage.run_dir}"
            )
        models[stage.name] = finish_stage(stage)
    return models


def _run_with_teacher_servers(
    stage: PlannedStage, overrides: list[str], models: dict[str, Path], runner: StageRunner
) -> int:
    """``runner`` with the stage's teacher servers listening, stopped when it returns."""
    with ExitStack() as servers:
        served = {
            alias: (
                models[source],
                servers.enter_context(
                    teacher_server(
                        models[source], precision, stage.run_dir / f"teacher_{alias}.log"
                    )
                ).url,
            )
            for alias, (source, precision) in stage.teacher_servers.items()
        }
        return runner(stage, [*overrides, *served_teacher_overrides(served)])


def finish_stage(stage: PlannedStage) -> Path:
    """Export the stage's last checkpoint as a Hugging Face directory, then write the marker
    (last, atomically: a marker always names a complete model)."""
    from dockyard.checkpoints.directories import CheckpointManager
    from dockyard.checkpoints.model_files import convert_dcp_to_hf

    config = load_config(stage.run_dir / "config.yaml")  # as the run resolved it
    checkpoints = config.checkpointing.directory(stage.run_dir)
    latest = CheckpointManager(config.checkpointing, checkpoints).latest()
    if latest is None:
        raise RecipeError("", f"stage {stage.name} ended without a checkpoint in {checkpoints}")
    model = stage.run_dir / MODEL_DIR
    staging = stage.run_dir / f".{MODEL_DIR}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    convert_dcp_to_hf(latest.path, staging)
    if model.exists():
        shutil.rmtree(model)  # a previous export whose marker was never written
    os.replace(staging, model)
    marker = {"stage": stage.name, "model": str(model), "checkpoint_step": latest.step}
    partial = stage.marker.with_suffix(".partial")
    partial.write_text(json.dumps(marker, indent=2))
    os.replace(partial, stage.marker)
    log.info("recipe.stage_done", stage=stage.name, model=str(model), step=latest.step)
    return model
