"""The Kubernetes manifests (deploy/k8s), rendered from a test config for every overlay and
validated offline against the Kubernetes API schemas (kubernetes-validate ships them; strict:
an unknown field is an error). No cluster runs here."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from dockyard.cli import main
from dockyard.launch.kubernetes import Overlay, OverlayError, load_overlay, render

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/overlay.yaml"))
# The oldest Kubernetes the manifests are written for (Indexed Jobs' completion index
# annotation and env var, Pod ordinals) among the versions the package ships.
KUBERNETES_VERSION = "1.31"


@functools.cache
def _rendered_text(overlay: str) -> str:
    """``dockyard launch kubernetes`` itself, as a user runs it."""
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "fleet.yaml"
        config = str(ROOT / "configs/quickstart.yaml")
        argv = ["launch", "kubernetes", "--config", config, "--overlay", overlay, "-o", str(out)]
        assert main(argv) == 0
        return out.read_text()


def _rendered(overlay: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(_rendered_text(overlay)) if d]


def _by_kind(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_schemas(overlay: str) -> None:
    documents = _rendered(overlay)
    assert len(documents) >= 10
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_fleet_has_every_role(overlay: str) -> None:
    documents = _rendered(overlay)
    spec = load_overlay(K8S / "overlays" / overlay / "overlay.yaml")
    assert {d["metadata"]["namespace"] for d in documents} == {spec.namespace}
    # NATS with JetStream's file store on a persistent volume
    nats = _by_kind(documents, "StatefulSet", "nats")
    assert nats["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "store"
    (broker,) = nats["spec"]["template"]["spec"]["containers"]
    assert broker["args"][:2] == ["broker", "up"] and "--store" in broker["args"]
    # the trainer: an Indexed Job of torchrun processes, one per node, rendezvous at index 0
    job = _by_kind(documents, "Job", "dockyard-trainer")
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == spec.trainer_nodes
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    args = trainer["args"]
    assert trainer["command"] == ["torchrun"]
    assert args[args.index("--nnodes") + 1] == str(spec.trainer_nodes)
    assert args[args.index("--nproc_per_node") + 1] == str(spec.trainer_gpus_per_node)
    assert args[args.index("--master_addr") + 1] == "dockyard-trainer-0.dockyard-trainer"
    assert f"cluster.num_nodes={spec.trainer_nodes}" in args
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == spec.trainer_gpus_per_node
    # rollout workers request GPUs; the scorer pool and the sandbox do not
    rollout = _by_kind(documents, "Deployment", "dockyard-rollout")
    assert rollout["spec"]["replicas"] == spec.rollout_replicas
    (worker,) = rollout["spec"]["template"]["spec"]["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == spec.rollout_gpus
    for name in ("dockyard-scorer", "dockyard-sandbox"):
        (container,) = _by_kind(documents, "Deployment", name)["spec"]["template"]["spec"][
            "containers"
        ]
        assert "nvidia.com/gpu" not in str(container.get("resources"))
    _by_kind(documents, "Service", "dockyard-sandbox")


def test_config_and_per_role_credentials() -> None:
    documents = _rendered("dev")
    config = _by_kind(documents, "ConfigMap", "dockyard-config")
    run = yaml.safe_load(config["data"]["run.yaml"])
    assert run["run"]["name"] == "quickstart"  # the resolved --config
    secret = _by_kind(documents, "Secret", "dockyard-credentials")
    for role, kind, name in [
        ("trainer", "Job", "dockyard-trainer"),
        ("rollout", "Deployment", "dockyard-rollout"),
        ("scorer", "Deployment", "dockyard-scorer"),
    ]:
        fragment = yaml.safe_load(secret["stringData"][f"{role}.yaml"])
        assert fragment["defaults"] == "/etc/dockyard/config/run.yaml"
        pod = _by_kind(documents, kind, name)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert f"/etc/dockyard/credentials/{role}.yaml" in container["args"]
        # each role mounts its own fragment only
        (volume,) = [v for v in pod["volumes"] if "secret" in v]
        assert [i["key"] for i in volume["secret"]["items"]] == [f"{role}.yaml"]
        # metrics annotated for Prometheus, on the port the role is told to serve
        annotations = _by_kind(documents, kind, name)["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert f"run.metrics_port={annotations['prometheus.io/port']}" in container["args"]


def test_images_come_from_the_overlay() -> None:
    images = {
        c["image"]
        for d in _rendered("production")
        for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    }
    assert all(image.startswith("ghcr.io/example/") for image in images), images


def test_an_overlay_with_an_unknown_key_is_refused() -> None:
    with pytest.raises(OverlayError, match="unknown keys"):
        Overlay.from_mapping({"trainers": {"nodes": 2}})
    with pytest.raises(OverlayError, match="at least 1"):
        render(K8S / "base", Overlay.from_mapping({"trainer": {"nodes": 0}}), "")
