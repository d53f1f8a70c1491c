"""Tensor parallelism for the Qwen2 / Llama family (``policy.dtensor_cfg.tensor_parallel_size``)
with DTensor's ``parallelize_module``.

The usual Megatron-style plan on each decoder layer: the q/k/v and gate/up projections are split
by output features (``ColwiseParallel``: each rank computes its heads, or its share of the MLP's
hidden units), o_proj and down_proj by input features (``RowwiseParallel``: the partial outputs
are summed by an all-reduce). Attention then runs on each rank's own heads: Transformers' Qwen2 /
Llama attention reshapes to ``(-1, head_dim)``, so it takes whatever number of heads its rank
holds. Embeddings, norms and the LM head stay whole on every rank.

Sequence parallelism (``policy.dtensor_cfg.sequence_parallel``), as torch's tensor-parallel
tutorial does it for Llama: between the attention and MLP blocks the activations are split over
the ``tp`` ranks by sequence position (``Shard(1)``) instead of held whole, so the norms
(``SequenceParallel``: replicated weights, gradients summed over the ranks) and the residual
adds run on each rank's own positions. Each block's input is all-gathered
(``PrepareModuleInput``: ``Shard(1)`` → ``Replicate``) and o_proj / down_proj reduce-scatter
their partial sums back to ``Shard(1)`` (what the plain plan all-reduces). Transformers builds
the causal mask and the rotary embeddings from the embedding output's length, so the embedding
output stays whole; the first layer takes its own slice of it, and the final norm gathers the
sequence back for the LM head. Shards are even: the model's input is padded at the end to a
multiple of the ``tp`` size (positions no real token attends to) and the logits trimmed back.

LoRA (peft's layers wrap the projections): the plan addresses ``base_layer``, ``lora_A`` and
``lora_B`` of each wrapped projection so that the adapter is split with its base weight
(:func:`_projection_plan` has the maths). torch's ``SequenceParallel`` re-creates the norms'
weights as trainable parameters, so what LoRA froze is frozen again afterwards.

Ranks form a 2-D mesh ``("dp", "tp")``: the ``tp`` ranks of one data-parallel group see the same
batch; FSDP2 shards over ``dp`` (:mod:`.data_parallel`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from dockyard.models.lora import ADAPTER_NAME, lora_layers

DP, TP = "dp", "tp"

LAYER_PLAN: dict[str, type[ParallelStyle]] = {
    "self_attn.q_proj": ColwiseParallel,
    "self_attn.k_proj": ColwiseParallel,
    "self_attn.v_proj": ColwiseParallel,
    "self_attn.o_proj": RowwiseParallel,
    "mlp.gate_proj": ColwiseParallel,
    "mlp.up_proj": ColwiseParallel,
    "mlp.down_proj": RowwiseParallel,
}


#: Activations split by sequence position (``[batch, position, hidden]``).
_SEQUENCE = Shard(1)


def _gather_sequence(**kwargs: Any) -> PrepareModuleInput:
    return PrepareModuleInput(
        desired_input_layouts=(Replicate(),) if "input_layouts" in kwargs else None,
        desired_input_kwarg_layouts=(
            {"hidden_states": Replicate()} if "input_kwarg_layouts" in kwargs else None
        ),
        use_local_output=True,
        **kwargs,
    )


def _projection_plan(
    name: str, style: type[ParallelStyle], *, sequence_parallel: bool, lora: bool
) -> dict[str, ParallelStyle]:
    """The plan of one projection of :data:`LAYER_PLAN`; ``lora``: wrapped by peft's LoRA layer,
    ``y = W·x + s·B·A·x`` with ``W`` in ``base_layer``, ``A`` and ``B`` in ``lora_A.default`` /
    ``lora_B.default``, ``s = α/r`` applied to each rank's own slice of ``y``.

    Column-parallel (``y`` split by output features, ``x`` whole on every rank): ``W`` and ``B``
    split by rows, ``A`` whole. Each rank computes ``s·B_k·(A·x)`` for its own outputs ``k``; the
    gradient reaching ``A·x`` is partial per rank (its outputs' share) and summed by ``B``'s
    input all-reduce in backward — what ``W``'s does for ``x`` — so ``A``'s gradient is the
    whole one on every rank.

    Row-parallel (``x`` split by input features, ``y`` summed over ranks): ``W`` and ``A`` split
    by columns, ``A·x = Σ_k A_k·x_k`` reduced like ``W·x`` (all-reduced, or reduce-scattered to
    sequence shards), ``B`` whole. Without sequence parallelism ``B`` then sees the whole ``A·x``
    and the whole output gradient, as one process. With it, ``B`` sees only this rank's
    positions: ``SequenceParallel`` makes it a replicated DTensor whose gradient (partial per
    rank) is summed over the ranks, as the norms'."""
    output = _SEQUENCE if sequence_parallel else Replicate()
    row = style is RowwiseParallel
    base: ParallelStyle = RowwiseParallel(output_layouts=output) if row else style()
    if not lora:
        return {name: base}
    plan: dict[str, ParallelStyle] = {f"{name}.base_layer": base}
    if not row:
        plan[f"{name}.lora_B.{ADAPTER_NAME}"] = ColwiseParallel()
        return plan
    plan[f"{name}.lora_A.{ADAPTER_NAME}"] = RowwiseParallel(output_layouts=output)
    if sequence_parallel:
        plan[f"{name}.lora_B.{ADAPTER_NAME}"] = SequenceParallel(use_local_output=True)
    return plan


def layer_plan(
    *, sequence_parallel: bool = False, lora: Collection[str] = ()
) -> dict[str, ParallelStyle]:
    """:data:`LAYER_PLAN` for one decoder layer; with ``sequence_parallel`` the activations
    between blocks split by sequence position (see the module's doc); ``lora``: the projections
    (names of :data:`LAYER_PLAN`) that peft wrapped (:func:`_projection_plan`)."""
    plan: dict[str, ParallelStyle] = {}
    for name, style in LAYER_PLAN.items():
        plan.update(
            _projection_plan(name, style, sequence_parallel=sequence_parallel, lora=name in lora)
        )
    if sequence_parallel:
        plan.update(
            {
                "input_layernorm": SequenceParallel(),
                "self_attn": _gather_sequence(input_kwarg_layouts={"hidden_states": _SEQUENCE}),
                "post_attention_layernorm": SequenceParallel(),
                "mlp": _gather_sequence(input_layouts=(_SEQUENCE,)),
            }
        )
    return plan


def check_divisible(config: object, size: int) -> None:
    """Heads and MLP width must split evenly over ``size`` ranks."""
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, name, None)
        if not isinstance(value, int) or value % size:
            raise ValueError(
                f"policy.dtensor_cfg.tensor_parallel_size={size} must divide the model's "
                f"{name} ({value})"
            )


