"""LoRA under FSDP2 data parallelism: two gloo ranks under torchrun (real processes) train the
adapters of one peft model on their own prompt groups. The loss, the adapters' gradients and
grad norm equal one process's on the whole batch (float32); both ranks publish the same weight
event, equal to one process's after the same step; the checkpoint written from the shards holds
the merged model and resumes the adapter, sharded or in one process."""

from __future__ import annotations

import pytest
import torch

from dockyard.checkpoints.model_files import load_checkpoint_state_dict
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.consumers.trainer.ranks import TrainerRanks
from dockyard.consumers.trainer.trainer_checkpoint import read_checkpoint
from tests.unit.trainer.ranks_check import run_two_ranks
from tests.unit.trainer.test_lora_training import LORA
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("lora-dp")
    run_two_ranks("lora_dp_worker.py", out)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def one_process() -> PolicyTrainer:
    torch.manual_seed(0)  # the adapters' initialisation of rank 0, which every rank takes
    config = load_config("configs/quickstart.yaml", BASE + LORA)
    return PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"))


def assert_same_tensors(got: dict, expected: dict, **tolerance) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, msg=name, **tolerance)


@pytest.mark.slow
def test_two_lora_ranks_equal_one_process(ranks):
    _, (rank0, rank1) = ranks
    batch = on_policy(varied_batch(), "qwen2")
    trainer = one_process()
    initial = trainer.engine_weights()
    single = trainer.gradients(batch)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    outcome = trainer.step(batch)

    # Only the adapters train, on every rank, and every rank starts from rank 0's.
    assert rank0["trained_parameters"] == list(grads) and all(".lora_" in n for n in grads)
    assert_same_tensors(rank0["initial"], initial, rtol=0, atol=0)
    assert_same_tensors(rank1["initial"], initial, rtol=0, atol=0)
    assert rank0["loss"] + rank1["loss"] == pytest.approx(single.loss.loss, rel=1e-5, abs=1e-7)
    for rank in (rank0, rank1):
        assert_same_tensors(rank["grads"], grads, rtol=1e-4, atol=1e-6)
        assert rank["grad_norm"] == pytest.approx(outcome.grad_norm, rel=1e-5)
    # The weight event: the same bytes from either rank; one process's after the same step
    # (AdamW's first step is ±lr·sign(g) where |g| ≫ eps, so float noise in g moves it little).
    assert_same_tensors(rank1["adapter"], rank0["adapter"], rtol=0, atol=0)
    assert_same_tensors(rank0["adapter"], trainer.engine_weights(), rtol=1e-5, atol=1e-6)
    assert_same_tensors(rank0["merged"], trainer.model_state(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_sharded_lora_checkpoint_resumes_sharded_and_in_one_process(ranks):
    out, (rank0, rank1) = ranks
    # Sharded: both ranks publish the adapter the checkpoint was written from.
    assert_same_tensors(rank0["resumed"], rank0["adapter"], rtol=0, atol=0)
    assert_same_tensors(rank1["resumed"], rank0["adapter"], rtol=0, atol=0)
    # The model file holds the merged weights under the plain names.
    plain = load_checkpoint_state_dict(out / "ckpt")
    assert_same_tensors(
        {n: plain[n] for n in rank0["merged"] if n in plain},
        {n: t for n, t in rank0["merged"].items() if n in plain},
        rtol=0,
        atol=0,
    )
    # One process takes the adapter back from the PEFT files the shards wrote.
    resumed = one_process()
    checkpoint = read_checkpoint(out / "ckpt")
    TrainerRanks(resumed).load(checkpoint.weights, checkpoint.training_state, out / "ckpt")
    assert_same_tensors(resumed.engine_weights(), rank0["adapter"], rtol=0, atol=0)
