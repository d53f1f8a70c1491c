"""Context parallelism (``policy.dtensor_cfg.context_parallel_size=2``): two gloo ranks under
torchrun (real processes) each run the model on half of every sequence's positions, with the
all-gather-KV attention; π_old, the loss, the whole gradients, the grad norm and the parameters
after one AdamW step equal the single-process trainer's on the same batch (float32)."""

from __future__ import annotations

import pytest
import torch

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from tests.unit.trainer.cp_worker import CP2
from tests.unit.trainer.ranks_check import run_two_ranks
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp")
    run_two_ranks("cp_worker.py", out)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def one_process():
    batch = on_policy(varied_batch(), "qwen2")
    model = tiny_model("qwen2")
    config = load_config("configs/quickstart.yaml", BASE)
    trainer = PolicyTrainer(model, config, torch.device("cpu"))
    result = trainer.gradients(batch)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    outcome = trainer.step(batch)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return result, grads, outcome, params, config


@pytest.mark.parametrize("rank", [0, 1])
def test_two_context_parallel_ranks_equal_one_process(ranks, one_process, rank):
    result, grads, outcome, params, config = one_process
    split = ranks[rank]
    assert split["attention"] == "dockyard_context_parallel"  # the split attention ran
    # π_old of every real next-token target (a padding column's value depends on how padding is
    # masked, which no loss term reads: the token mask is 0 there).
    real = varied_batch().attention_mask[:, 1:].bool()
    torch.testing.assert_close(
        split["prev"][real], result.prev_logprobs[real], rtol=1e-5, atol=1e-6
    )
    assert split["loss"] == pytest.approx(result.loss.loss, rel=1e-5, abs=1e-7)
    for name, grad in grads.items():
        torch.testing.assert_close(split["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert split["grad_norm"] == pytest.approx(outcome.grad_norm, rel=1e-5)
    # As in test_tensor_parallel: AdamW's first step is lr·g/(|g|+eps), so parameters are
    # compared tightly where |g| ≥ 100·eps (elsewhere float noise in g moves the step by ~lr).
    eps = config.policy.optimizer.eps
    compared = 0
    for name, param in params.items():
        clear = grads[name].abs() >= 100 * eps
        compared += int(clear.sum())
        torch.testing.assert_close(split["params"][name][clear], param[clear], rtol=1e-5, atol=1e-8)
    assert compared > 0.9 * sum(p.numel() for p in params.values())


def test_context_parallelism_needs_its_ranks():
    config = load_config("configs/quickstart.yaml", BASE + CP2)
    with pytest.raises(ValueError, match="mesh has 1 context-parallel rank"):
        PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"))
