"""Autograd-aware collectives the trainer's model-parallel schemes share (context parallelism's
K/V and log-prob gathers, expert parallelism's token exchange).

Written here because ``torch.distributed.nn.functional.all_gather`` is deprecated and its gloo
backward (an all-to-all emulated by scatters) gave wrong gradients for 4-D K/V slices (torch
2.13, measured); an all-reduce of the whole gradient runs on every backend. The two functions
are each other's adjoint: the backward of one is the forward of the other.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist


def _gather(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _sum_and_keep_mine(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    # all_reduce, then this rank's chunk: a reduce-scatter that gloo runs for any dimension.
    summed = tensor.contiguous().clone()
    dist.all_reduce(summed, group=group)
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    return summed.chunk(size, dim=dim)[rank].contiguous()


class _AllGather(torch.autograd.Function):
    """All-gather along a dimension; backward: each rank's slice of the gradient summed over the
    ranks (every rank's loss reads every rank's slice)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _gather(tensor, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _sum_and_keep_mine(grad, ctx.dim, ctx.group), None, None


class _ReduceScatter(torch.autograd.Function):
    """Sum over the ranks, each keeping its equal slice along a dimension; backward: the
    slices' gradients all-gathered (each rank's whole input fed every rank's slice)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _sum_and_keep_mine(tensor, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _gather(grad, ctx.dim, ctx.group), None, None


def all_gather_along(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's equal-shaped ``tensor``, concatenated along ``dim`` in rank order."""
    return cast(torch.Tensor, _AllGather.apply(tensor, dim, group))  # type: ignore[no-untyped-call]  # torch leaves Function.apply unannotated


def reduce_scatter_along(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """The ranks' ``tensor`` summed; this rank's equal chunk of the sum along ``dim``."""
    return cast(torch.Tensor, _ReduceScatter.apply(tensor, dim, group))  # type: ignore[no-untyped-call]  # torch leaves Function.apply unannotated
