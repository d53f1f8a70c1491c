#!/usr/bin/env bash
# GPU check for the trainer (issue #21): run it on a machine with a CUDA GPU. Never required by
# the test suite, which stays CPU-only. Record what it prints in docs/benchmarks.md.
#
#   scripts/gpu_check.sh [RUN_DIR]
#
# 1. the trainer's packing, dynamic-batching and precision tests (the trainer picks cuda:0 when
#    torch sees a GPU, so they run there: packed/dynamic loss and gradients equal the padded ones,
#    float32 master weights, bf16/fp16 autocast, fp16 loss scaling);
# 2. a short quickstart-sized run (30 GRPO steps); its trainer log must say device=cuda:0.
set -euo pipefail
cd "$(dirname "$0")/.."
run_dir="${1:-runs/gpu-check-$(date +%Y%m%d-%H%M%S)}"

python - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch: nothing to check"
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))
PY

python -m pytest -q tests/unit/trainer/test_packing.py tests/unit/trainer/test_precision.py

started=$(date +%s)
python -m dockyard run --config configs/quickstart.yaml --run-dir "$run_dir" \
  grpo.max_num_steps=30 policy.precision=bfloat16
echo "quickstart (30 steps, bf16 autocast): $(( $(date +%s) - started )) s, run dir $run_dir"
grep -h '"trainer.placement"' "$run_dir"/logs/*.log | head -1
grep -qh '"device": "cuda:0"' "$run_dir"/logs/*.log || {
  echo "the trainer did not run on cuda:0" >&2
  exit 1
}
