#!/usr/bin/env bash
# Install bubblewrap (Debian's `bubblewrap`), which gives every sandboxed run its namespaces,
# private /tmp and /dev/shm and no-new-privileges (docs/operations.md, "Isolation of one run").
# A no-op when bwrap is on PATH; installing needs root and apt (Debian/Ubuntu).
set -euo pipefail
if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_bwrap.sh: bwrap is missing; install the bubblewrap package (needs root and apt)" >&2
    exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap
bwrap --version
