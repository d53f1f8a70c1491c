"""Kubernetes manifests for a fleet: the plain-YAML base in ``deploy/k8s/base`` with an overlay
applied (``deploy/k8s/overlays/<name>/overlay.yaml``) and the run's resolved config in its
ConfigMap.

Why not kustomize or Helm: both need a binary this project cannot assume, and the base is
dockyard's own, so the few things an overlay changes are named here (namespace, images,
replicas, the trainer's nodes and GPUs, storage sizes) rather than patched generically. The
output is ordinary YAML for ``kubectl apply -f -``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Manifest = dict[str, Any]

# Objects the overlay's settings apply to, by kind and name in the base.
TRAINER_JOB = ("Job", "dockyard-trainer")
ROLLOUT = ("Deployment", "dockyard-rollout")
SCORER = ("Deployment", "dockyard-scorer")
SANDBOX = ("Deployment", "dockyard-sandbox")
BROKER = ("StatefulSet", "nats")
RUNS_PVC = ("PersistentVolumeClaim", "dockyard-runs")
CONFIG_MAP = ("ConfigMap", "dockyard-config")


class OverlayError(ValueError):
    """An overlay that names something the base does not have, or a value out of range."""


@dataclass(frozen=True)
class Overlay:
    namespace: str = "dockyard"
    images: dict[str, str] = field(default_factory=dict)
    trainer_nodes: int = 1
    trainer_gpus_per_node: int = 1
    rollout_replicas: int = 1
    rollout_gpus: int = 1
    scorer_replicas: int = 1
    sandbox_replicas: int = 1
    nats_storage: str | None = None
    runs_storage: str | None = None

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> Overlay:
        known = {"namespace", "images", "trainer", "rollout", "scorer", "sandbox", "storage"}
        if unknown := set(data) - known:
            raise OverlayError(f"overlay: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        trainer = data.get("trainer", {})
        rollout = data.get("rollout", {})
        storage = data.get("storage", {})
        overlay = cls(
            namespace=str(data.get("namespace", "dockyard")),
            images={str(k): str(v) for k, v in data.get("images", {}).items()},
            trainer_nodes=int(trainer.get("nodes", 1)),
            trainer_gpus_per_node=int(trainer.get("gpus_per_node", 1)),
            rollout_replicas=int(rollout.get("replicas", 1)),
            rollout_gpus=int(rollout.get("gpus", 1)),
            scorer_replicas=int(data.get("scorer", {}).get("replicas", 1)),
            sandbox_replicas=int(data.get("sandbox", {}).get("replicas", 1)),
            nats_storage=storage.get("nats"),
            runs_storage=storage.get("runs"),
        )
        for name in ("trainer_nodes", "trainer_gpus_per_node", "rollout_gpus"):
            if getattr(overlay, name) < 1:
                raise OverlayError(f"overlay: {name} must be at least 1")
        return overlay


def load_base(base_dir: Path) -> list[Manifest]:
    documents: list[Manifest] = []
    for path in sorted(base_dir.glob("*.yaml")):
        documents.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return documents


def _find(documents: list[Manifest], key: tuple[str, str]) -> Manifest:
    for document in documents:
        if (document["kind"], document["metadata"]["name"]) == key:
            return document
    raise OverlayError(f"the base has no {key[0]} {key[1]}")


def _containers(document: Manifest) -> list[dict[str, Any]]:
    spec = document.get("spec", {})
    pod = spec.get("template", {}).get("spec", {})
    containers: list[dict[str, Any]] = pod.get("containers", [])
    return containers


def _set_flag(args: list[str], flag: str, value: str) -> None:
    index = args.index(flag)  # the base's torchrun command names every flag set here
    args[index + 1] = value


def render(
    base_dir: Path, overlay: Overlay, config_yaml: str, cluster_overrides: bool = True
) -> list[Manifest]:
    """The base with ``overlay`` applied and ``config_yaml`` (a resolved config) as run.yaml."""
    documents = copy.deepcopy(load_base(base_dir))
    for document in documents:
        document["metadata"]["namespace"] = overlay.namespace
        for container in _containers(document):
            container["image"] = overlay.images.get(container["image"], container["image"])

    _find(documents, CONFIG_MAP)["data"]["run.yaml"] = config_yaml

    job = _find(documents, TRAINER_JOB)
    job["spec"]["completions"] = overlay.trainer_nodes
    job["spec"]["parallelism"] = overlay.trainer_nodes
    (trainer,) = _containers(job)
    _set_flag(trainer["args"], "--nnodes", str(overlay.trainer_nodes))
    _set_flag(trainer["args"], "--nproc_per_node", str(overlay.trainer_gpus_per_node))
    trainer["resources"]["limits"]["nvidia.com/gpu"] = overlay.trainer_gpus_per_node
    if cluster_overrides:
        # the trainer checks torchrun's world against cluster.* (docs/trainer.md)
        trainer["args"] += [
            f"cluster.num_nodes={overlay.trainer_nodes}",
            f"cluster.gpus_per_node={overlay.trainer_gpus_per_node}",
        ]

    rollout = _find(documents, ROLLOUT)
    rollout["spec"]["replicas"] = overlay.rollout_replicas
    (worker,) = _containers(rollout)
    worker["resources"]["limits"]["nvidia.com/gpu"] = overlay.rollout_gpus
    _find(documents, SCORER)["spec"]["replicas"] = overlay.scorer_replicas
    _find(documents, SANDBOX)["spec"]["replicas"] = overlay.sandbox_replicas
    if overlay.nats_storage:
        claim = _find(documents, BROKER)["spec"]["volumeClaimTemplates"][0]
        claim["spec"]["resources"]["requests"]["storage"] = overlay.nats_storage
    if overlay.runs_storage:
        runs = _find(documents, RUNS_PVC)
        runs["spec"]["resources"]["requests"]["storage"] = overlay.runs_storage
    return documents


def load_overlay(path: Path) -> Overlay:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise OverlayError(f"{path}: an overlay is a mapping")
    return Overlay.from_mapping(data)


def to_yaml(documents: list[Manifest]) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False)
