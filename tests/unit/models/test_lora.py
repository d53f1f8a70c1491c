"""LoRA adapters as the engines receive them: the merge is W₀ + B·A with B pre-scaled by α/r."""

from __future__ import annotations

import pytest
import torch

from dockyard.config.sections.policy import LoRAConfig
from dockyard.models.lora import adapter_for_engines, apply_lora, is_adapter, merge_adapter
from tests.unit.trainer.test_packing import tiny_model


def test_the_merge_adds_b_times_a_to_the_base_weight():
    base = {"proj.weight": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])}
    adapter = {
        "proj.lora_A.weight": torch.tensor([[1.0, 0.0, -1.0]]),  # rank 1, in 3
        "proj.lora_B.weight": torch.tensor([[2.0], [0.5]]),  # out 2, rank 1
    }
    merged = merge_adapter(base, adapter)
    # by hand: B·A = [[2, 0, -2], [0.5, 0, -0.5]]
    expected = torch.tensor([[3.0, 2.0, 1.0], [4.5, 5.0, 5.5]])
    assert torch.equal(merged["proj.weight"], expected)
    assert torch.equal(base["proj.weight"][0], torch.tensor([1.0, 2.0, 3.0]))  # base untouched


def test_an_adapter_that_does_not_fit_is_refused():
    base = {"proj.weight": torch.zeros(2, 3)}
    with pytest.raises(ValueError, match="B·A is 2×4"):
        merge_adapter(
            base, {"proj.lora_A.weight": torch.zeros(1, 4), "proj.lora_B.weight": torch.zeros(2, 1)}
        )
    with pytest.raises(ValueError, match="no such base weight, or A or B missing"):
        merge_adapter(base, {"proj.lora_A.weight": torch.zeros(1, 3)})


def test_an_adapter_is_told_from_weights_by_its_names():
    assert is_adapter({"a.lora_A.weight": torch.zeros(1), "a.lora_B.weight": torch.zeros(1)})
    assert not is_adapter({"a.lora_A.weight": torch.zeros(1), "a.weight": torch.zeros(1)})
    assert not is_adapter({})


def test_the_engines_b_carries_the_scaling():
    model = tiny_model("qwen2")
    apply_lora(model, LoRAConfig(enabled=True, rank=4, alpha=12.0, target_modules=["q_proj"]))
    layer = model.model.layers[0].self_attn.q_proj
    torch.nn.init.normal_(layer.lora_B["default"].weight)
    adapter = adapter_for_engines(model)
    name = "model.layers.0.self_attn.q_proj"
    assert torch.equal(adapter[f"{name}.lora_B.weight"], layer.lora_B["default"].weight * 3.0)
    assert torch.equal(adapter[f"{name}.lora_A.weight"], layer.lora_A["default"].weight)
    assert {n.rsplit(".lora_", 1)[0] for n in adapter} == {
        f"model.layers.{i}.self_attn.q_proj" for i in range(len(model.model.layers))
    }


def test_a_target_module_the_model_lacks_is_refused():
    with pytest.raises(ValueError, match=r"lora_cfg\.target_modules: .* no module named c_attn"):
        apply_lora(tiny_model("qwen2"), LoRAConfig(enabled=True, target_modules=["c_attn"]))
