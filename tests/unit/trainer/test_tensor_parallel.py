"""Tensor parallelism (``policy.dtensor_cfg.tensor_parallel_size=2``), with and without sequence
parallelism: two gloo ranks under torchrun (real processes) split each decoder layer's
projections (and, sequence parallel, the activations between blocks by position); the loss, the
whole gradients, the grad norm and the parameters after one AdamW step equal the single-process
trainer's on the same batch (float32), and the gathered weights are the unsharded blob, byte
for byte."""

from __future__ import annotations

import pytest
import torch

from dockyard.broker.weight_blobs.base import digest_of_bytes, tensors_to_bytes
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.consumers.trainer.tensor_parallel import check_divisible
from tests.unit.trainer.ranks_check import assert_first_step_params_close, run_two_ranks
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch
from tests.unit.trainer.tp_worker import LAYOUTS, SP, TP2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    run_two_ranks("tp_worker.py", out)
    return {name: torch.load(out / f"{name}.pt", weights_only=False) for name in LAYOUTS}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_tensor_parallel_ranks_equal_one_process(ranks, layout):
    batch = on_policy(varied_batch(), "qwen2")
    model = tiny_model("qwen2")
    # One process runs without sequence parallelism (it splits nothing there): the split step
    # must equal the plain one.
    one_process = [o for o in LAYOUTS[layout] if o not in SP]
    config = load_config("configs/quickstart.yaml", BASE + one_process)
    trainer = PolicyTrainer(model, config, torch.device("cpu"))
    digest = digest_of_bytes(tensors_to_bytes(trainer.model_state()))
    single = trainer.gradients(batch)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    outcome = trainer.step(batch)

    split = ranks[layout]
    assert split["sharded"]  # q_proj's weight is a DTensor: the plan was applied
    assert split["norm_replicated"] == layout.endswith("_sp")
    assert split["digest"] == digest
    assert split["loss"] == pytest.approx(single.loss.loss, rel=1e-5, abs=1e-7)
    for name, grad in grads.items():
        torch.testing.assert_close(split["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert split["grad_norm"] == pytest.approx(outcome.grad_norm, rel=1e-5)
    params = {name: p.detach() for name, p in model.named_parameters()}
    assert_first_step_params_close(split["params"], params, grads, config.policy.optimizer.eps)


def test_a_size_that_does_not_divide_the_heads_is_refused():
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide"):
        check_divisible(tiny_model("qwen2").config, 3)


def test_tensor_parallel_needs_its_ranks():
    config = load_config("configs/quickstart.yaml", BASE + TP2)
    with pytest.raises(ValueError, match="mesh has 1 tensor-parallel rank"):
        PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"))
