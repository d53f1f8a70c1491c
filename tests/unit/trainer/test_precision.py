"""``policy.precision``: float32 master weights, the forward in the compute precision, float16
loss scaling undone before clipping (the usual mixed-precision policy, dockyard.models.devices).
On the machine's training device: the CPU here, CUDA where torch sees a GPU."""

from __future__ import annotations

import pytest
import torch

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch

# The CPU always; a GPU too where there is one (scripts/gpu_check.sh).
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def trainer_in(precision: str, model: torch.nn.Module) -> PolicyTrainer:
    config = load_config("configs/quickstart.yaml", [*BASE, f"policy.precision={precision}"])
    return PolicyTrainer(model, config, device=DEVICE)


def record_logits_dtype(model: torch.nn.Module) -> list[torch.dtype]:
    seen: list[torch.dtype] = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    return seen


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_master_weights_stay_float32_and_the_forward_runs_in_the_precision(precision):
    model = tiny_model("qwen2").to(torch.bfloat16)  # as a low-precision checkpoint loads
    trainer = trainer_in(precision, model)
    seen = record_logits_dtype(model)
    trainer.step(on_policy(varied_batch(), "qwen2"))
    expected = getattr(torch, precision)
    assert seen and all(dtype == expected for dtype in seen)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    state = trainer.optimizer.state[next(iter(model.parameters()))]
    assert state["exp_avg"].dtype == torch.float32


def test_float16_gradients_are_unscaled_before_clipping():
    batch = on_policy(varied_batch(), "qwen2")
    reference = trainer_in("float32", tiny_model("qwen2")).step(batch).grad_norm
    trainer = trainer_in("float16", tiny_model("qwen2"))
    assert trainer.scaler.is_enabled() and trainer.scaler.get_scale() > 1
    half = trainer.step(batch).grad_norm
    # Scaled gradients would be ~65536× larger; float16 rounding moves the norm by a few %.
    assert half == pytest.approx(reference, rel=0.05)


def test_float32_runs_in_float32_without_loss_scaling():
    model = tiny_model("qwen2")
    trainer = trainer_in("float32", model)
    seen = record_logits_dtype(model)
    trainer.step(on_policy(varied_batch(), "qwen2"))
    assert seen and all(dtype == torch.float32 for dtype in seen)
    assert not trainer.scaler.is_enabled()
