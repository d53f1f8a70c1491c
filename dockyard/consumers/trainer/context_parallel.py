"""Context parallelism (``policy.dtensor_cfg.context_parallel_size``): each forward pass's
sequence positions split over the ``cp`` ranks, with an all-gather-KV attention.

Why not torch's ``torch.distributed.tensor.experimental.context_parallel``: it has no sharding
rule for the CPU attention kernel (``aten._scaled_dot_product_flash_attention_for_cpu``, torch
2.13), so it cannot run on gloo. The scheme here runs on any backend:

- Every ``cp`` rank of a data-parallel group holds the same micro-batch. The next-token targets
  are taken from the whole sequence *before* it is split, then rank ``r`` runs the model on its
  contiguous slice ``[r·C, (r+1)·C)`` of positions (the length padded at the end to a multiple of
  the ``cp`` size), with its *global* position ids (the rotary embeddings see the true positions).
- In each attention layer (:func:`context_parallel_attention`, registered with Transformers'
  ``AttentionInterface`` for the Qwen2 / Llama family) the rank all-gathers K and V over the
  ``cp`` group (:func:`~dockyard.consumers.trainer.collectives.all_gather_along`,
  autograd-aware: its backward sums each rank's K/V gradients back to the rank that computed
  them) — and attends its queries to every key at or before their global position.
- Each rank's next-token log-probs ``[R, C]`` are all-gathered the same way into the whole
  ``[R, T-1]``, so the loss, its global normalisation (token and sequence counts), advantages
  and metrics are computed exactly as in one process, on every ``cp`` rank. Only the
  memory-heavy part — activations and the ``[R, C, vocab]`` logits — is split.

Gradients: every ``cp`` rank computes the same loss ``L``; the log-prob all-gather's backward
sums the ``cp`` copies of ``∂L/∂(slice)`` into the slice's owner, so :func:`loss_share` divides
the loss by the ``cp`` size, and each rank's parameter gradients are then its slice's share of
the whole gradient. Their sum over the ``cp`` ranks is taken by FSDP2 sharding over all ranks
(data × context, flattened): the same reduce-scatter that sums the data-parallel ranks' shares,
so no second reduction is written here (:mod:`.data_parallel` turns FSDP2's average into a sum).

Padded micro-batches only: a right-padded row needs no mask beyond causality (no real token
attends to the padding after it). Sequence packing (block-diagonal masks from restarting
position ids) and tensor parallelism are refused with context parallelism.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from dockyard.consumers.trainer.collectives import all_gather_along
from dockyard.consumers.trainer.micro_batches import MicroBatch, target_logprobs

CP = "cp"


#: The attention implementation's name in Transformers' registries.
ATTENTION = "dockyard_context_parallel"

#: The attribute of each attention module holding its ``cp`` process group.
_GROUP = "dockyard_context_parallel_group"


def context_parallel_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Transformers' attention-function signature: ``query`` ``[B, H, C, D]`` of this rank's
    positions, ``key`` / ``value`` ``[B, H_kv, C, D]``; returns ``[B, C, H, D]``."""
    if sliding_window is not None:
        raise ValueError(
            "context parallelism: sliding-window attention is not supported (the all-gather-KV "
            "attention here is plain causal)"
        )
    group = getattr(module, _GROUP)
    keys = all_gather_along(key, 2, group)
    values = all_gather_along(value, 2, group)
    # Grouped-query attention: each key/value head serves consecutive query heads (what
    # Transformers' repeat_kv does).
    repeats = query.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(repeats, dim=1)
    values = values.repeat_interleave(repeats, dim=1)
    chunk = query.shape[2]
    first = dist.get_rank(group) * chunk
    query_positions = torch.arange(first, first + chunk, device=query.device)
    key_positions = torch.arange(keys.shape[2], device=query.device)
    causal = key_positions.unsqueeze(0) <= query_positions.unsqueeze(1)
    out = F.scaled_dot_product_attention(
        query,
        keys,
        values,
        attn_mask=causal,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
    )
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask Transformers would build is for the local positions only; causality across the
    split is applied by :func:`context_parallel_attention` itself."""
    return None


def enable_context_parallel(model: torch.nn.Module, group: dist.ProcessGroup) -> None:
    """Route every decoder layer's attention of ``model`` through
    :func:`context_parallel_attention` over ``group``."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__} has no .model.layers: context parallelism here knows the "
            "Hugging Face decoder-only layout (Qwen2, Llama, ...)"
        )
    AttentionInterface.register(ATTENTION, context_parallel_attention)
    AttentionMaskInterface.register(ATTENTION, _no_mask)
    for layer in layers:
        setattr(layer.self_attn, _GROUP, group)
    model.set_attn_implementation(ATTENTION)  # type: ignore[operator]  # a transformers method; torch types unknown attributes as Tensor | Module


def loss_share(group: dist.ProcessGroup | None) -> float:
    """What each ``cp`` rank's (identical) loss is multiplied by so that the ranks' gradients
    add up to the loss's gradient once (see the module's doc)."""
    return 1.0 / dist.get_world_size(group) if group is not None else 1.0


def context_parallel_logprobs(
    model: torch.nn.Module, micro: MicroBatch, group: dist.ProcessGroup, temperature: float = 1.0
) -> torch.Tensor:
    """``[n, columns]`` next-token log-probs of a padded ``micro``, this rank computing only its
    slice of positions (grad follows the caller; every ``cp`` rank gets the whole result)."""
    if micro.attention_mask is None or micro.gather_index is not None:
        raise ValueError("context parallelism runs padded micro-batches only (no packing)")
    device = next(model.parameters()).device
    input_ids = micro.input_ids.to(device)
    mask = micro.attention_mask.to(device).bool()
    lengths = mask.sum(dim=-1, keepdim=True)
    positions = torch.arange(input_ids.shape[1], device=device)
    if not torch.equal(mask, positions.unsqueeze(0) < lengths):
        raise ValueError("context parallelism needs right-padded rows (no left padding)")
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    length = input_ids.shape[1]
    padded = F.pad(input_ids, (0, -length % size))
    # Targets from the whole sequence, before the split: the last position of a slice predicts
    # the first token of the next slice.
    targets = F.pad(padded[:, 1:], (0, 1))
    chunk = padded.shape[1] // size
    mine = slice(rank * chunk, (rank + 1) * chunk)
    global_positions = torch.arange(padded.shape[1], device=device)[mine].expand(len(padded), -1)
    logits = model(input_ids=padded[:, mine], position_ids=global_positions, use_cache=False).logits
    local = target_logprobs(logits, targets[:, mine], temperature)
    whole = all_gather_along(local, 1, group)
    return whole[:, : micro.columns]
