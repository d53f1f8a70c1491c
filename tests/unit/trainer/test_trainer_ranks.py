"""Two trainer ranks (real gloo processes under torchrun) led by rank 0 through TrainerRanks, as
``dockyard trainer`` runs them: the worker screen's verdict (``grpo.worker_trust``) on a tampered
worker is one process's; the step on the scattered batch equals one process's step on the
whole batch; the weights rank 0 gathers for the weight blob are the unsharded model's, byte for
byte (same digest); a checkpoint written sharded resumes in one process and one written in one
process resumes sharded, weights and optimizer state alike."""

from __future__ import annotations

import pytest
import torch

from dockyard.broker.weight_blobs.base import digest_of_bytes, tensors_to_bytes
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.consumers.trainer.ranks import TrainerRanks
from tests.unit.trainer.ranks_check import (
    HONEST,
    TAMPERED,
    assert_same_state,
    resume_from,
    run_two_ranks,
    screen,
    step_and_checkpoint,
)
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch


def one_process() -> TrainerRanks:
    config = load_config("configs/quickstart.yaml", BASE)
    return TrainerRanks(PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu")))


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process: the initial digest, one step, and its checkpoint (for the ranks to load)."""
    out = tmp_path_factory.mktemp("ranks")
    ranks = one_process()
    digest = digest_of_bytes(tensors_to_bytes(ranks.model_state()))
    screened = screen(ranks)
    stepped = step_and_checkpoint(ranks, on_policy(varied_batch(), "qwen2"), out / "single_ckpt")
    return {"out": out, "digest": digest, "screen": screened, **stepped}


@pytest.fixture(scope="module")
def sharded(single):
    out = single["out"]
    run_two_ranks("ranks_worker.py", out)
    return torch.load(out / "sharded.pt", weights_only=False)


@pytest.mark.slow
def test_the_gathered_weights_are_the_unsharded_blob(single, sharded):
    assert sharded["initial_digest"] == single["digest"]


@pytest.mark.slow
def test_a_tampered_worker_is_flagged_across_ranks_as_in_one_process(single, sharded):
    # grpo.worker_trust with two ranks: each measures its share, rank 0 judges on the rows it
    # gathers; the verdict and every sample's agreement are the single process's.
    one, two = single["screen"], sharded["screen"]
    assert one["drops"] == {"g2": f"untrusted_worker:{TAMPERED}"}  # the check can tell them apart
    assert two["drops"] == one["drops"]
    torch.testing.assert_close(two["sums"], one["sums"], rtol=1e-5, atol=1e-6)
    # One group for two ranks: the second measures a repeat that is not used.
    torch.testing.assert_close(two["alone"], one["alone"], rtol=1e-5, atol=1e-6)
    assert two["alone"].shape[0] == 4
    for worker in (HONEST, TAMPERED):
        for measure in ("token_mult_prob_error", "gen_kl", "flagged"):
            key = f"workers/{worker}/{measure}"
            assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-7)


@pytest.mark.slow
def test_the_scattered_step_equals_one_process(single, sharded):
    mine, theirs = sharded["outcome"], single["outcome"]
    assert mine.loss.loss == pytest.approx(theirs.loss.loss, rel=1e-5, abs=1e-7)
    assert mine.loss.num_valid_tokens == theirs.loss.num_valid_tokens
    assert mine.loss.ratio_max == pytest.approx(theirs.loss.ratio_max, rel=1e-5)
    assert mine.grad_norm == pytest.approx(theirs.grad_norm, rel=1e-5)
    assert mine.advantage_tokens == theirs.advantage_tokens
    assert mine.advantage_mean == pytest.approx(theirs.advantage_mean, rel=1e-5, abs=1e-7)
    assert mine.advantage_abs_mean == pytest.approx(theirs.advantage_abs_mean, rel=1e-5)
    for name, value in single["weights"].items():
        torch.testing.assert_close(sharded["weights"][name], value, rtol=1e-5, atol=1e-6)
    for name, value in single["moments"].items():
        torch.testing.assert_close(sharded["moments"][name], value, rtol=1e-4, atol=1e-9)


@pytest.mark.slow
def test_a_checkpoint_written_in_one_process_resumes_sharded(single, sharded):
    assert_same_state(sharded["loaded"], single)


@pytest.mark.slow
def test_a_checkpoint_written_sharded_resumes_in_one_process(single, sharded):
    assert_same_state(resume_from(one_process(), single["out"] / "sharded_ckpt"), sharded)
