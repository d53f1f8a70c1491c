"""The model-weights part of a trainer checkpoint, and its conversion to a Hugging Face directory.

A checkpoint directory written by :func:`save_model_checkpoint`::

    <dir>/dockyard_checkpoint.json   {"format": "safetensors" | "dcp", "tied_weights": {...}}
    <dir>/config.json (+ generation_config.json, tokenizer files)   the HF side, as-is
    <dir>/model.safetensors                    format "safetensors", one file, or
    <dir>/model-00001-of-0000N.safetensors + model.safetensors.index.json   sharded, or
    <dir>/model_dcp/.metadata + *.distcp       format "dcp" (torch.distributed.checkpoint)

Tensors that share storage (tied input/output embeddings) are written once; the duplicate names
are recorded in ``tied_weights`` and left out of the HF export, where ``transformers`` re-ties
them from ``config.tie_word_embeddings`` exactly as it does for its own checkpoints.

DCP is what a sharded trainer writes (each rank saves its shards in parallel); it also works in a
single process with no process group, which is how :func:`convert_dcp_to_hf` reads it back.
"""

from __future__ import annotations

import copy
import json
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dockyard.utils.logging import get_logger

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

log = get_logger(__name__)

CheckpointFormat = Literal["safetensors", "dcp"]

MARKER_FILE = "dockyard_checkpoint.json"
DCP_SUBDIR = "model_dcp"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Files of an HF directory that are not weights, copied through unchanged.
_HF_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


class CheckpointError(Exception):
    """A checkpoint directory is missing a part, or its tensors do not match its description."""


@dataclass
class CheckpointManifest:
    format: CheckpointFormat
    tied_weights: dict[str, str] = field(default_factory=dict)  # dropped name -> kept name

    def write(self, directory: Path) -> None:
        payload = {"format": self.format, "tied_weights": self.tied_weights}
        (directory / MARKER_FILE).write_text(json.dumps(payload, indent=2, sort_keys=True))

    @classmethod
    def read(cls, directory: Path) -> CheckpointManifest:
        marker = directory / MARKER_FILE
        if marker.is_file():
            payload = json.loads(marker.read_text())
            return cls(format=payload["format"], tied_weights=dict(payload.get("tied_weights", {})))
        # A plain HF directory or a bare DCP directory: infer from what is there.
        if (directory / DCP_SUBDIR / ".metadata").is_file() or (directory / ".metadata").is_file():
            return cls(format="dcp")
        if (directory / SAFETENSORS_FILE).is_file() or (directory / SAFETENSORS_INDEX).is_file():
            return cls(format="safetensors")
        raise CheckpointError(
            f"{directory}: no {MARKER_FILE}, no {DCP_SUBDIR}/.metadata and no "
            f"{SAFETENSORS_FILE}: not a model checkpoint"
        )


def _untie(
    state_dict: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Keep the first name of every storage; report the others as tied to it."""
    kept: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    owner_by_storage: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, tensor in state_dict.items():
        key = (
            tensor.untyped_storage().data_ptr(),
            int(tensor.storage_offset()),  # typed int | SymInt: a concrete tensor's is an int
            tuple(tensor.shape),
        )
        if key in owner_by_storage:
            tied[name] = owner_by_storage[key]
        else:
            owner_by_storage[key] = name
            kept[name] = tensor
    return kept, tied


def _write_safetensors(
    state_dict: Mapping[str, torch.Tensor], directory: Path, max_shard_bytes: int | None
) -> None:
    """One ``model.safetensors``, or HF-style shards plus their index when over the size cap."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in state_dict.items()}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        save_file(tensors, directory / SAFETENSORS_FILE, metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    shard_bytes = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and shard_bytes + size > max_shard_bytes:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = tensor
        shard_bytes += size
    weight_map: dict[str, str] = {}
    for index, shard in enumerate(shards, start=1):
        filename = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, directory / filename, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, filename))
    index_payload = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / SAFETENSORS_INDEX).write_text(json.dumps(index_payload, indent=2, sort_keys=True))


