"""``dockyard replay retrain``: a run's recorded steps trained again from stored experience.

    dockyard replay retrain --run-dir RUN --from-step S [--to-step E] [--out DIR]
                            [--url nats://... [--namespace NS] | --config PATH] [KEY=VALUE ...]

Restores the newest checkpoint before step S and trains steps up to E (default: the ledger's
last) from the scored groups the ledger says formed each step, read back from the broker. With
no override it is a reproduction: each step's metrics and weight digest are compared with the
run's, and any difference is named (exit 1). With overrides (``policy.optimizer.lr=1e-5``) it
is an experiment on frozen data: the new metrics are written beside the old ones, and the
comparison is printed. Either way the output goes to its own directory (``--out``, by default
``RUN/retrain/steps_S-E[_experiment_N]``): the run's own files are never written.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from dockyard.commands._cli import CliError, CommandRegistrar
from dockyard.commands._common import EXIT_INVALID_CONFIG
from dockyard.commands._plane_args import add_plane_arguments, plane_config

if TYPE_CHECKING:  # imported lazily at run time
    from dockyard.config.sections.data_plane import DataPlaneConfig
    from dockyard.consumers.retrain import RetrainReport
    from dockyard.consumers.retrain_plan import RetrainPlan

#: Metrics printed side by side for an experiment (all of them are in retrain.json).
SHOWN = ("loss/loss", "train/grad_norm", "train/learning_rate", "train/advantage_abs_mean")


def _retrain(args: argparse.Namespace) -> int:
    from dockyard.config.capabilities import not_implemented
    from dockyard.consumers.retrain_plan import RetrainRefused, plan_retrain

    run_dir = Path(args.run_dir)
    try:
        plan = plan_retrain(run_dir, args.from_step, args.to_step, args.overrides)
    except RetrainRefused as error:
        raise CliError(str(error), EXIT_INVALID_CONFIG) from None
    if missing := not_implemented(plan.config):
        lines = "\n".join(f"  {issue}" for issue in missing)
        raise CliError(f"this config asks for what this build cannot run:\n{lines}", 2)
    out_dir = Path(args.out) if args.out else _default_out(plan)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise CliError(f"--out {out_dir}: not empty; one directory holds one re-training", 2)
    report = _run(plan, _plane_config(args, plan), out_dir)
    print(_describe(report))
    if plan.is_experiment:
        return 0
    return 0 if report.reproduced else 1


def _plane_config(args: argparse.Namespace, plan: RetrainPlan) -> DataPlaneConfig:
    """``--url`` (with ``--namespace``...) or ``--config``'s ``data_plane``, else the run's own
    ``data_plane``. The overrides are the run config's, never the plane's."""
    if args.url or args.config:
        return plane_config(argparse.Namespace(**{**vars(args), "overrides": []}))
    config = plan.config.data_plane
    if config is None or config.is_embedded:
        raise CliError(
            "retrain reads the run's experience from a running broker: give --url nats://... "
            "(the run's config has no data_plane.url a second process can reach)",
            EXIT_INVALID_CONFIG,
        )
    return config


def _run(plan: RetrainPlan, plane_settings: DataPlaneConfig, out_dir: Path) -> RetrainReport:
    from dockyard.broker.admin import stream_state
    from dockyard.broker.jetstream import JetStreamPlane
    from dockyard.broker.plane import DataPlaneError
    from dockyard.consumers.retrain import retrain
    from dockyard.consumers.retrain_plan import RetrainRefused

    async def run() -> RetrainReport:
        plane = JetStreamPlane(plane_settings, provision=False, client_name="dockyard-retrain")
        async with plane:
            experience = plane.names.experience_stream.name
            return await retrain(plane, plan, out_dir, lambda: stream_state(plane, experience))

    try:
        return asyncio.run(run())
    except RetrainRefused as error:
        raise CliError(str(error), EXIT_INVALID_CONFIG) from None
    except DataPlaneError as error:
        raise CliError(str(error)) from None


def _default_out(plan: RetrainPlan) -> Path:
    base = plan.run_dir / "retrain" / f"steps_{plan.first_step}-{plan.last_step}"
    if not plan.is_experiment:
        return base
    number = 1
    while Path(f"{base}_experiment_{number}").exists():
        number += 1
    return Path(f"{base}_experiment_{number}")


def _describe(report: RetrainReport) -> str:
    plan = report.plan
    lines = [
        f"re-trained steps {plan.first_step}..{plan.last_step} from checkpoint step "
        f"{plan.checkpoint.step} ({plan.checkpoint.path}); output in {report.out_dir}"
    ]
    if plan.is_experiment:
        lines.append(f"experiment on frozen data: {', '.join(plan.changed_keys)} changed")
        lines.append("step  " + "  ".join(f"{name} (run -> now)" for name in SHOWN))
        for step in report.steps:
            original = step.original or {}
            cells = [
                f"{_fmt(original.get(name))} -> {_fmt(step.metrics.get(name))}" for name in SHOWN
            ]
            lines.append(f"{step.step:>4}  " + "  ".join(cells))
        return "\n".join(lines)
    for step in report.steps:
        if step.original is None:
            lines.append(f"step {step.step}: NOT COMPARED: metrics.jsonl has no record of it")
        elif step.differing:
            lines.append(f"step {step.step}: DIFFERENT: {', '.join(step.differing)}")
        else:
            lines.append(f"step {step.step}: {len(step.metrics)} metrics equal")
        if step.digest_equal is None:
            lines.append(f"  weights {step.digest}: NOT COMPARED: the run's event aged out")
        elif not step.digest_equal:
            lines.append(f"  weights DIFFERENT: {step.digest} (run: {step.original_digest})")
        else:
            lines.append(f"  weights equal ({step.digest})")
    verdict = "reproduced bit for bit" if report.reproduced else "NOT reproduced"
    lines.append(verdict)
    return "\n".join(lines)


def _fmt(value: object) -> str:
    return "-" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def register(commands: CommandRegistrar) -> None:
    parser = commands.add(
        "retrain",
        help="Train recorded steps again from stored experience (no rollouts, no scoring)",
    )
    parser.add_argument("--run-dir", required=True, help="the run's directory")
    parser.add_argument(
        "--from-step", type=int, required=True, help="first step re-trained (S >= 1)"
    )
    parser.add_argument("--to-step", type=int, help="last step re-trained (default: the last)")
    parser.add_argument("--out", help="output directory (default: RUN/retrain/steps_S-E...)")
    add_plane_arguments(
        parser,
        overrides_help="key=value on the run's config (RUN/hyperparams.json): an experiment "
        "on frozen data",
    )
    parser.set_defaults(handler=_retrain)
