"""LoRA under tensor parallelism (``tensor_parallel_size=2``), with and without sequence
parallelism: two gloo ranks under torchrun (real processes) form one tensor-parallel group over a
peft model with adapters on every column- and row-parallel projection. The loss, the adapters'
gradients, the grad norms and two steps equal one process's on the same batch (float32); the
weight event gathered from the shards is the bytes one process sends for the same adapter; a
checkpoint written by the split ranks resumes in one process, and one written by one process
resumes split. Four ranks (FSDP2 over two such groups, sequence parallel) equal one process too."""

from __future__ import annotations

import pytest
import torch

from dockyard.broker.weight_blobs.base import digest_of_bytes, tensors_to_bytes
from dockyard.config.capabilities import not_implemented
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.consumers.trainer.ranks import TrainerRanks
from dockyard.consumers.trainer.trainer_checkpoint import read_checkpoint
from tests.unit.trainer.lora_tp_worker import LAYOUTS, LORA_ALL, STEPS, TP2
from tests.unit.trainer.ranks_check import checkpoint_of, run_two_ranks
from tests.unit.trainer.test_lora_data_parallel import assert_same_tensors
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch


def one_process() -> PolicyTrainer:
    torch.manual_seed(0)  # the adapters' initialisation of rank 0, which every rank takes
    config = load_config("configs/quickstart.yaml", BASE + LORA_ALL)
    return PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"))


