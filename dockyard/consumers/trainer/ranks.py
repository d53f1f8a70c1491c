"""Several trainer ranks under ``torchrun``: rank 0 leads, the other ranks follow.

Rank 0 runs the whole :class:`~dockyard.consumers.trainer.loop.TrainerLoop`: it alone talks to
the data plane (the dispatcher, intake, the ledger, weight events), writes checkpoints and runs
validation. Every other rank holds its FSDP2 shards of the policy and joins each collective rank 0
starts: rank 0 broadcasts a :class:`Command`, and :func:`follow` does on each rank what rank 0
does next.

- ``step``: rank 0 cuts the batch into contiguous runs of whole prompt groups
  (:func:`~dockyard.consumers.trainer.data_parallel.shard_by_groups`) and *scatters* them, one
  per data-parallel group (the tensor-parallel ranks of a group get the same share); every rank
  steps on its share; the outcomes are gathered and merged on rank 0.
- ``agreement`` (``grpo.worker_trust``): the same scatter of whole groups (a rank left without
  a group when there are fewer groups than data-parallel groups measures a repeat of the first,
  and its rows are not used, so its FSDP2 collectives still match); each rank runs the
  prev-logprob pass on its share and returns the per-sample agreement sums
  (:mod:`~dockyard.consumers.trainer.agreement`), gathered to rank 0 and put back in batch row
  order, so rank 0 judges the workers on every sample of the batch as one process would.
- ``model_state`` / ``training_state``: the whole weights (or optimizer state) gathered to rank
  0's CPU, for the weight blob and for checkpoints. The blob is the one an unsharded trainer
  writes: the same names, tensors and digest.
- ``load``: a checkpoint rank 0 read is broadcast out, each rank keeping its shards.

Why rank 0 pulls and scatters instead of every rank pulling its own share from the data plane:
exactly-once training rests on one ledger and one view of staleness and of the stream position
(``checkpointing.py``, ``intake.py``); with one reader they stay as they are. The price is one
scatter of the batch per step (token ids, masks and per-token floats: kilobytes to a few
megabytes), measured as ``timing/scatter_batch_s`` against ``timing/train_step_s``
(docs/trainer.md).

With one process (no mesh) every method is the :class:`PolicyTrainer`'s own, without messages.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from dockyard.algorithms.grpo import MasterConfig
from dockyard.algorithms.loss_metrics import merge_loss_metrics
from dockyard.consumers.trainer.agreement import agreement_sums
from dockyard.consumers.trainer.backend import TrainerBackend
from dockyard.consumers.trainer.batch import TrainingBatch
from dockyard.consumers.trainer.context_parallel import CP
from dockyard.consumers.trainer.data_parallel import shard_by_groups
from dockyard.consumers.trainer.expert_parallel import EP, REPLICAS
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer, StepOutcome
from dockyard.consumers.trainer.tensor_parallel import DP, TP
from dockyard.consumers.trainer.trainer_checkpoint import ADAPTER_DIR, load_weights
from dockyard.models.devices import training_device
from dockyard.models.lora import PeftCheckpoint, adapter_tensors, load_peft_adapter
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

CommandKind = Literal[
    "step", "agreement", "model_state", "engine_weights", "training_state", "load", "stop"
]


@dataclass(frozen=True)
class Command:
    kind: CommandKind
    #: ``load``: the scheduler and loss-scaler state (small; every rank needs them whole), or
    #: None when the checkpoint holds no training state.
    payload: dict[str, object] | None = None


@dataclass(frozen=True)
class World:
    """This process's place among the ranks ``torchrun`` started (its environment)."""

    rank: int
    size: int
    local_size: int

    @classmethod
    def from_environment(cls) -> World:
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            size=int(os.environ.get("WORLD_SIZE", "1")),
            local_size=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))),
        )


