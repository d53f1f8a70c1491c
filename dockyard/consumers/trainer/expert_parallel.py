"""Expert parallelism (``policy.dtensor_cfg.expert_parallel_size``): each mixture-of-experts
layer's experts split over the ``ep`` ranks, tokens reaching their experts by collectives.

Transformers (5.x) stores a MoE layer's experts fused, as two 3-D parameters per layer
(``gate_up_proj`` ``[E, 2·I, H]`` and ``down_proj`` ``[E, H, I]``: Qwen3-MoE, Qwen2-MoE, Mixtral,
OLMoE, ...); the router (``mlp.gate``) picks each token's top-k experts and their weights. Here
each ``ep`` rank holds ``E / ep`` consecutive experts: the two parameters become DTensors
``Shard(0)`` over the ``ep`` ranks (:func:`shard_experts`), so the whole-state machinery the
trainer already uses (``get_model_state_dict`` / ``set_model_state_dict`` with full state
dicts, and the optimizer's) gathers and scatters them like any sharded parameter: weight events
and checkpoints hold the whole experts under their usual names, with no code of their own.

As in torchtitan, EP *borrows* from data parallelism: the ``ep`` ranks are data-parallel ranks
too, each on its own share of the batch. The world is a ``("dp_mod_ep", "ep")`` mesh; the batch
and FSDP2's shards of every other parameter (attention, norms, router, embeddings) span all
ranks (the flattened mesh), and the ranks of ``dp_mod_ep`` hold replicas of the same experts.

The token exchange (:class:`ShardedExperts`, in place of the layer's ``mlp.experts``): the ranks'
routed tokens — hidden states, top-k indices and weights, padded to the largest count — are
all-gathered over ``ep``; every rank applies its own experts to the tokens routed to them
(weighted, summed per token), and the partial outputs are summed and handed back by a
reduce-scatter. This moves more than an all-to-all would (each rank sees every token, not only
those routed to its experts), but it needs no exchange of per-expert counts and uneven splits,
and it is exact. (gloo has ``all_to_all_single``; an all-to-all dispatch is the next step where
the traffic matters.) Both collectives are autograd-aware
(:mod:`.collectives`): the backward of the gather sums each token's gradient back to its rank.

Gradients: the router and the rest train as in plain FSDP2 (:mod:`.data_parallel`). An expert's
gradient arrives whole on the ``ep`` rank holding it — the exchange's backward brings every
rank's tokens' contributions — but each rank's loss was multiplied by the world size to turn
FSDP2's average into a sum, and replicas over ``dp_mod_ep`` each hold their own ranks' part:
:func:`finish_expert_gradients` divides by the world size and sums over the replicas.

The router's load-balancing loss is the model's own business: Transformers adds it only to a
loss it computes from labels, which the trainer never passes (it takes the logits), and the tiny
recipes leave ``output_router_logits`` off, so in one process and here alike the GRPO loss alone
trains the router.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from dockyard.consumers.trainer.collectives import all_gather_along, reduce_scatter_along

EP = "ep"
#: The mesh dimension of the ranks holding the same experts (torchtitan's name).
REPLICAS = "dp_mod_ep"

#: The fused expert parameters of a Transformers MoE layer's ``experts`` module.
_FUSED = ("gate_up_proj", "down_proj")


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(
            f"{type(model).__name__} has no .model.layers: expert parallelism here knows the "
            "Hugging Face decoder-only layout"
        )
    return list(layers)


def _fused_experts(layer: nn.Module) -> nn.Module | None:
    """The layer's ``mlp.experts`` when it holds fused 3-D expert weights, else None (a dense
    layer of a model that mixes them)."""
    experts = getattr(getattr(layer, "mlp", None), "experts", None)
    if not isinstance(experts, nn.Module) or isinstance(experts, ShardedExperts):
        return None
    weights = [getattr(experts, name, None) for name in _FUSED]
    fused = all(isinstance(w, nn.Parameter) and w.dim() == 3 for w in weights)
    return experts if fused else None


class ShardedExperts(nn.Module):
    """A MoE layer's experts, this rank's ``E / ep`` of them; the same parameter names and call
    as Transformers' fused experts module (``(hidden [N, H], top_k_index [N, k],
    top_k_weights [N, k]) → [N, H]``), so the layer around it is unchanged."""

    gate_up_proj: nn.Parameter
    down_proj: nn.Parameter
    act_fn: Callable[[torch.Tensor], torch.Tensor]

    def __init__(self, experts: nn.Module, mesh: DeviceMesh) -> None:
        super().__init__()
        size = mesh.size()
        count: object = experts.num_experts
        if not isinstance(count, int) or count % size:
            raise ValueError(
                f"policy.dtensor_cfg.expert_parallel_size={size} must divide the model's "
                f"{count} experts per layer"
            )
        self.num_experts = count
        self.local_experts = count // size
        self.act_fn = cast(Callable[[torch.Tensor], torch.Tensor], experts.act_fn)
        self.group = mesh.get_group()
        # Every rank holds rank 0's weights already (broadcast_from_first_rank); each keeps its
        # slice of experts.
        for name in _FUSED:
            whole = cast(nn.Parameter, getattr(experts, name)).detach()
            self.register_parameter(name, nn.Parameter(distribute_tensor(whole, mesh, [Shard(0)])))

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        group = self.group
        count = hidden_states.shape[0]
        # Equal shapes for the collectives: every rank pads its tokens to the largest count
        # (index -1: no expert, weight 0).
        most = torch.tensor([count], device=hidden_states.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
        pad = int(most.item()) - count
        tokens = all_gather_along(F.pad(hidden_states, (0, 0, 0, pad)), 0, group)
        weights = all_gather_along(F.pad(top_k_weights, (0, 0, 0, pad)), 0, group)
        index = all_gather_along(F.pad(top_k_index, (0, 0, 0, pad), value=-1), 0, group)
        first = dist.get_rank(group) * self.local_experts
        partial = self._apply_local_experts(tokens, index - first, weights)
        return reduce_scatter_along(partial, 0, group)[:count]

    def _apply_local_experts(
        self, tokens: torch.Tensor, index: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """``Σ_k weight_k · expert_k(x)`` over the top-k slots routed to this rank's experts (the
        math of Transformers' eager experts forward, on local expert numbers)."""
        gate_up = _local(self.gate_up_proj)
        down = _local(self.down_proj)
        out = torch.zeros_like(tokens)
        for expert in range(self.local_experts):
            # Every expert runs, with no tokens too: its weights then get a zero gradient rather
            # than none, so every rank's gradients (and their collectives) line up.
            token, slot = torch.where(index == expert)
            gate, up = F.linear(tokens[token], gate_up[expert]).chunk(2, dim=-1)
            hidden = F.linear(self.act_fn(gate) * up, down[expert])
            hidden = hidden * weights[token, slot, None]
            out.index_add_(0, token, hidden.to(out.dtype))
        return out


