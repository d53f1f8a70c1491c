"""Launchers for clusters: an sbatch script for Slurm, manifests for Kubernetes
(``dockyard launch``, docs/deployment.md)."""
