#!/usr/bin/env bash
# Install llama-cpp-python from a local wheel cache, building the wheel once if the cache is empty.
#
# Why: llama-cpp-python ships only an sdist on PyPI; compiling it takes ~7-10 minutes on 2 cores.
# CI calls this script in its setup step and caches $DOCKYARD_WHEEL_CACHE between runs, so only
# the first run pays the build. The sdist is kept too (and unpacked) because it vendors
# llama.cpp's `convert_hf_to_gguf.py`, which the GGUF shell-out path and its tests use.
#
# Environment:
#   DOCKYARD_WHEEL_CACHE   cache dir (default: ~/.cache/dockyard/wheels)
#   LLAMA_CPP_PYTHON_VERSION  version to install (default below)
#   CMAKE_ARGS             forwarded to the build (default: portable CPU build, no -march=native,
#                          so a cached wheel also runs on another runner of the same OS/Python)
# Prints the unpacked llama.cpp source dir (usable as DOCKYARD_LLAMA_CPP_DIR) on the last line.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${DOCKYARD_WHEEL_CACHE:-$HOME/.cache/dockyard/wheels}"
PYTHON="${PYTHON:-python}"
SDIST_DIR="$CACHE/sdist"
SRC_DIR="$CACHE/src/llama_cpp_python-$VERSION"
mkdir -p "$CACHE" "$SDIST_DIR"

# llama-cpp-python loads its shared library with ctypes, so the wheel is tagged
# py3-none-<platform>: one cached wheel serves every Python version on the same platform.
PLATFORM_TAG="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))')"
wheel_in_cache() {
    ls "$CACHE"/llama_cpp_python-"$VERSION"-*-"$PLATFORM_TAG".whl 2>/dev/null | head -n 1
}

if ! ls "$SDIST_DIR"/llama_cpp_python-"$VERSION".tar.gz >/dev/null 2>&1; then
    "$PYTHON" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" \
        -d "$SDIST_DIR" >&2
fi
if [ ! -d "$SRC_DIR" ]; then
    mkdir -p "$CACHE/src"
    tar -xzf "$SDIST_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE/src"
fi

WHEEL="$(wheel_in_cache || true)"
if [ -z "$WHEEL" ]; then
    echo "ensure_llama_cpp: building llama-cpp-python $VERSION into $CACHE (several minutes)" >&2
    start=$(date +%s)
    export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF}"
    export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
    "$PYTHON" -m pip wheel --no-deps "$SDIST_DIR/llama_cpp_python-$VERSION.tar.gz" -w "$CACHE" >&2
    echo "ensure_llama_cpp: built in $(( $(date +%s) - start )) s" >&2
    WHEEL="$(wheel_in_cache)"
fi

if ! "$PYTHON" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
    # --no-deps for the wheel itself, then its small pure-python deps from the index; this keeps
    # pip from touching numpy/torch pins.
    "$PYTHON" -m pip install --no-deps "$WHEEL" >&2
    "$PYTHON" -m pip install "diskcache>=5.6.1" "jinja2>=2.11.3" "typing-extensions>=4.5.0" >&2
fi
echo "$SRC_DIR/vendor/llama.cpp"
