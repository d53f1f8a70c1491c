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

from collections.abc import Collection, Mapping
from dataclasses import dataclass
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
PEFT_CONFIG_FILE = "adapter_config.json"
#: What ``get_peft_model`` puts before the wrapped model's own parameter names.
_PEFT_PREFIX = "base_model.model."


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
        lora_alpha=config.alpha,  # type: ignore[arg-type]  # peft annotates int; a float works
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


def lora_scalings(model: torch.nn.Module) -> dict[str, float]:
    """``{<module>: α/r}`` for every LoRA layer of ``model``."""
    return {name: float(layer.scaling[ADAPTER_NAME]) for name, layer in lora_layers(model).items()}


def adapter_from_state(
    state: Mapping[str, torch.Tensor], scalings: Mapping[str, float]
) -> dict[str, torch.Tensor]:
    """The adapter as the engines receive it, from the LoRA model's state dict (whole tensors:
    one process's own, or a sharded model's gathered): ``A`` and ``α/r``-scaled ``B``."""
    adapter: dict[str, torch.Tensor] = {}
    for module, scaling in scalings.items():
        a = state[f"{module}.lora_A.{ADAPTER_NAME}.weight"]
        b = state[f"{module}.lora_B.{ADAPTER_NAME}.weight"]
        adapter[module + _A] = a.detach()
        adapter[module + _B] = b.detach() * scaling
    return adapter


def adapter_for_engines(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter as the engines receive it: ``A`` and ``α/r``-scaled ``B`` by module name."""
    return adapter_from_state(model.state_dict(), lora_scalings(model))


def is_adapter(names: Collection[str]) -> bool:
    """Whether a weight blob (its tensor names, or the blob itself) is an adapter (every name an
    ``A`` or ``B``) rather than weights."""
    return bool(names) and all(name.endswith((_A, _B)) for name in names)


def adapter_rank(adapter: Mapping[str, torch.Tensor]) -> int:
    """The rank of an adapter as the engines receive it (every ``A`` has it as its rows)."""
    ranks = {tensor.shape[0] for name, tensor in adapter.items() if name.endswith(_A)}
    if len(ranks) != 1:
        raise ValueError(f"adapter with A matrices of ranks {sorted(ranks)}: one rank expected")
    return ranks.pop()


def write_engine_adapter(adapter: Mapping[str, torch.Tensor], directory: Path) -> None:
    """An adapter as the engines receive it, written in PEFT's format for an engine that loads
    adapters itself (vLLM's ``LoRARequest``). ``B`` carries ``α/r`` already, so the config says
    ``lora_alpha = r``: the loader's own scaling ``α/r`` is then 1."""
    import json

    from safetensors.torch import save_file

    rank = adapter_rank(adapter)
    modules = sorted({name.rsplit(".lora_", 1)[0] for name in adapter})
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {_PEFT_PREFIX + name: t.detach().contiguous() for name, t in adapter.items()},
        str(directory / PEFT_ADAPTER_FILE),
    )
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted({module.rsplit(".", 1)[-1] for module in modules}),
        "task_type": "CAUSAL_LM",
    }
    (directory / PEFT_CONFIG_FILE).write_text(json.dumps(config, indent=1))


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


def merged_from_state(
    state: Mapping[str, torch.Tensor], scalings: Mapping[str, float]
) -> dict[str, torch.Tensor]:
    """The whole model with its adapters merged, under the model's own (pre-LoRA) names, from the
    LoRA model's state dict (whole tensors)."""
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        merged[name.replace(".base_layer.", ".")] = tensor
    base = {f"{module}.weight": merged[f"{module}.weight"] for module in scalings}
    merged.update(merge_adapter(base, adapter_from_state(state, scalings)))
    return merged


def merged_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model with its adapters merged, under the model's own (pre-LoRA) names."""
    return merged_from_state(model.state_dict(), lora_scalings(model))


def peft_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The LoRA tensors of a LoRA model's state dict, named as in its ``PeftModel``'s (what
    ``PeftModel.save_pretrained(state_dict=...)`` takes)."""
    return {_PEFT_PREFIX + name: t for name, t in state.items() if ".lora_" in name}


def save_peft_adapter(
    peft_model: PeftModel, directory: Path, state: Mapping[str, torch.Tensor] | None = None
) -> None:
    """The adapter in PEFT's own format (for resuming, ``peft``, vLLM's ``enable_lora``).

    ``state``: its whole tensors (:func:`peft_state`), for a sharded model whose parameters are
    DTensors that only a collective of every rank could gather; default: the model's own."""
    peft_model.save_pretrained(
        str(directory),
        safe_serialization=True,
        state_dict=dict(state) if state is not None else None,
    )


@dataclass(frozen=True)
class PeftCheckpoint:
    """What a checkpoint writes of a LoRA policy in PEFT's format: ``state`` as for
    :func:`save_peft_adapter`."""

    model: PeftModel
    state: Mapping[str, torch.Tensor] | None = None

    def save(self, directory: Path) -> None:
        save_peft_adapter(self.model, directory, self.state)


def adapter_tensors(peft_model: PeftModel, directory: Path) -> dict[str, torch.Tensor]:
    """An adapter written by :func:`save_peft_adapter`, named as in the wrapped model's own state
    dict (``<module>.lora_A.default.weight``); strict: exactly the model's LoRA tensors."""
    from safetensors.torch import load_file

    expected = {
        name.removeprefix(_PEFT_PREFIX) for name in peft_model.state_dict() if ".lora_" in name
    }
    state = {}
    for name, tensor in load_file(directory / PEFT_ADAPTER_FILE).items():
        module, _, kind = name.removeprefix(_PEFT_PREFIX).rpartition(".lora_")
        state[f"{module}.lora_{kind.removesuffix('.weight')}.{ADAPTER_NAME}.weight"] = tensor
    if set(state) != expected:
        raise ValueError(
            f"{directory}: adapter does not match the model (missing "
            f"{sorted(expected - set(state))[:3]}, unexpected {sorted(set(state) - expected)[:3]})"
        )
    return state


def load_peft_adapter(peft_model: PeftModel, directory: Path) -> None:
    """An adapter written by :func:`save_peft_adapter` back into ``peft_model`` (one process;
    sharded, see ``PolicyTrainer.load_model_state``); strict (:func:`adapter_tensors`)."""
    wrapped = peft_model.get_base_model()
    # Not strict: the base's weights are absent by design; adapter_tensors checked the rest.
    wrapped.load_state_dict(adapter_tensors(peft_model, directory), strict=False)
