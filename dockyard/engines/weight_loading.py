"""Reading refit sources into a state dict, and loading it into a torch module safely."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dockyard.engines.base import EngineError, WeightSource

if TYPE_CHECKING:
    import torch


def safetensors_files(source: str | os.PathLike[str]) -> list[Path]:
    """The safetensors file(s) a path names: the file itself, or every ``*.safetensors`` in a
    directory (sharded checkpoints), sorted for a deterministic load order."""
    path = Path(source)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise EngineError(f"refit source {path} is not a .safetensors file")
        return [path]
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise EngineError(f"refit source directory {path} holds no .safetensors file")
        return files
    raise EngineError(f"refit source {path} does not exist")


def read_state_dict(source: WeightSource) -> dict[str, torch.Tensor]:
    """Tensors from a directory, a safetensors file or a mapping (returned as a new dict)."""
    if isinstance(source, Mapping):
        return dict(source)
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in safetensors_files(source):
        state.update(load_file(file, device="cpu"))
    return state


def tensor_names(source: WeightSource) -> list[str]:
    """The tensor names of a refit source, without reading the tensors of a file."""
    if isinstance(source, Mapping):
        return list(source)
    from safetensors import safe_open

    names: list[str] = []
    for file in safetensors_files(source):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            names.extend(handle.keys())
    return names


def load_into_module(
    module: torch.nn.Module, state: Mapping[str, torch.Tensor], *, dry_run: bool = False
) -> None:
    """``load_state_dict`` that refuses unknown names and shape mismatches, and accepts a
    missing name only when it is tied to a present one (HF drops a tied ``lm_head.weight``).

    Validation happens before any tensor is copied, so a bad source leaves the module intact;
    ``dry_run`` validates only.
    """
    import torch

    own = module.state_dict(keep_vars=True)
    unexpected = sorted(set(state) - set(own))
    if unexpected:
        raise EngineError(f"refit source has unknown tensors: {', '.join(unexpected[:5])}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise EngineError(
                f"refit tensor {name} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(own[name].shape)}"
            )
    present_storage = {own[name].data_ptr() for name in state}
    untied_missing = [
        name for name in own if name not in state and own[name].data_ptr() not in present_storage
    ]
    if untied_missing:
        raise EngineError(f"refit source lacks tensors: {', '.join(untied_missing[:5])}")
    if dry_run:
        return
    with torch.no_grad():
        module.load_state_dict(dict(state), strict=False)


def stage_weights_dir(source: WeightSource, staging_root: str | os.PathLike[str]) -> Path:
    """A directory of safetensors that an inference *server* can load from ``source``.

    A directory is used as-is; a single file is linked into a fresh directory (the servers load
    every ``*.safetensors`` of a directory); a state dict is written to one. ``staging_root``
    must be on a filesystem the server can read (the same machine, or a shared volume).
    """
    if not isinstance(source, Mapping):
        path = Path(source)
        if path.is_dir():
            safetensors_files(path)  # refuse an empty directory here, not on the server
            return path
        files = safetensors_files(path)
    else:
        files = []
    import tempfile

    root = Path(staging_root)
    root.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix="refit-", dir=root))
    if files:
        target = staged / "model.safetensors"
        try:
            os.link(files[0], target)
        except OSError:  # another filesystem: a symlink still avoids copying the bytes
            target.symlink_to(files[0].resolve())
    else:
        from safetensors.torch import save_file

        assert isinstance(source, Mapping)
        # safetensors refuses tensors that share memory (tied weights): store one copy each.
        save_file(
            {k: v.detach().contiguous().clone() for k, v in source.items()},
            staged / "model.safetensors",
        )
    return staged
