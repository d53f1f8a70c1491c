"""A torch trainer's optimizer checkpoint (``optimizer.pt``) as the JAX trainer's optax state.

Weights convert by name (:mod:`.weights`); this module converts what the torch trainer saves
beside them, so a run started with the torch backend continues under JAX with its AdamW / Adam
moments and its place in the schedule:

- ``torch.optim.Adam(W)`` keeps, per parameter (by name as the trainer saves it, or by index in
  ``named_parameters()`` order, tied parameters once), ``step``, ``exp_avg`` and
  ``exp_avg_sq``: they become optax's ``ScaleByAdamState`` ``count``, ``mu`` and ``nu``;
- ``SGD`` without momentum keeps nothing per parameter;
- the ``LambdaLR`` schedule's ``last_epoch`` is the number of steps taken.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
import torch

from dockyard.consumers.trainer.jax_backend.weights import ParamState, load_named


def optax_state_from_torch(
    opt_state: Any,
    torch_optimizer: dict[str, Any],
    model: torch.nn.Module,
    template: ParamState,
    place: Callable[[ParamState], ParamState],
) -> Any:
    """``opt_state`` with its Adam moments and count taken from a torch optimizer state dict
    (unchanged when the torch optimizer had not stepped, or keeps no moments)."""
    per_param = torch_optimizer["state"]
    if not per_param:
        return opt_state
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    # Keyed by parameter name (torch.distributed.checkpoint's get_optimizer_state_dict, what the
    # trainer saves) or by index in parameter order (a plain optimizer.state_dict()).
    by_name = {
        (names[key] if isinstance(key, int) and 0 <= key < len(names) else key): value
        for key, value in per_param.items()
    }
    if set(by_name) != set(names):
        raise ValueError(
            f"the torch optimizer state covers parameters {sorted(map(str, per_param))} but the "
            f"model has {names}: it was saved for another model"
        )
    first = by_name[names[0]]
    if "exp_avg" not in first:
        return opt_state  # SGD without momentum: no per-parameter state to carry

    def moments(key: str) -> ParamState:
        arrays = {name: state[key].detach().float().numpy() for name, state in by_name.items()}
        return place(load_named(template, arrays, tied=False, where=f"optimizer.pt ({key})"))

    count = jnp.asarray(int(first["step"]), jnp.int32)
    converted: list[optax.ScaleByAdamState] = []

    def convert(node: Any) -> Any:
        if not _is_adam(node):
            return node
        converted.append(node)
        return node._replace(count=count, mu=moments("exp_avg"), nu=moments("exp_avg_sq"))

    new_state = jax.tree.map(convert, opt_state, is_leaf=_is_adam)
    if not converted:
        raise ValueError("the torch optimizer kept Adam moments but the configured one has none")
    return new_state


def _is_adam(node: object) -> bool:
    return isinstance(node, optax.ScaleByAdamState)
