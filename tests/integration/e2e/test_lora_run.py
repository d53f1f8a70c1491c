"""A LoRA run over a real nats-server: the trainer publishes adapters, the torch engine of the
rollout worker refits from them, every group is trained once, and the checkpoint exports to a
Hugging Face model with the adapter merged."""

from __future__ import annotations

import pytest

from tests.integration.e2e.conftest import QUICKSTART, run_dockyard
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps
from tests.integration.e2e.test_end_to_end import assert_checkpoint_exports_to_hf, json_events

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("ranks", "tensor_parallel"), [(1, 1), (2, 1), (2, 2)], ids=["one", "fsdp2", "tp2"]
)
def test_a_lora_run_refits_the_workers_from_adapters(tmp_path, small_run, ranks, tensor_parallel):
    """With two trainer ranks (FSDP2 over the peft model, or one tensor-parallel group over its
    split projections), rank 0 gathers the adapter for each weight event and the whole state for
    the checkpoint; the other rank joins both."""
    run_dir = tmp_path / "run"
    result = run_dockyard(
        "run",
        "--config",
        str(QUICKSTART),
        *small_run,
        "grpo.max_num_steps=2",
        "policy.dtensor_cfg.lora_cfg.enabled=true",
        f"policy.dtensor_cfg.tensor_parallel_size={tensor_parallel}",
        *(["--trainer-ranks", str(ranks)] if ranks > 1 else []),
        "--run-dir",
        str(run_dir),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert metric_steps(run_dir) == [1, 2]
    assert len(assert_exactly_once(run_dir)) == 2 * 4
    placements = [
        e
        for e in json_events(run_dir / "logs" / "trainer.log")
        if e["event"] == "trainer.placement"
    ]
    assert [e["lora_rank"] for e in placements] == [8] * ranks
    assert [(e["data_parallel_ranks"], e["tensor_parallel_ranks"]) for e in placements] == [
        (ranks // tensor_parallel, tensor_parallel)
    ] * ranks
    refits = [
        e for e in json_events(run_dir / "logs" / "rollout-0.log") if e["event"] == "refit.done"
    ]
    assert {e["version"] for e in refits} >= {0, 1}  # the first adapter and a trained one
    checkpoint = run_dir / "checkpoints" / "step_2"
    assert (checkpoint / "adapter" / "adapter_model.safetensors").is_file()
    assert_checkpoint_exports_to_hf(checkpoint, tmp_path / "hf")
