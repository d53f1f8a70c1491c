#!/usr/bin/env bash
# The GPU check (issue 43): dockyard's trainer, refit and quickstart measured on one GPU, in
# ≤ 8 minutes on an H200-class machine with no network. The measuring code is Python in
# benchmarks/gpu_check*.py; this script only installs, orders, bounds and reports.
#
#   scripts/gpu_check.sh [--dry-run] [--out FILE] [--results DIR]
#
# Measures, each against a baseline in the same run (benchmarks/gpu_check.py):
#   1. PolicyTrainer's step on random Qwen2.5-0.5B / 1.5B-shaped models, bf16 autocast, float32
#      master weights, packed micro-batches: tokens/s, MFU, peak memory, ÷ a minimal loop;
#   2. the same with FSDP2 on one rank (NCCL) and with activation checkpointing;
#   3. the quickstart end to end (torch engine: vLLM's CUDA wheel is too large to carry), steps/s
#      against the CPU figure of docs/benchmarks.md;
#   4. sparse weight patches of the 1.5B model encoded and applied from the GPU (GB/s);
#   5. the packing, precision and loss-equality tests on cuda.
# --out FILE gets the Markdown block for docs/benchmarks.md ("On a GPU").
#
# The machine is assumed to have python 3.12 with a CUDA build of torch, transformers and peft,
# and nothing else: the other wheels are fetched beforehand, on a machine with network, by
# scripts/fetch_gpu_check_wheels.sh into .gpu-check-wheels/ (carried along with the tree), and
# installed here with no index. --dry-run runs every step on the CPU at toy sizes (a test runs
# it: tests/unit/test_gpu_check.py); it installs nothing and runs in the current environment.
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=""
out=""
results=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run="--dry-run" ;;
    --out) out="$2"; shift ;;
    --results) results="$2"; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
results="${results:-runs/gpu-check-$(date +%Y%m%d-%H%M%S)}"
out="${out:-$results/gpu_check.md}"
mkdir -p "$results"
python="${PYTHON:-python}"
# The repository itself (dockyard, tests) and the benchmarks' modules, without installing.
export PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
wheels=.gpu-check-wheels
# The wheels' install folder (git-ignored), ahead of site-packages; bin/ holds nats-server.
site=.gpu-check-site
export PYTHONPATH="$PWD/$site:$PYTHONPATH"
export PATH="$PWD/$site/bin:$PATH"
started=$(date +%s)
status=0

step() {  # step NAME SECONDS COMMAND...: run it bounded; a failure is reported, not fatal
  local name="$1" limit="$2"
  shift 2
  local t0
  t0=$(date +%s)
  echo "== $name (at most ${limit} s)"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "== $name: exit $rc after $(( $(date +%s) - t0 )) s"
  [ "$rc" -eq 0 ] || status=1
  return 0
}

if [ -z "$dry_run" ]; then
  "$python" - <<'PY' || exit 1
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch: nothing to check"
print("torch", torch.__version__, "CUDA", torch.version.cuda, "on", torch.cuda.get_device_name(0))
PY
  if [ -d "$wheels" ]; then
    # Into a folder of the tree, not the machine's environment: nothing to undo, no PEP 668
    # refusal of a system python. --no-deps: the folder holds exactly what is needed beyond
    # torch/transformers/peft (scripts/fetch_gpu_check_wheels.sh checked their requirements).
    step install 40 "$python" -m pip install --quiet --no-index --no-deps --upgrade \
      --target "$site" "$wheels"/*.whl
  else
    echo "no $wheels/ (scripts/fetch_gpu_check_wheels.sh): using what is installed" >&2
  fi
  # Budget, 8 minutes in all: ≈ 15 s for the checks around the steps, then at most these.
  step trainer-and-patches 200 "$python" benchmarks/gpu_check.py measure \
    --only trainer,patches --results "$results"
  step quickstart 100 "$python" benchmarks/gpu_check.py measure --only quickstart \
    --results "$results"
  step tests 120 "$python" benchmarks/gpu_check.py measure --only tests --results "$results"
else
  # The dry run collects the tests alongside the rest: on the CPU nothing is timed that matters.
  step tests 120 "$python" benchmarks/gpu_check.py measure --only tests --results "$results" \
    --dry-run &
  tests_pid=$!
  step measure 240 "$python" benchmarks/gpu_check.py measure --only trainer,patches,quickstart \
    --results "$results" --dry-run
  wait "$tests_pid" || status=1
  # The background step's status stays in its subshell: the report below names its row if
  # it is missing or failed, and fails with it.
fi

"$python" benchmarks/gpu_check.py report --results "$results" --out "$out" $dry_run || status=1
echo "gpu check: $(( $(date +%s) - started )) s, status $status; results in $results, block in $out"
exit "$status"