def save_model_checkpoint(
    model: PreTrainedModel,
    out_dir: str | Path,
    *,
    format: CheckpointFormat = "safetensors",
    tokenizer: PreTrainedTokenizerBase | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write the model's weights (``state_dict`` if given, e.g. a sharded trainer's) and HF side.

    ``max_shard_bytes`` splits a safetensors checkpoint into HF-style shards.
    """
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    tensors, tied = _untie(state_dict if state_dict is not None else model.state_dict())
    if format == "safetensors":
        _write_safetensors(tensors, directory, max_shard_bytes)
    elif format == "dcp":
        # From the defining module: the package does not re-export it explicitly (mypy strict).
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        with warnings.catch_warnings():
            # In one process DCP warns that it assumes single-process intent: that is the intent.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp_save(dict(tensors), checkpoint_id=str(directory / DCP_SUBDIR))
    else:
        raise ValueError(f"unknown checkpoint format {format!r}; expected 'safetensors' or 'dcp'")
    _config_naming_its_class(model).save_pretrained(directory)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None and model.can_generate():
        generation_config.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    CheckpointManifest(format=format, tied_weights=tied).write(directory)
    log.info("model checkpoint saved", path=str(directory), format=format, tensors=len(tensors))
    return directory


def _config_naming_its_class(model: PreTrainedModel) -> PretrainedConfig:
    """The model's config with ``architectures`` set, as ``save_pretrained`` sets it.

    GGUF converters and ``AutoModelForCausalLM`` pick the model class by that name; a config
    built in code (the tiny recipes) has none. A copy: saving must not change the live model.
    FSDP2's ``fully_shard`` renames the class ``FSDP<Name>``; the saved name is the model's own.
    """
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__.removeprefix("FSDP")]
    return config


def load_checkpoint_state_dict(checkpoint_dir: str | Path) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of a checkpoint in either format, tied duplicates omitted."""
    import torch

    directory = Path(checkpoint_dir)
    manifest = CheckpointManifest.read(directory)
    if manifest.format == "dcp":
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        dcp_dir = directory / DCP_SUBDIR if (directory / DCP_SUBDIR).is_dir() else directory
        metadata = FileSystemReader(str(dcp_dir)).read_metadata()
        template: dict[str, torch.Tensor] = {}
        for name, entry in metadata.state_dict_metadata.items():
            if not isinstance(entry, TensorStorageMetadata):
                raise CheckpointError(f"{dcp_dir}: entry {name!r} is not a tensor ({entry!r})")
            template[name] = torch.empty(entry.size, dtype=entry.properties.dtype)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp_load(template, checkpoint_id=str(dcp_dir))
        return template
    from safetensors.torch import load_file

    index_path = directory / SAFETENSORS_INDEX
    if index_path.is_file():
        weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
        state: dict[str, torch.Tensor] = {}
        for filename in sorted(set(weight_map.values())):
            state.update(load_file(directory / filename))
        missing = set(weight_map) - set(state)
        if missing:
            raise CheckpointError(
                f"{directory}: index names tensors no shard holds: {sorted(missing)[:5]}"
            )
        return state
    return load_file(directory / SAFETENSORS_FILE)


def convert_dcp_to_hf(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    *,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Turn a trainer checkpoint (DCP or safetensors) into a regular Hugging Face directory.

    The output holds ``config.json``, the tokenizer files found in the checkpoint, and the weights
    as safetensors (cast to ``dtype`` when given; sharded above ``max_shard_bytes``). Tied
    duplicates stay out, as in ``save_pretrained``'s own output.
    """
    source = Path(checkpoint_dir)
    target = Path(out_dir)
    if not (source / "config.json").is_file():
        raise CheckpointError(f"{source}: config.json is missing; the HF side was not saved")
    if target.resolve() == source.resolve():
        raise CheckpointError("out_dir must differ from checkpoint_dir")
    manifest = CheckpointManifest.read(source)
    state = load_checkpoint_state_dict(source)
    for duplicate in manifest.tied_weights:
        state.pop(duplicate, None)
    if dtype is not None:
        state = {
            name: tensor.to(dtype) if tensor.is_floating_point() else tensor
            for name, tensor in state.items()
        }
    target.mkdir(parents=True, exist_ok=True)
    _write_safetensors(state, target, max_shard_bytes)
    for name in _HF_SIDE_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    _name_causal_lm_class(target / "config.json")
    if dtype is not None:
        _set_config_dtype(target / "config.json", dtype)
    log.info(
        "checkpoint converted to HF", source=str(source), target=str(target), format=manifest.format
    )
    return target


def _name_causal_lm_class(config_path: Path) -> None:
    """Give a config without ``architectures`` its model type's causal-LM class.

    Checkpoints written before :func:`save_model_checkpoint` named the class lack it, and
    ``dockyard export gguf`` cannot pick a converter without it. A model type with no causal-LM
    class (a vision-language model) is left as it is rather than guessed.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = json.loads(config_path.read_text())
    if config.get("architectures"):
        return
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type", ""))
    if name is None:
        log.warning("config.json names no architecture", model_type=config.get("model_type"))
        return
    config["architectures"] = [name]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    log.info("config.json architecture named from its model type", architecture=name)


def _set_config_dtype(config_path: Path, dtype: torch.dtype) -> None:
    config = json.loads(config_path.read_text())
    name = str(dtype).removeprefix("torch.")
    # transformers 5 writes "dtype"; older readers look for "torch_dtype".
    config["dtype"] = name
    if "torch_dtype" in config:
        config["torch_dtype"] = name
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
