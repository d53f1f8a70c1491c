"""Weights in and out of the JAX policy under the torch side's names.

The NNX model (:mod:`.model`) holds each parameter at the attribute path of its Transformers
name and in the same layout, so a name is the path joined with dots and no array is transposed.
The exchange format is a flat ``{name: array}`` mapping — what a Transformers ``state_dict`` and
a ``.safetensors`` file hold — so the JAX trainer publishes the exact bytes the torch trainer
would (same names, dtypes and shapes; the weight blob store digests them the same way), and a
checkpoint written by either backend loads into the other.

Tied embeddings: the JAX model has one parameter; outgoing mappings carry it under both
``model.embed_tokens.weight`` and ``lm_head.weight``, as ``state_dict()`` does. Incoming, a
``lm_head.weight`` that is absent (Transformers' ``save_pretrained`` drops tied duplicates) or
equal to the embedding is accepted; one that differs is refused, since loading it would silently
drop a trained head.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

#: A model's parameters (or gradients, optimizer moments) as NNX holds them: nested by path
#: component (a name or a layer index) down to arrays; flax leaves both type parameters open.
ParamState = nnx.State[Any, Any]

TIED_HEAD = "lm_head.weight"
EMBEDDING = "model.embed_tokens.weight"


def parameter_name(path: tuple[object, ...]) -> str:
    """The torch name of the parameter at an NNX state path."""
    return ".".join(str(part) for part in path)


def named_arrays(state: ParamState, *, tied: bool) -> dict[str, jax.Array]:
    """``{torch name: array}`` of a parameter state (on its devices, not copied)."""
    flat = nnx.to_flat_state(state)
    named = {parameter_name(path): variable.get_value() for path, variable in flat}
    if tied:
        named[TIED_HEAD] = named[EMBEDDING]
    return named


def host_arrays(state: ParamState, *, tied: bool) -> dict[str, np.ndarray]:
    """:func:`named_arrays` gathered to host numpy (one transfer for the whole tree)."""
    return {
        name: np.asarray(a) for name, a in jax.device_get(named_arrays(state, tied=tied)).items()
    }


def load_named(
    template: ParamState, arrays: Mapping[str, np.ndarray], *, tied: bool, where: str
) -> ParamState:
    """A state shaped like ``template`` holding ``arrays`` (float32); refuses a missing,
    unexpected or mis-shaped tensor, naming it and ``where`` the weights came from."""
    expected = {parameter_name(path): variable for path, variable in nnx.to_flat_state(template)}
    names = set(arrays)
    if tied and TIED_HEAD in names:
        if EMBEDDING in arrays and not np.array_equal(arrays[TIED_HEAD], arrays[EMBEDDING]):
            raise ValueError(
                f"{where}: {TIED_HEAD} differs from {EMBEDDING} but the model ties them"
            )
        names.discard(TIED_HEAD)
    missing, unexpected = sorted(set(expected) - names), sorted(names - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{where}: weights do not match the model (missing {missing}, unexpected {unexpected})"
        )
    flat = []
    for path, variable in nnx.to_flat_state(template):
        name = parameter_name(path)
        value = np.asarray(arrays[name], dtype=np.float32)
        if value.shape != variable.get_value().shape:
            raise ValueError(
                f"{where}: {name} has shape {value.shape}, the model {variable.get_value().shape}"
            )
        flat.append((path, variable.replace(value)))
    return nnx.from_flat_state(flat)


def save_safetensors(arrays: Mapping[str, np.ndarray], path: str | Path) -> Path:
    """Write ``arrays`` as one safetensors file (contiguous copies: tied names share no
    buffer there)."""
    out = Path(path)
    save_file({name: np.ascontiguousarray(a) for name, a in arrays.items()}, str(out))
    return out


def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    return load_file(str(path))
