"""Optimizer state between the backends, in the torch trainer's checkpoint layout.

Weights convert by name (:mod:`.weights`); this module converts what the trainers save beside
them (``optimizer.pt``). There is one layout — the torch trainer's, by parameter name
(``torch.distributed.checkpoint``'s ``get_optimizer_state_dict``) — and both backends write and
read it, so a run continues under either backend with its AdamW / Adam moments and its place in
the schedule, whichever wrote the checkpoint:

- ``torch.optim.Adam(W)`` keeps, per parameter (by name as the trainer saves it, or by index in
  ``named_parameters()`` order, tied parameters once), ``step``, ``exp_avg`` and
  ``exp_avg_sq``: they become optax's ``ScaleByAdamState`` ``count``, ``mu`` and ``nu``;
- ``SGD`` without momentum keeps nothing per parameter;
- the ``LambdaLR`` schedule's ``last_epoch`` is the number of steps taken.

:func:`torch_state_from_optax` is the other direction (what the JAX trainer saves): the moments
gathered to host float32 tensors under the same names, the param groups and scheduler state of
the torch optimizer the config builds (so the torch trainer's loader takes them as its own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

from dockyard.consumers.trainer.jax_backend.weights import ParamState, load_named, named_arrays


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


def torch_state_from_optax(
    opt_state: Any,
    torch_optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
) -> dict[str, Any]:
    """The optimizer half of ``optimizer.pt`` as the torch trainer writes it, from ``opt_state``:
    ``torch_optimizer`` is a fresh optimizer the config builds over ``model`` (its param groups —
    lr, betas, weight decay, ... — are what the torch trainer would save)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    layout = get_optimizer_state_dict(model, torch_optimizer)
    adam = [node for node in jax.tree.leaves(opt_state, is_leaf=_is_adam) if _is_adam(node)]
    if not adam:  # SGD without momentum: torch keeps no per-parameter state either
        return {"state": {}, "param_groups": layout["param_groups"]}
    (moments,) = adam  # the chain has one Adam stage (optim.build_transform)
    steps = int(jax.device_get(moments.count))
    if steps == 0:  # torch has no per-parameter state before its first step
        return {"state": {}, "param_groups": layout["param_groups"]}
    mu = _host_tensors(moments.mu)
    nu = _host_tensors(moments.nu)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    if set(mu) != set(names):
        raise ValueError(
            f"the JAX optimizer state covers {sorted(mu)} but the torch model has {names}"
        )
    state = {
        # torch's Adam keeps ``step`` as a float32 scalar tensor (not capturable, not fused).
        name: {
            "step": torch.tensor(float(steps)),
            "exp_avg": mu[name],
            "exp_avg_sq": nu[name],
        }
        for name in names
    }
    return {"state": state, "param_groups": layout["param_groups"]}


def _host_tensors(tree: ParamState) -> dict[str, torch.Tensor]:
    """``{torch name: float32 tensor}`` of a moment tree (tied parameters once, as torch's
    ``named_parameters()`` lists them)."""
    arrays = jax.device_get(named_arrays(tree, tied=False))
    return {name: torch.from_numpy(np.array(a, dtype=np.float32)) for name, a in arrays.items()}
