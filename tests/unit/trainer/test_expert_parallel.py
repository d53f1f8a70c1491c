"""Expert parallelism (``policy.dtensor_cfg.expert_parallel_size=2``) on the tiny Qwen3-MoE: two
gloo ranks under torchrun (real processes) each hold two of every layer's four experts and train
on their own share of the batch, tokens reaching their experts by collectives. Against the
single-process trainer on the whole padded batch (float32): the two shares' losses add up to its
loss and every rank's whole gradients are its gradients, for padded, packed and token-budgeted
micro-batches and with activation checkpointing; the step TrainerRanks runs gives its
parameters and AdamW moments; the weight event is its blob byte for byte (same digest); a
checkpoint written with EP resumes in one process and one written in one process resumes with
EP."""

from __future__ import annotations

import pytest
import torch

from dockyard.broker.weight_blobs.base import digest_of_bytes, tensors_to_bytes
from dockyard.config.capabilities import not_implemented
from dockyard.config.errors import ConfigError
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.expert_parallel import shard_experts
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.consumers.trainer.ranks import TrainerRanks
from tests.unit.trainer.ep_worker import EP2, FOUR_GROUPS, LAYOUTS, MOE
from tests.unit.trainer.ranks_check import (
    assert_first_step_params_close,
    assert_same_state,
    resume_from,
    run_two_ranks,
    step_and_checkpoint,
)
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch


