"""``dockyard launch``: write what starts a whole fleet on a cluster — an sbatch script
(``launch slurm``) or Kubernetes manifests (``launch kubernetes``). Nothing is submitted: the
output is a file to read and then hand to ``sbatch`` or ``kubectl apply``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dockyard.commands._cli import CliError, CommandRegistrar, add_config_arguments, add_subcommands
from dockyard.commands._common import load_config_report_or_exit
from dockyard.launch.slurm import BROKER_PORT, RENDEZVOUS_PORT
from dockyard.utils.private_files import private_dir

EXIT_INVALID = 2
# deploy/ is part of the repository, not the package: found beside an editable install.
DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy"


def _write(text: str, output: str | None) -> None:
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    Path(output).write_text(text)
    print(f"wrote {output}", file=sys.stderr)


def _slurm(args: argparse.Namespace) -> int:
    from dockyard.launch.slurm import SlurmFleet, SlurmPlanError, render_sbatch

    config = load_config_report_or_exit(args).config  # refused here, not on the cluster
    run_dir = args.run_dir or str(Path(config.run.output_dir).resolve() / config.run.name)
    fleet = SlurmFleet(
        config_path=str(Path(args.config).resolve()),
        overrides=tuple(args.overrides),
        run_dir=run_dir,
        job_name=args.job_name or f"dockyard-{config.run.name}",
        nodes=args.nodes,
        trainer_nodes=args.trainer_nodes,
        gpus_per_node=args.gpus_per_node,
        gpus_per_worker=args.gpus_per_worker,
        workers_per_node=args.workers_per_node,
        scorers=args.scorers,
        broker_url=args.broker_url,
        partition=args.partition,
        account=args.account,
        time_limit=args.time,
        broker_port=args.broker_port,
        rendezvous_port=args.rendezvous_port,
    )
    try:
        script = render_sbatch(fleet)
    except SlurmPlanError as error:
        raise CliError(str(error), exit_code=EXIT_INVALID) from None
    # Slurm opens the batch script's --output (RUN_DIR/logs/sbatch-%j.out) before the script
    # runs, so the directory must exist when the job starts.
    private_dir(Path(run_dir))
    private_dir(Path(run_dir) / "logs")
    _write(script, args.output)
    return 0


def _kubernetes(args: argparse.Namespace) -> int:
    import yaml

    from dockyard.launch.kubernetes import OverlayError, load_overlay, render, to_yaml

    config = load_config_report_or_exit(args).config
    overlay_path = Path(args.overlay)
    if not overlay_path.exists():
        overlay_path = Path(args.deploy_dir) / "k8s" / "overlays" / args.overlay / "overlay.yaml"
    try:
        overlay = load_overlay(overlay_path)
        resolved = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
        documents = render(Path(args.deploy_dir) / "k8s" / "base", overlay, resolved)
    except (OverlayError, OSError) as error:
        raise CliError(str(error), exit_code=EXIT_INVALID) from None
    _write(to_yaml(documents), args.output)
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "launch", help="Write what starts a fleet on a cluster: an sbatch script or manifests"
    )
    commands = add_subcommands(parser, dest="launch_command")

    slurm = commands.add("slurm", help="An sbatch script for the whole fleet in one allocation")
    add_config_arguments(slurm)
    slurm.add_argument("--nodes", type=int, required=True, help="nodes in the allocation")
    slurm.add_argument("--trainer-nodes", type=int, default=1, help="of them, for the trainer")
    slurm.add_argument(
        "--gpus-per-node", type=int, default=0, help="GPUs on each node (0: a CPU cluster)"
    )
    slurm.add_argument(
        "--gpus-per-worker", type=int, default=1, help="GPUs of one rollout worker (its TP size)"
    )
    slurm.add_argument(
        "--workers-per-node",
        type=int,
        default=1,
        help="rollout workers on each rollout node when there are no GPUs",
    )
    slurm.add_argument("--scorers", type=int, default=1, help="scorers, on the first node")
    slurm.add_argument(
        "--broker-url", help="an existing broker (nats://...); default: one on the first node"
    )
    slurm.add_argument(
        "--broker-port", type=int, default=BROKER_PORT, help="the broker's, on the first node"
    )
    slurm.add_argument(
        "--rendezvous-port",
        type=int,
        default=RENDEZVOUS_PORT,
        help="torchrun's c10d rendezvous, on the first node",
    )
    slurm.add_argument("--run-dir", help="on a shared filesystem; default: run.output_dir/name")
    slurm.add_argument("--job-name")
    slurm.add_argument("--partition")
    slurm.add_argument("--account")
    slurm.add_argument("--time", help="the job's time limit (sbatch --time)")
    slurm.add_argument("--output", "-o", help="the script's path (default: stdout)")
    slurm.set_defaults(handler=_slurm)

    kubernetes = commands.add(
        "kubernetes", help="Kubernetes manifests: deploy/k8s/base with an overlay and the config"
    )
    add_config_arguments(kubernetes)
    kubernetes.add_argument(
        "--overlay", default="dev", help="an overlay's name under deploy/k8s/overlays, or a path"
    )
    kubernetes.add_argument("--deploy-dir", default=str(DEPLOY_DIR), help=argparse.SUPPRESS)
    kubernetes.add_argument("--output", "-o", help="the manifests' path (default: stdout)")
    kubernetes.set_defaults(handler=_kubernetes)
