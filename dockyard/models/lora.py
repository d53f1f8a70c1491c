"""LoRA adapters (``policy.dtensor_cfg.lora_cfg``) with ``peft``: what the trainer trains, what the
engines receive, and how they merge it.

The trainer injects LoRA layers into the policy in place (:func:`apply_lora`): every target
projection ``W`` becomes ``W + (α/r)·B·A`` with ``W`` frozen and ``A`` (``r × in``), ``B``
(``out × r``, zero at start) trained. The model object stays the Hugging Face one, so every
forward pass of the trainer (π_old, the loss, validation) goes through the adapters.

What the engines receive (:func:`adapter_for_engines`): ``<module>.lora_A.weight`` and
``<module>.lora_B.weight`` for each target module, with ``B`` already multiplied by ``α/r`` — a
receiver merges ``W = W₀ + B·A`` knowing nothing of the config (:func:`merge_adapter`, onto the
base weights it loaded itself, never onto a previous merge). The base model never changes under
LoRA, so this is the whole policy.

Checkpoints hold the merged weights under the model's own names (what ``dockyard export hf``
turns into a Hugging Face model: the adapter merged) and the adapter in PEFT's format
(``adapter_model.safetensors`` + ``adapter_config.json``, loadable by ``peft`` and vLLM), from
which a resumed trainer takes its adapter back.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from dockyard.config.sections.policy import LoRAConfig

if TYPE_CHECKING:  # peft is imported where it is used: the engines merge without it
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

ADAPTER_NAME = "default"
_A, _B = ".lora_A.weight", ".lora_B.weight"
#: PEFT's file of adapter weights in a directory written by ``PeftModel.save_pretrained``.
PEFT_ADAPTER_FILE = "adapter_model.safetensors"


class _LoadResult(Protocol):
    """What ``load_state_dict`` (and peft's wrapper of it) reports."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def apply_lora(model: torch.nn.Module, config: LoRAConfig) -> PeftModel:
    """Inject LoRA layers into ``model`` (in place; the base weights are frozen). Refuses target
    modules the model does not have (peft would silently match nothing for some)."""
    from peft import LoraConfig, get_peft_model

    peft_config = LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,  # type: ignore[arg-type]  # peft says int; it divides a float
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
    )
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(config.target_modules) - names)
    if missing:
        raise ValueError(
            f"policy.dtensor_cfg.lora_cfg.target_modules: {type(model).__name__} has no module "
            f"named {', '.join(missing)}"
        )
    return get_peft_model(model, peft_config, adapter_name=ADAPTER_NAME)


def lora_layers(model: torch.nn.Module) -> dict[str, LoraLayer]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def adapter_for_engines(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter as the engines receive it: ``A`` and ``α/r``-scaled ``B`` by module name."""
    state: dict[str, torch.Tensor] = {}
    for name, layer in lora_layers(model).items():
        a = _weight(layer.lora_A[ADAPTER_NAME]).detach()
        b = _weight(layer.lora_B[ADAPTER_NAME]).detach()
        state[name + _A] = a
        state[name + _B] = b * layer.scaling[ADAPTER_NAME]
    return state


def _weight(module: torch.nn.Module) -> torch.Tensor:
    """``module.weight``, which torch types as a tensor or a submodule."""
    weight = module.weight
    if not isinstance(weight, torch.Tensor):
        raise TypeError(
            f"{type(module).__name__}.weight is a {type(weight).__name__}, not a tensor"
        )
    return weight


def is_adapter(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether a weight blob is an adapter (every name an ``A`` or ``B``) rather than weights."""
    return bool(state) and all(name.endswith((_A, _B)) for name in state)


def merge_adapter(
    base: Mapping[str, torch.Tensor], adapter: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``{<module>.weight: W₀ + B·A}`` for every module of ``adapter`` (new tensors, in the base's
    dtype; the sum is taken in float32). Refuses an adapter that does not fit the base."""
    merged: dict[str, torch.Tensor] = {}
    modules = {name.removesuffix(_A).removesuffix(_B) for name in adapter}
    for module in sorted(modules):
        weight = base.get(module + ".weight")
        a, b = adapter.get(module + _A), adapter.get(module + _B)
        if weight is None or a is None or b is None:
            raise ValueError(f"adapter for {module}: no such base weight, or A or B missing")
        if (b.shape[0], a.shape[1]) != tuple(weight.shape) or a.shape[0] != b.shape[1]:
            raise ValueError(
                f"adapter for {module}: B·A is {b.shape[0]}×{a.shape[1]} (rank {a.shape[0]} vs "
                f"{b.shape[1]}), the base weight {tuple(weight.shape)}"
            )
        delta = b.float() @ a.float()
        merged[module + ".weight"] = (weight.float() + delta.to(weight.device)).to(weight.dtype)
    return merged


def merged_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model with its adapters merged, under the model's own (pre-LoRA) names."""
    layers = lora_layers(model)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if ".lora_" in name:
            continue
        state[name.replace(".base_layer.", ".")] = tensor
    base = {f"{name}.weight": _weight(layer.get_base_layer()) for name, layer in layers.items()}
    state.update(merge_adapter(base, adapter_for_engines(model)))
    return state


def save_peft_adapter(peft_model: PeftModel, directory: Path) -> None:
    """The adapter in PEFT's own format (for resuming, ``peft``, vLLM's ``enable_lora``)."""
    peft_model.save_pretrained(str(directory), safe_serialization=True)


def load_peft_adapter(peft_model: PeftModel, directory: Path) -> None:
    """An adapter written by :func:`save_peft_adapter` back into ``peft_model``; strict."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(directory / PEFT_ADAPTER_FILE)
    # peft annotates the result as `namedtuple` (a function): name the fields read here.
    result: _LoadResult = set_peft_model_state_dict(peft_model, state, adapter_name=ADAPTER_NAME)
    lora_missing = [name for name in result.missing_keys if ".lora_" in name]
    if lora_missing or result.unexpected_keys:
        raise ValueError(
            f"{directory}: adapter does not match the model (missing {lora_missing[:3]}, "
            f"unexpected {list(result.unexpected_keys)[:3]})"
        )
