"""``dockyard simulate --config PATH [overrides] [--calibration RUN_DIR] [--workers N ...]``:
predict a fleet's throughput, staleness and trainer idle time (docs/operations.md, "Planning a
fleet")."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dockyard.commands._cli import CliError, CommandRegistrar, add_config_arguments
from dockyard.commands._common import EXIT_INVALID_CONFIG, load_config_report_or_exit

if TYPE_CHECKING:  # imported lazily at run time
    from dockyard.config.master import MasterConfig
    from dockyard.planning.fleet import StageCosts

_COST_HELP = {
    "gen_group_s": "seconds of generation per group in a batch",
    "gen_batch_s": "seconds of generation per batch, whatever its size",
    "train_step_s": "seconds of one trainer step",
    "publish_s": "seconds to publish a weight version (trainer side)",
    "step_overhead_s": "seconds of the trainer's bookkeeping per step",
    "hop_s": "seconds per pass through the broker (three per group)",
    "score_s": "seconds of scoring per group",
    "refit_s": "seconds for a worker to load a version held at its site",
    "weight_bytes": "bytes of one full weight snapshot",
    "rollout_bytes": "bytes of one scored group on the WAN (default: an uncompressed bound)",
}


def _costs(args: argparse.Namespace, config: MasterConfig) -> StageCosts:
    from dockyard.planning.calibration import CalibrationError, calibrate
    from dockyard.planning.fleet import ImpossibleFleet, StageCosts, rollout_bytes_bound

    given = {name: getattr(args, name) for name in _COST_HELP if getattr(args, name) is not None}
    given.setdefault("rollout_bytes", rollout_bytes_bound(config))
    if args.calibration is None:
        missing = [f"--{name.replace('_', '-')}" for name in _COST_HELP if name not in given]
        if missing:
            raise CliError(
                "no --calibration run directory: give every stage cost instead; missing "
                + ", ".join(missing),
                exit_code=EXIT_INVALID_CONFIG,
            )
        return StageCosts(**given)
    run_dir = Path(args.calibration)
    measured_config = _run_config(run_dir)
    from dockyard.planning.fleet import pipeline_rules

    try:
        measured = calibrate(
            run_dir,
            rules=pipeline_rules(measured_config),
            workers=measured_config.run.num_rollout_workers,
            scorers=measured_config.run.num_scorers,
            rollout_bytes=given["rollout_bytes"],
            shared_cores=args.calibration_cores,
        )
    except (CalibrationError, ImpossibleFleet) as error:
        raise CliError(f"--calibration: {error}", exit_code=EXIT_INVALID_CONFIG) from None
    return dataclasses.replace(measured, **given)


def _run_config(run_dir: Path) -> MasterConfig:
    from dockyard.algorithms.grpo import registered_names
    from dockyard.config.errors import ConfigError
    from dockyard.config.loader import load_config_report

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise CliError(
            f"--calibration: {path} not found (is this a run directory?)",
            exit_code=EXIT_INVALID_CONFIG,
        )
    try:
        return load_config_report(str(path), [], registered=registered_names()).config
    except ConfigError as error:
        raise CliError(f"--calibration: {path}: {error}", exit_code=EXIT_INVALID_CONFIG) from None


def _simulate(args: argparse.Namespace) -> int:
    from dockyard.planning.fleet import FleetSpec, ImpossibleFleet, pipeline_rules
    from dockyard.planning.simulator import simulate

    config = load_config_report_or_exit(args).config
    spec = FleetSpec(
        rules=pipeline_rules(config, steps=args.steps),
        costs=_costs(args, config),
        workers=args.workers if args.workers is not None else config.run.num_rollout_workers,
        sites=args.sites,
        scorers_per_site=(
            args.scorers_per_site if args.scorers_per_site is not None else config.run.num_scorers
        ),
        wan_mbit=args.wan_mbit,
        latency_ms=args.latency_ms,
        patch_ratio=args.patch_ratio,
        shared_cores=args.shared_cores,
    )
    try:
        prediction = simulate(spec.validated())
    except ImpossibleFleet as error:
        raise CliError(f"impossible fleet: {error}", exit_code=EXIT_INVALID_CONFIG) from None
    report = {
        "fleet": {
            "workers": spec.workers,
            "sites": spec.sites,
            "scorers_per_site": spec.scorers_per_site,
            "wan_mbit": spec.wan_mbit,
            "latency_ms": spec.latency_ms,
            "patch_ratio": spec.patch_ratio,
            "shared_cores": spec.shared_cores,
        },
        "rules": {
            **dataclasses.asdict(spec.rules),
            "in_flight_capacity": spec.rules.in_flight_capacity,
        },
        "costs": dataclasses.asdict(spec.costs),
        "prediction": {
            **dataclasses.asdict(prediction),
            "staleness": {str(age): n for age, n in prediction.staleness.items()},
            "staleness_mean": prediction.staleness_mean,
            "staleness_max": prediction.staleness_max,
        },
    }
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(_text(report))
    return 0


def _text(report: dict[str, Any]) -> str:
    p, fleet = report["prediction"], report["fleet"]
    wan = f"{fleet['wan_mbit']} Mbit/s" if fleet["wan_mbit"] is not None else "none (co-located)"
    ages = ", ".join(f"{age}: {n}" for age, n in p["staleness"].items())
    lines = [
        f"fleet: {fleet['workers']} rollout workers over {fleet['sites']} site(s), "
        f"{fleet['scorers_per_site']} scorer(s) per site; WAN {wan}, "
        f"latency {fleet['latency_ms']} ms",
        f"simulated steps: {p['steps']} ({p['wall_s']:.2f} s)",
        f"throughput: {p['groups_per_s']:.3f} groups/s, {p['steps_per_s']:.3f} steps/s",
        f"trainer idle fraction: {p['trainer_idle_fraction']:.3f}",
        f"staleness (trained groups by age): {ages}; mean {p['staleness_mean']:.3f}, "
        f"max {p['staleness_max']}",
        f"groups dropped as stale: {p['groups_dropped_stale']}",
        f"weight version to every worker: {p['weight_propagation_s']:.3f} s; "
        f"weight bytes on the WAN: {p['weight_bytes_on_wan']:,}",
    ]
    return "\n".join(lines) + "\n"


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "simulate",
        help="Predict a fleet's throughput, staleness and trainer idle time (a discrete-event "
        "simulation calibrated on a measured run)",
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--calibration",
        metavar="RUN_DIR",
        help="a run directory to measure the stage costs from (metrics.jsonl, "
        "generation_timeline.jsonl, logs/)",
    )
    parser.add_argument(
        "--workers", type=int, help="rollout workers (default: run.num_rollout_workers)"
    )
    parser.add_argument(
        "--sites", type=int, default=1, help="rollout sites the workers spread over"
    )
    parser.add_argument(
        "--scorers-per-site", type=int, help="scorers at each site (default: run.num_scorers)"
    )
    parser.add_argument(
        "--wan-mbit",
        type=float,
        help="bandwidth of each site's link to the trainer (default: none)",
    )
    parser.add_argument("--latency-ms", type=float, default=0.0, help="one-way WAN latency")
    parser.add_argument(
        "--patch-ratio",
        type=float,
        help="full bytes ÷ patch bytes when weight patches are enabled (docs/benchmarks.md)",
    )
    parser.add_argument(
        "--shared-cores",
        type=int,
        help="every role on one machine of this many cores (default: each role on its own)",
    )
    parser.add_argument(
        "--calibration-cores",
        type=int,
        help="the calibration run's roles shared this many cores (default: not simulated)",
    )
    parser.add_argument("--steps", type=int, help="steps to simulate (default: grpo.max_num_steps)")
    for name, text in _COST_HELP.items():
        kind = int if name.endswith("_bytes") else float
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, help=text)
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")
    parser.set_defaults(handler=_simulate)