def join_ranks(
    world: World, tensor_parallel: int = 1, context_parallel: int = 1, expert_parallel: int = 1
) -> DeviceMesh | None:
    """The mesh of every rank (None for one process): 1-D data parallel, or 2-D ``("dp", "tp")``
    / ``("dp", "cp")`` with ``tensor_parallel`` / ``context_parallel`` consecutive ranks per
    data-parallel group, or ``("dp_mod_ep", "ep")`` with ``expert_parallel`` consecutive ranks
    sharing their experts (each still a data-parallel rank, :mod:`.expert_parallel`); no two of
    them together. NCCL on GPUs, gloo on CPUs."""
    if world.size == 1:
        return None
    chosen = [
        (size, name, key)
        for size, name, key in (
            (tensor_parallel, TP, "tensor_parallel_size"),
            (context_parallel, CP, "context_parallel_size"),
            (expert_parallel, EP, "expert_parallel_size"),
        )
        if size > 1
    ]
    if len(chosen) > 1:
        keys = " and ".join(f"policy.dtensor_cfg.{key}" for _, _, key in chosen)
        raise ValueError(f"{keys} are each > 1: not supported together (set all but one to 1)")
    model_parallel, name, key = chosen[0] if chosen else (1, TP, "tensor_parallel_size")
    if world.size % model_parallel:
        raise ValueError(
            f"policy.dtensor_cfg.{key}={model_parallel} must divide the {world.size} trainer ranks"
        )
    device = training_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's object collectives use the current device
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if model_parallel == 1:
        return init_device_mesh(device.type, (world.size,))
    shape = (world.size // model_parallel, model_parallel)
    return init_device_mesh(
        device.type, shape, mesh_dim_names=(REPLICAS if name == EP else DP, name)
    )


def leave_ranks() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def load_trained_policy(config: MasterConfig) -> tuple[torch.nn.Module, object]:
    """The policy and tokenizer, in float32 (the master weights; ``policy.precision`` is the
    compute precision, :mod:`dockyard.models.devices`), after seeding: every rank loads alike."""
    from dockyard.models import load_policy

    torch.manual_seed(config.grpo.seed)
    return load_policy(
        config.policy.model_name, "float32", tokenizer_name=config.policy.tokenizer.name
    )


class TrainerRanks:
    """Rank 0's handle on every rank's :class:`PolicyTrainer` (its own included)."""

    def __init__(self, trainer: TrainerBackend) -> None:
        self.trainer = trainer
        self.mesh = trainer.mesh
        self.size = self.mesh.size() if self.mesh is not None else 1
        # The tp (or cp) ranks of one data-parallel group (consecutive ranks, the mesh's second
        # dimension) train on the same share; ep ranks each on their own.
        mesh = self.mesh
        shared = mesh is not None and mesh.ndim == 2 and mesh.mesh_dim_names != (REPLICAS, EP)
        self.tensor_size = mesh.size(1) if mesh is not None and shared else 1
        self.last_scatter_s = 0.0

    def _announce(self, kind: CommandKind, payload: dict[str, object] | None = None) -> None:
        dist.broadcast_object_list([Command(kind, payload)], src=0)

    def step(self, batch: TrainingBatch) -> StepOutcome:
        if self.mesh is None:
            return self.trainer.step(batch)
        started = time.perf_counter()
        groups = self.size // self.tensor_size
        shares = [
            shard_by_groups(batch, rank // self.tensor_size, groups) for rank in range(self.size)
        ]
        self._announce("step")
        mine: list[TrainingBatch | None] = [None]
        dist.scatter_object_list(mine, list(shares), src=0)
        self.last_scatter_s = time.perf_counter() - started
        assert mine[0] is not None
        outcome = self.trainer.step(mine[0])
        outcomes: list[StepOutcome | None] = [None] * self.size
        dist.gather_object(outcome, outcomes, dst=0)
        # One outcome per data-parallel group: its tp ranks computed the same share.
        firsts = range(0, self.size, self.tensor_size)
        return merge_outcomes(
            [o for i, o in enumerate(outcomes) if o is not None and i in firsts],
            [shares[i].size for i in firsts],
        )

    def agreement_sums(self, batch: TrainingBatch) -> torch.Tensor:
        """``[B, 3]``: :func:`~dockyard.consumers.trainer.agreement.agreement_sums` of ``batch``
        under the current weights, every rank measuring its share of whole groups."""
        if self.mesh is None:
            return measure_agreement(self.trainer, batch)
        groups = self.size // self.tensor_size
        shares, used = screen_shares(batch, groups)
        self._announce("agreement")
        mine: list[TrainingBatch | None] = [None]
        dist.scatter_object_list(
            mine, [shares[rank // self.tensor_size] for rank in range(self.size)], src=0
        )
        assert mine[0] is not None
        sums: list[torch.Tensor | None] = [None] * self.size
        dist.gather_object(measure_agreement(self.trainer, mine[0]), sums, dst=0)
        # The first rank of each data-parallel group that got groups of its own, in row order.
        rows = [sums[group * self.tensor_size] for group in range(used)]
        return torch.cat([r for r in rows if r is not None])

    def model_state(self) -> dict[str, torch.Tensor]:
        """The whole weights, by name (:meth:`PolicyTrainer.model_state`)."""
        if self.mesh is not None:
            self._announce("model_state")
        return self.trainer.model_state()

    def engine_weights(self) -> dict[str, torch.Tensor]:
        """What a weight event carries (:meth:`PolicyTrainer.engine_weights`)."""
        if self.mesh is not None:
            self._announce("engine_weights")
        return self.trainer.engine_weights()

    def adapter_checkpoint(self) -> PeftCheckpoint | None:
        """Under LoRA, the adapter a checkpoint writes (after :meth:`model_state`, which gathers
        it when sharded); None otherwise, and for a trainer backend without LoRA."""
        if not isinstance(self.trainer, PolicyTrainer):
            return None
        return self.trainer.adapter_checkpoint()

    def training_state(self) -> dict[str, object]:
        """Optimizer, scheduler and loss-scaler state (:meth:`PolicyTrainer.state_dict`)."""
        if self.mesh is not None:
            self._announce("training_state")
        return self.trainer.state_dict()

    def load(
        self,
        weights: dict[str, torch.Tensor],
        training_state: dict[str, object] | None,
        where: Path,
    ) -> None:
        """A checkpoint's whole weights (and training state) into every rank."""
        peft = self.trainer.peft
        if peft is not None and self.mesh is None:  # the base is model_name's: the adapter alone
            load_peft_adapter(peft, where / ADAPTER_DIR)
            if training_state is not None:
                self.trainer.load_state_dict(training_state)
            return
        if peft is not None:  # sharded: rank 0's adapter out to every rank's shards
            weights = adapter_tensors(peft, where / ADAPTER_DIR)
        if self.mesh is None:
            load_weights(self.trainer.model, weights, where)
            if training_state is not None:
                self.trainer.load_state_dict(training_state)
            return
        small = (
            {k: v for k, v in training_state.items() if k != "optimizer"}
            if training_state is not None
            else None
        )
        self._announce("load", small)
        assert isinstance(self.trainer, PolicyTrainer)  # only the torch trainer has a mesh
        self.trainer.load_model_state(weights)
        if training_state is not None:
            self.trainer.load_state_dict(training_state)

    def stop(self) -> None:
        """Releases the followers (their :func:`follow` returns); rank 0's last collective."""
        if self.mesh is not None:
            self._announce("stop")


def follow(trainer: PolicyTrainer) -> None:
    """A rank other than 0: do what rank 0 announces until it says ``stop``."""
    while True:
        received: list[Command | None] = [None]
        dist.broadcast_object_list(received, src=0)
        command = received[0]
        assert command is not None
        if command.kind == "stop":
            return
        if command.kind == "step":
            mine: list[TrainingBatch | None] = [None]
            dist.scatter_object_list(mine, None, src=0)
            assert mine[0] is not None
            dist.gather_object(trainer.step(mine[0]), None, dst=0)
        elif command.kind == "agreement":
            share: list[TrainingBatch | None] = [None]
            dist.scatter_object_list(share, None, src=0)
            assert share[0] is not None
            dist.gather_object(measure_agreement(trainer, share[0]), None, dst=0)
        elif command.kind == "model_state":
            trainer.model_state()
        elif command.kind == "engine_weights":
            trainer.engine_weights()
        elif command.kind == "training_state":
            trainer.state_dict()
        elif command.kind == "load":
            trainer.load_model_state({})
            if command.payload is not None:
                trainer.load_state_dict({"optimizer": {}, **command.payload})


def run_follower(config: MasterConfig, mesh: DeviceMesh) -> None:
    """The whole life of a rank other than 0: load the policy, shard it, follow rank 0."""
    from dockyard.models import load_processor

    model, _ = load_trained_policy(config)
    processor = load_processor(config.policy.model_name)
    trainer = PolicyTrainer(model, config, mesh=mesh, processor=processor)
    log.info("trainer.following", rank=dist.get_rank(), world_size=mesh.size())
    follow(trainer)


def measure_agreement(trainer: TrainerBackend, batch: TrainingBatch) -> torch.Tensor:
    """This rank's prev-logprob pass over ``batch`` (a collective when sharded), as agreement
    sums."""
    return agreement_sums(batch, trainer.batch_logprobs(trainer.model, batch))


def screen_shares(batch: TrainingBatch, groups: int) -> tuple[list[TrainingBatch], int]:
    """One share of whole prompt groups per data-parallel group, and how many of the shares
    hold rows of their own. With fewer prompt groups than data-parallel groups, the first
    shares hold one group each and the rest repeat the first (measured, then not used): every
    rank must run the pass, FSDP2's collectives need it."""
    ids = batch.group_ids
    count = 1 + sum(a != b for a, b in itertools.pairwise(ids))  # runs, as shard_by_groups
    used = min(count, groups)
    shares = [shard_by_groups(batch, share, used) for share in range(used)]
    return [*shares, *[shares[0]] * (groups - used)], used


def merge_outcomes(outcomes: list[StepOutcome], sizes: list[int]) -> StepOutcome:
    """The ranks' outcomes of one step as the whole batch's: loss metrics merge as micro-batch
    ones do (each rank's are its share of the whole-batch loss); means are weighted by the
    tokens (advantages) or samples (filtered fraction) behind them; the gradient norm and
    learning rate are every rank's alike."""
    tokens = sum(o.advantage_tokens for o in outcomes)
    first = outcomes[0]

    def token_mean(values: list[float]) -> float:
        weights = [o.advantage_tokens for o in outcomes]
        return sum(v * w for v, w in zip(values, weights, strict=True)) / tokens if tokens else 0.0

    return StepOutcome(
        loss=merge_loss_metrics(o.loss for o in outcomes),
        grad_norm=first.grad_norm,
        learning_rate=first.learning_rate,
        advantage_mean=token_mean([o.advantage_mean for o in outcomes]),
        advantage_abs_mean=token_mean([o.advantage_abs_mean for o in outcomes]),
        seconds=max(o.seconds for o in outcomes),
        filtered_fraction=sum(o.filtered_fraction * n for o, n in zip(outcomes, sizes, strict=True))
        / max(sum(sizes), 1),
        advantage_tokens=tokens,
        images=sum(o.images for o in outcomes),  # each share's own samples' images
        # Decided from the whole gradient's norm, the same on every rank.
        skipped_nonfinite_grad=any(o.skipped_nonfinite_grad for o in outcomes),
    )