def parallelize_policy(
    model: torch.nn.Module, mesh: DeviceMesh, *, sequence_parallel: bool = False
) -> torch.nn.Module:
    """Apply :func:`layer_plan` to every decoder layer over the 1-D ``mesh`` (the ``tp`` ranks),
    addressing peft's LoRA layers where the model has them (see the module's doc)."""
    decoder = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if decoder is None or layers is None:
        raise ValueError(
            f"{type(model).__name__} has no .model.layers: the tensor-parallel plan here is for "
            "the Hugging Face decoder-only layout (Qwen2, Llama, ...)"
        )
    check_divisible(model.config, mesh.size())
    frozen = {name for name, parameter in model.named_parameters() if not parameter.requires_grad}
    for layer in layers:
        wrapped = set(lora_layers(layer)) & set(LAYER_PLAN)
        plan = layer_plan(sequence_parallel=sequence_parallel, lora=wrapped)
        parallelize_module(layer, mesh, plan)
    if sequence_parallel:
        _split_sequence_between_layers(model, decoder, mesh)
    # SequenceParallel replaces a norm's weight by a new Parameter, which requires grad (the
    # column- and row-wise styles keep requires_grad): LoRA's frozen norms would train.
    for name, parameter in model.named_parameters():
        if name in frozen:
            parameter.requires_grad_(False)
    return model


def _split_sequence_between_layers(
    model: torch.nn.Module, decoder: torch.nn.Module, mesh: DeviceMesh
) -> None:
    """Sequence parallelism around the layers: the first takes its own positions, the final
    norm gathers them back, and the input is padded to split evenly (the logits trimmed)."""
    first_and_norm: dict[str, ParallelStyle] = {
        # The whole embedding output in, this rank's positions out: a slice, no communication.
        "layers.0": PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(_SEQUENCE,), use_local_output=True
        ),
        "norm": _gather_sequence(input_layouts=(_SEQUENCE,)),
    }
    parallelize_module(decoder, mesh, first_and_norm)
    multiple = mesh.size()
    model.register_forward_pre_hook(_padding_hook(multiple), with_kwargs=True)
    model.register_forward_hook(_trimming_hook, with_kwargs=True)


def _padding_hook(multiple: int) -> Any:
    """Pads ``input_ids`` and its mask or position ids at the end to a multiple of ``multiple``
    (the sequence splits evenly). Padded positions come after every real token, so under the
    causal mask no real token attends to them; their mask is 0, or they restart positions at 0
    (a packed sequence of their own)."""

    def pad(
        module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        input_ids = kwargs.get("input_ids")
        if args or input_ids is None:
            raise ValueError("sequence parallelism: call the policy with input_ids=... only")
        length = input_ids.shape[1]
        extra = -length % multiple
        module._dockyard_sequence_length = length  # for the trim
        if extra == 0:
            return args, kwargs
        kwargs = dict(kwargs, input_ids=F.pad(input_ids, (0, extra)))
        if kwargs.get("attention_mask") is not None:
            kwargs["attention_mask"] = F.pad(kwargs["attention_mask"], (0, extra))
        positions = kwargs.get("position_ids")
        if positions is not None:
            restart = torch.arange(extra, device=positions.device).expand(positions.shape[0], -1)
            kwargs["position_ids"] = torch.cat([positions, restart.to(positions.dtype)], dim=1)
        return args, kwargs

    return pad


def _trimming_hook(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
) -> Any:
    length = module._dockyard_sequence_length
    output.logits = output.logits[:, :length]
    return output


def clip_mixed_gradients(
    parameters: Iterable[torch.nn.Parameter], max_norm: float | None
) -> torch.Tensor:
    """``clip_grad_norm_`` for gradients that are DTensors on different meshes and whole tensors
    (tensor parallelism leaves embeddings and norms whole): each gradient's norm is taken whole
    (a DTensor's by a reduction of the scalar), then the same total norm and clip coefficient as
    ``clip_grad_norm_``."""
    grads = [p.grad for p in parameters if p.grad is not None]
    squares = torch.zeros((), dtype=torch.float64)
    for grad in grads:
        norm = torch.linalg.vector_norm(grad, 2)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares = squares + norm.detach().double().cpu() ** 2
    total = squares.sqrt()
    if max_norm is not None:
        coefficient = min(1.0, max_norm / (float(total) + 1e-6))
        if coefficient < 1.0:
            for grad in grads:
                grad.mul_(coefficient)
    return total