def assert_same_gradients(got: dict, expected: dict) -> None:
    """Float32 sums taken in another order: close relative to each tensor's own scale (A's
    gradients in the second step are ~1e-5, B's ~1e-2)."""
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("lora-tp")
    # A one-process checkpoint after one step, for the split ranks to resume from.
    single = one_process()
    single.step(on_policy(varied_batch(), "qwen2"))  # B no longer zero
    ranks = TrainerRanks(single)
    weights, training = ranks.model_state(), ranks.training_state()
    checkpoint_of(single.model, weights, training, out / "single-ckpt", ranks.adapter_checkpoint())
    run_two_ranks("lora_tp_worker.py", out)
    saved = {
        layout: [torch.load(out / f"{layout}-rank{r}.pt", weights_only=False) for r in range(2)]
        for layout in LAYOUTS
    }
    return out, saved, single.engine_weights()


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_tensor_parallel_lora_ranks_equal_one_process(ranks, layout):
    _, saved, _ = ranks
    rank0, rank1 = saved[layout]
    batch = on_policy(varied_batch(), "qwen2")
    trainer = one_process()
    initial = {n: t.clone() for n, t in trainer.engine_weights().items()}  # A: the parameter
    steps = []
    for _ in range(STEPS):
        single = trainer.gradients(batch)
        grads = {
            n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None
        }
        steps.append((single.loss.loss, grads, trainer.step(batch).grad_norm))

    # The plan split peft's layers as designed: W and B of a column-parallel projection, W and A
    # of a row-parallel one; the rest whole (B of a row-parallel one a replicated DTensor under
    # sequence parallelism).
    assert rank0["split"] == [True, True, False, True, True, layout == "sp"]
    # Every rank starts from rank 0's adapter, and its event is one process's, byte for byte.
    for rank in (rank0, rank1):
        assert_same_tensors(rank["initial"], initial, rtol=0, atol=0)
        assert rank["initial_digest"] == digest_of_bytes(tensors_to_bytes(initial))
        for got, (loss, grads, grad_norm) in zip(rank["steps"], steps, strict=True):
            assert got["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7)
            assert all(".lora_" in n for n in grads) and len(grads) == 2 * 7 * 2  # layers×7×(A, B)
            assert_same_gradients(got["grads"], grads)
            assert got["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
    # The second step trains A too (B is no longer zero): its split gradients were compared.
    assert all(g.abs().max() > 1e-6 for n, g in steps[1][1].items() if ".lora_A." in n)
    # After the steps: the same event from either rank, one process's up to float noise.
    assert rank1["digest"] == rank0["digest"]
    assert_same_tensors(rank0["adapter"], trainer.engine_weights(), rtol=1e-5, atol=1e-6)
    # The gathered event is exactly what one process holding the split ranks' adapter sends.
    holder = one_process()
    loaded = holder.model.load_state_dict(rank0["params"], strict=False)
    assert not loaded.unexpected_keys
    assert rank0["digest"] == digest_of_bytes(tensors_to_bytes(holder.engine_weights()))


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lora_checkpoints_cross_between_split_and_one_process(ranks, layout):
    out, saved, single_adapter = ranks
    rank0, rank1 = saved[layout]
    # Split ranks resumed from the split checkpoint publish the adapter it was written from.
    for rank in (rank0, rank1):
        assert_same_tensors(rank["resumed"], rank0["adapter"], rtol=0, atol=0)
        # ... and from the one-process checkpoint, that process's adapter.
        assert_same_tensors(rank["from_single"], single_adapter, rtol=0, atol=0)
    # One process resumes the split ranks' checkpoint.
    resumed = one_process()
    checkpoint = read_checkpoint(out / f"{layout}-ckpt")
    TrainerRanks(resumed).load(
        checkpoint.weights, checkpoint.training_state, out / f"{layout}-ckpt"
    )
    assert_same_tensors(resumed.engine_weights(), rank0["adapter"], rtol=0, atol=0)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("lora-tp-dp")
    run_two_ranks("lora_tp_worker.py", out, processes=4)
    return [torch.load(out / f"fsdp-rank{r}.pt", weights_only=False) for r in range(4)]


@pytest.mark.slow
def test_fsdp2_over_two_tensor_parallel_lora_groups_equals_one_process(four_ranks):
    """dp=2 × tp=2 with sequence parallelism: each group trains its share of the prompt groups,
    each share's loss normalised by the whole batch's counts (the shares' losses add up), FSDP2
    sums the gradients over the groups."""
    batch = on_policy(varied_batch(), "qwen2")
    trainer = one_process()
    initial = {n: t.clone() for n, t in trainer.engine_weights().items()}
    first, second = four_ranks[0], four_ranks[2]  # one rank of each group
    for index in range(STEPS):
        single = trainer.gradients(batch)
        grads = {
            n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None
        }
        outcome = trainer.step(batch)
        shares = first["steps"][index]["loss"] + second["steps"][index]["loss"]
        assert shares == pytest.approx(single.loss.loss, rel=1e-5, abs=1e-7)
        for rank in four_ranks:
            assert_same_gradients(rank["steps"][index]["grads"], grads)
            assert rank["steps"][index]["grad_norm"] == pytest.approx(outcome.grad_norm, rel=1e-5)
    for rank in four_ranks:
        assert_same_tensors(rank["initial"], initial, rtol=0, atol=0)
        assert rank["digest"] == first["digest"]
    after = {n: p.detach() for n, p in trainer.model.named_parameters() if ".lora_" in n}
    assert_same_tensors(first["params"], after, rtol=1e-5, atol=1e-6)


def test_lora_dropout_under_tensor_parallelism_is_refused():
    """Each rank would draw its own dropout mask over the replicated input of A: refused at
    launch with its key, and by the trainer itself; without dropout nothing is refused."""
    dropout = ["policy.dtensor_cfg.lora_cfg.dropout=0.1"]
    config = load_config("configs/quickstart.yaml", BASE + LORA_ALL + TP2 + dropout)
    assert [issue.path for issue in not_implemented(config)] == [
        "policy.dtensor_cfg.lora_cfg.dropout"
    ]
    with pytest.raises(ValueError, match="LoRA dropout with tensor_parallel_size > 1"):
        PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"))
    assert not not_implemented(load_config("configs/quickstart.yaml", BASE + LORA_ALL + TP2))
    one_rank = load_config("configs/quickstart.yaml", BASE + LORA_ALL + dropout)
    assert not not_implemented(one_rank)
