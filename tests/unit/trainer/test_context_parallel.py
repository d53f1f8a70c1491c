"""Context parallelism (``policy.dtensor_cfg.context_parallel_size=2``): two gloo ranks under
torchrun (real processes) each run the model on half of every sequence's positions, with the
all-gather-KV attention; π_old, the loss, the whole gradients, the grad norm and the parameters
after one AdamW step equal the single-process trainer's on the same batch (float32), for fixed and
dynamic micro-batches, Qwen2 and Llama."""

from __future__ import annotations

import pytest
import torch

from dockyard.config.errors import ConfigError
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from tests.unit.trainer.cp_worker import CP2, LAYOUTS
from tests.unit.trainer.ranks_check import assert_first_step_params_close, run_two_ranks
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp")
    run_two_ranks("cp_worker.py", out)
    return {
        (layout, r): torch.load(out / f"{layout}_rank{r}_of2.pt", weights_only=False)
        for layout in LAYOUTS
        for r in range(2)
    }


def one_process(arch: str, layout: list[str]):
    batch = on_policy(varied_batch(), arch)
    model = tiny_model(arch)
    config = load_config("configs/quickstart.yaml", BASE + layout)
    trainer = PolicyTrainer(model, config, torch.device("cpu"))
    result = trainer.gradients(batch)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    outcome = trainer.step(batch)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return result, grads, outcome, params, config


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_context_parallel_ranks_equal_one_process(ranks, layout):
    result, grads, outcome, params, config = one_process(*LAYOUTS[layout])
    for rank in range(2):
        check_rank(ranks[layout, rank], result, grads, outcome, params, config)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp4")
    run_two_ranks("cp_worker.py", out, processes=4)
    return [torch.load(out / f"padded_rank{r}_of4.pt", weights_only=False) for r in range(4)]


@pytest.mark.slow
def test_two_data_parallel_groups_of_two_context_parallel_ranks_equal_one_process(four_ranks):
    result, grads, outcome, params, config = one_process(*LAYOUTS["padded"])
    # Ranks 0, 1 train the first share of the prompt groups, ranks 2, 3 the rest; each share's
    # loss is normalised by the whole batch's counts, so the two shares' losses add up to it.
    first, second = four_ranks[0], four_ranks[2]
    assert first["loss"] + second["loss"] == pytest.approx(result.loss.loss, rel=1e-5, abs=1e-7)
    for split in four_ranks:
        for name, grad in grads.items():
            torch.testing.assert_close(split["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
        assert split["grad_norm"] == pytest.approx(outcome.grad_norm, rel=1e-5)
        eps = config.policy.optimizer.eps
        assert_first_step_params_close(split["params"], params, grads, eps)


def check_rank(split, result, grads, outcome, params, config):
    assert split["attention"] == "dockyard_context_parallel"  # the split attention ran
    # π_old of every real next-token target (a padding column's value depends on how padding is
    # masked, which no loss term reads: the token mask is 0 there).
    real = varied_batch().attention_mask[:, 1:].bool()
    torch.testing.assert_close(
        split["prev"][real], result.prev_logprobs[real], rtol=1e-5, atol=1e-6
    )
    assert split["loss"] == pytest.approx(result.loss.loss, rel=1e-5, abs=1e-7)
    for name, grad in grads.items():
        torch.testing.assert_close(split["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert split["grad_norm"] == pytest.approx(outcome.grad_norm, rel=1e-5)
    eps = config.policy.optimizer.eps
    assert_first_step_params_close(split["params"], params, grads, eps)


def test_context_parallelism_needs_its_ranks():
    config = load_config("configs/quickstart.yaml", BASE + CP2)
    with pytest.raises(ValueError, match="mesh has 1 context-parallel rank"):
        PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("policy.dtensor_cfg.tensor_parallel_size=2", "policy.dtensor_cfg.tensor_parallel_size"),
        ("policy.sequence_packing.enabled=true", "policy.sequence_packing.enabled"),
        ("policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.enabled"),
        (
            "policy.dtensor_cfg.activation_checkpointing=true",
            "policy.dtensor_cfg.activation_checkpointing",
        ),
    ],
)
def test_combinations_context_parallelism_does_not_run_are_refused_with_their_key(override, key):
    with pytest.raises(ConfigError, match=f"{key}: not supported with context_parallel_size > 1"):
        load_config("configs/quickstart.yaml", [*CP2, override])
