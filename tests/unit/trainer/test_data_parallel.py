"""FSDP2 data parallelism: two gloo ranks under torchrun (real processes) train on their own prompt
groups; the sum of their losses, the gradients (summed by the reduce-scatter), the grad norm and
the parameters after one step equal the single-process trainer's on the whole batch (float32)."""

from __future__ import annotations

import pytest
import torch

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.data_parallel import shard_by_groups
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from tests.unit.trainer.dp_worker import SHARDED_ONLY
from tests.unit.trainer.ranks_check import run_two_ranks
from tests.unit.trainer.test_packing import BASE, LAYOUTS, on_policy, tiny_model, varied_batch


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp")
    run_two_ranks("dp_worker.py", out)
    return {
        name: [torch.load(out / f"{name}-rank{r}.pt", weights_only=False) for r in range(2)]
        for name in [*LAYOUTS, *SHARDED_ONLY]
    }


@pytest.mark.slow
@pytest.mark.parametrize("layout", [*LAYOUTS, *SHARDED_ONLY])
def test_two_ranks_equal_one_process(ranks, layout):
    """CPU offload and activation checkpointing change where shards live and what is kept for
    backward, not the step: compared with one process's padded layout."""
    batch = on_policy(varied_batch(), "qwen2")
    model = tiny_model("qwen2")
    overrides = BASE + LAYOUTS.get(layout, [])
    trainer = PolicyTrainer(
        model, load_config("configs/quickstart.yaml", overrides), torch.device("cpu")
    )
    single = trainer.gradients(batch)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    outcome = trainer.step(batch)

    rank0, rank1 = ranks[layout]
    offloaded = layout in SHARDED_ONLY
    assert rank0["offload"] == ("CPUOffloadPolicy" if offloaded else "OffloadPolicy")
    assert rank0["samples"] + rank1["samples"] == batch.size
    assert rank0["samples"] != rank1["samples"]  # uneven shares: zero-weight passes are used
    assert rank0["loss"] + rank1["loss"] == pytest.approx(single.loss.loss, rel=1e-5, abs=1e-7)
    assert rank0["num_valid_tokens"] + rank1["num_valid_tokens"] == single.loss.num_valid_tokens
    for name, grad in grads.items():
        torch.testing.assert_close(rank0["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(rank1["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert rank0["grad_norm"] == pytest.approx(outcome.grad_norm, rel=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(rank0["params"][name], param.detach(), rtol=1e-5, atol=1e-6)


def test_groups_are_never_split_across_ranks():
    batch = varied_batch()
    shards = [shard_by_groups(batch, rank, 2) for rank in range(2)]
    assert [s.group_ids for s in shards] == [batch.group_ids[:4], batch.group_ids[4:]]
    with pytest.raises(ValueError, match="3 prompt groups cannot be shared by 4"):
        shard_by_groups(batch, 0, 4)