def one_process() -> TrainerRanks:
    config = load_config("configs/quickstart.yaml", BASE)
    return TrainerRanks(PolicyTrainer(tiny_model(MOE), config, torch.device("cpu")))


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process on the whole batch: its gradients, the initial digest, one step, and its
    checkpoint (for the ranks to load)."""
    out = tmp_path_factory.mktemp("ep")
    batch = on_policy(varied_batch(), MOE)
    ranks = one_process()
    digest = digest_of_bytes(tensors_to_bytes(ranks.engine_weights()))
    result = ranks.trainer.gradients(batch)
    grads = {n: p.grad.clone() for n, p in ranks.trainer.model.named_parameters()}
    stepped = step_and_checkpoint(ranks, batch, out / "single_ckpt")
    return {"out": out, "result": result, "grads": grads, "digest": digest, **stepped}


@pytest.fixture(scope="module")
def split(single):
    out = single["out"]
    run_two_ranks("ep_worker.py", out)
    return {
        "layouts": {
            layout: [torch.load(out / f"{layout}_rank{r}.pt", weights_only=False) for r in range(2)]
            for layout in LAYOUTS
        },
        "sharded": torch.load(out / "sharded.pt", weights_only=False),
    }


@pytest.mark.slow
def test_each_rank_holds_half_of_every_layers_experts(split):
    # 4 experts of [2·64, 128] gate/up weights per layer (the recipe's spec), 2 per rank.
    for rank in split["layouts"]["padded"]:
        assert rank["local_experts"] == [(2, 128, 128), (2, 128, 128)]


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_loss_and_gradients_equal_one_process(single, split, layout):
    first, second = split["layouts"][layout]
    # varied_batch's three prompt groups: one for rank 0, two for rank 1 (uneven token counts).
    assert (first["rows"], second["rows"]) == (4, 8)
    # Each share's loss is normalised by the whole batch's counts: they add up to its loss.
    total = first["loss"] + second["loss"]
    assert total == pytest.approx(single["result"].loss.loss, rel=1e-5, abs=1e-7)
    # π_old of every real next-token target (a padding column's value depends on the layout's
    # padding, which no loss term reads: the token mask is 0 there).
    prev = torch.cat([first["prev"], second["prev"]])
    real = varied_batch().attention_mask[:, 1:].bool()
    torch.testing.assert_close(
        prev[real], single["result"].prev_logprobs[real], rtol=1e-5, atol=1e-6
    )
    for rank in (first, second):
        for name, grad in single["grads"].items():
            torch.testing.assert_close(rank["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_the_first_adamw_step_equals_one_process(single, split):
    mine, theirs = split["sharded"]["outcome"], single["outcome"]
    assert mine.loss.loss == pytest.approx(theirs.loss.loss, rel=1e-5, abs=1e-7)
    assert mine.loss.num_valid_tokens == theirs.loss.num_valid_tokens
    assert mine.grad_norm == pytest.approx(theirs.grad_norm, rel=1e-5)
    for name, value in single["weights"].items():
        torch.testing.assert_close(split["sharded"]["weights"][name], value, rtol=1e-5, atol=1e-6)
    # AdamW's first moments are (1 - β1)·g = 0.1·g: the gradients' float-noise tolerance
    # (atol 1e-6, see above) times 0.1; the second moments (1 - β2)·g² are far smaller.
    for name, value in single["moments"].items():
        torch.testing.assert_close(split["sharded"]["moments"][name], value, rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_the_weight_event_is_the_unsharded_blob(single, split):
    assert split["sharded"]["initial_digest"] == single["digest"]


@pytest.mark.slow
def test_a_checkpoint_written_in_one_process_resumes_with_expert_parallelism(single, split):
    assert_same_state(split["sharded"]["loaded"], single)


@pytest.mark.slow
def test_a_checkpoint_written_with_expert_parallelism_resumes_in_one_process(single, split):
    assert_same_state(resume_from(one_process(), single["out"] / "sharded_ckpt"), split["sharded"])


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep4")
    run_two_ranks("ep_worker.py", out, processes=4)
    return [torch.load(out / f"four_rank{r}.pt", weights_only=False) for r in range(4)]


@pytest.mark.slow
def test_two_replicas_of_each_expert_group_equal_one_process(four_ranks):
    # Four ranks, ep = 2: ranks (0, 1) and (2, 3) each split the experts, ranks 0 and 2 (1 and 3)
    # hold the same experts, and every rank trains its own prompt group. An expert's gradient is
    # summed over its two replicas (finish_expert_gradients), the rest by FSDP2 over all four.
    batch = on_policy(varied_batch(count=FOUR_GROUPS), MOE)
    config = load_config("configs/quickstart.yaml", BASE)
    model = tiny_model(MOE)
    trainer = PolicyTrainer(model, config, torch.device("cpu"))
    result = trainer.gradients(batch)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    outcome = trainer.step(batch)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    total = sum(rank["loss"] for rank in four_ranks)
    assert total == pytest.approx(result.loss.loss, rel=1e-5, abs=1e-7)
    for rank in four_ranks:
        for name, grad in grads.items():
            torch.testing.assert_close(rank["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
        assert rank["grad_norm"] == pytest.approx(outcome.grad_norm, rel=1e-5)
        assert_first_step_params_close(rank["params"], params, grads, config.policy.optimizer.eps)


def test_expert_parallelism_needs_its_ranks():
    config = load_config("configs/quickstart.yaml", BASE + EP2)
    with pytest.raises(ValueError, match="mesh has 1 expert-parallel rank"):
        PolicyTrainer(tiny_model(MOE), config, torch.device("cpu"))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("policy.dtensor_cfg.tensor_parallel_size=2", "policy.dtensor_cfg.tensor_parallel_size"),
        ("policy.dtensor_cfg.context_parallel_size=2", "policy.dtensor_cfg.context_parallel_size"),
        ("policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.enabled"),
        ("policy.dtensor_cfg.cpu_offload=true", "policy.dtensor_cfg.cpu_offload"),
    ],
)
def test_combinations_expert_parallelism_does_not_run_are_refused_with_their_key(override, key):
    with pytest.raises(ConfigError, match=f"{key}: not supported with expert_parallel_size > 1"):
        load_config("configs/quickstart.yaml", [*EP2, override])


def test_expert_parallel_size_must_divide_the_cluster():
    overrides = [*EP2, "policy.dtensor_cfg.expert_parallel_size=4", "cluster.gpus_per_node=2"]
    with pytest.raises(ConfigError, match="expert_parallel_size: 4 must divide the cluster's 2"):
        load_config("configs/quickstart.yaml", overrides)


def test_a_dense_model_has_no_experts_to_split():
    # The trainer's refusal, before any collective: no layer of the dense Qwen2 holds experts,
    # so the (ep-rank) mesh is never touched; None stands in for it.
    with pytest.raises(ValueError, match="Qwen2ForCausalLM has no mixture-of-experts layer"):
        shard_experts(tiny_model("qwen2"), mesh=None)


def test_the_jax_backend_refuses_expert_parallelism_with_its_key():
    # Expert parallelism is the torch trainer's; the JAX backend would ignore the key. What
    # this build refuses is checked at launch (dockyard.config.capabilities.not_implemented).
    overrides = [
        *EP2,
        "policy.dtensor_cfg.enabled=false",
        "policy.jax_cfg.enabled=true",
        "sft.enabled=false",
    ]
    refused = not_implemented(load_config("configs/quickstart.yaml", overrides))
    assert [issue.path for issue in refused] == ["policy.dtensor_cfg.expert_parallel_size"]
    assert "JAX backend" in refused[0].message
