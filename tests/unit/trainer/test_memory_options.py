"""``policy.dtensor_cfg.activation_checkpointing`` recomputes each decoder layer in backward and
leaves the gradients as they were; ``cpu_offload`` needs FSDP2 ranks (its sharded run is checked
in test_data_parallel.py)."""

from __future__ import annotations

import pytest
import torch

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch

CHECKPOINTED = ["policy.dtensor_cfg.activation_checkpointing=true"]


def gradients_and_layer_calls(overrides: list[str]) -> tuple[dict[str, torch.Tensor], int, int]:
    """The gradients of one batch, how often decoder layer 0 (its MLP) ran, and the training
    passes."""
    config = load_config("configs/quickstart.yaml", BASE + overrides)
    model = tiny_model("qwen2")
    trainer = PolicyTrainer(model, config, torch.device("cpu"))
    calls = 0
    mlp = model.model.layers[0].mlp
    forward = mlp.forward

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        # Wrapping forward itself: module hooks do not run when checkpointing recomputes.
        nonlocal calls
        calls += 1
        return forward(*args, **kwargs)

    mlp.forward = counted
    batch = on_policy(varied_batch(), "qwen2")
    trainer.gradients(batch)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return grads, calls, len(trainer.plan(batch.to(trainer.device), "train"))


def test_checkpointing_recomputes_each_training_pass_and_keeps_the_gradients():
    plain, plain_calls, passes = gradients_and_layer_calls([])
    checkpointed, checkpointed_calls, _ = gradients_and_layer_calls(CHECKPOINTED)
    # One more forward of the layer per training micro-batch: its recomputation in backward
    # (the π_old and reference passes run without gradients, so nothing is recomputed there).
    assert checkpointed_calls - plain_calls == passes > 0
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_cpu_offload_without_ranks_is_refused():
    config = load_config("configs/quickstart.yaml", ["policy.dtensor_cfg.cpu_offload=true"])
    with pytest.raises(ValueError, match="cpu_offload offloads FSDP2 shards"):
        PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"))