def _local(parameter: torch.Tensor) -> torch.Tensor:
    return parameter.to_local() if isinstance(parameter, DTensor) else parameter


def shard_experts(model: nn.Module, mesh: DeviceMesh) -> list[nn.Parameter]:
    """Replace every MoE layer's experts of ``model`` by :class:`ShardedExperts` over ``mesh``
    (the ``ep`` ranks); returns their parameters (FSDP2 leaves them alone), in layer order: a
    list, not a set, because every rank must run their collectives in the same order (a set's
    order follows object ids, which differ between processes)."""
    sharded: list[nn.Parameter] = []
    for layer in _decoder_layers(model):
        experts = _fused_experts(layer)
        if experts is None:
            continue
        replacement = ShardedExperts(experts, mesh)
        layer.get_submodule("mlp").register_module("experts", replacement)
        sharded.extend(replacement.parameters())
    if not sharded:
        raise ValueError(
            f"policy.dtensor_cfg.expert_parallel_size > 1: {type(model).__name__} has "
            "no mixture-of-experts layer with fused expert weights (mlp.experts.gate_up_proj / "
            "down_proj) to split"
        )
    return sharded


def finish_expert_gradients(
    parameters: Iterable[nn.Parameter], world_size: int, replicas: dist.ProcessGroup | None
) -> None:
    """The experts' accumulated gradients as the whole batch's loss's: divided by the world
    size every loss was multiplied by, summed over the ranks holding the same experts (see the
    module's doc). A collective over ``replicas`` when there is more than one."""
    for parameter in parameters:
        if parameter.grad is None:
            continue
        grad = _local(parameter.grad)
        grad.div_(world_size)
        if replicas is not None:
            dist.all_reduce(grad, group=replicas)
