"""LoRA training (``policy.dtensor_cfg.lora_cfg``): only the adapters change; a weight event
carries the adapter alone, and the torch engine refits from it to the trainer's policy; a
checkpoint holds the merged weights (what export turns into a model) and the adapter it resumes
from."""

from __future__ import annotations

import asyncio

import torch

from dockyard.broker.weight_blobs.base import tensors_to_bytes
from dockyard.checkpoints.model_files import load_checkpoint_state_dict
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.consumers.trainer.ranks import TrainerRanks
from dockyard.consumers.trainer.trainer_checkpoint import read_checkpoint
from dockyard.engines.torch_engine import TorchEngine
from tests.unit.trainer.ranks_check import checkpoint_of, optimizer_moments
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch

LORA = [
    "policy.dtensor_cfg.lora_cfg.enabled=true",
    "policy.dtensor_cfg.lora_cfg.rank=4",
    "policy.dtensor_cfg.lora_cfg.alpha=8",
    "policy.dtensor_cfg.lora_cfg.target_modules=[q_proj,v_proj]",
    "policy.optimizer.lr=0.01",  # a step that moves the adapters visibly
]
PROBE = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])


def lora_trainer() -> PolicyTrainer:
    config = load_config("configs/quickstart.yaml", BASE + LORA)
    return PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"))


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=PROBE).logits


def test_only_the_adapters_train():
    trainer = lora_trainer()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.step(on_policy(varied_batch(), "qwen2"))
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_" in n for n in changed)
    assert any(".lora_B." in n for n in changed)  # B starts at zero: the adapter now acts


def test_the_engine_refits_from_the_adapter_alone_to_the_trainers_policy():
    trainer = lora_trainer()
    engine = TorchEngine(tiny_model("qwen2"), eos_token_ids=[2], pad_token_id=0)
    batch = on_policy(varied_batch(), "qwen2")
    for version in (1, 2):  # the second merges onto the base, not onto the first merge
        trainer.step(batch)
        adapter = trainer.engine_weights()
        assert all(".lora_A." in n or ".lora_B." in n for n in adapter)
        full = tensors_to_bytes(trainer.model_state())
        assert len(tensors_to_bytes(adapter)) < len(full) / 2
        asyncio.run(engine.update_weights(version, adapter))
        torch.testing.assert_close(logits(engine.model), logits(trainer.model))
    assert engine.current_version == 2


def test_a_checkpoint_holds_the_merged_model_and_resumes_the_adapter(tmp_path):
    trainer = lora_trainer()
    trainer.step(on_policy(varied_batch(), "qwen2"))
    ranks = TrainerRanks(trainer)
    directory = tmp_path / "step_1"
    checkpoint_of(
        trainer.model,
        ranks.model_state(),
        ranks.training_state(),
        directory,
        ranks.adapter_checkpoint(),
    )
    # The model file: the plain architecture's names, the adapter merged in (export's input).
    plain = tiny_model("qwen2")
    plain.load_state_dict(load_checkpoint_state_dict(directory), strict=False)
    assert set(load_checkpoint_state_dict(directory)) <= set(plain.state_dict())
    torch.testing.assert_close(logits(plain), logits(trainer.model))
    # A resumed trainer takes the adapter (and its optimizer state) back.
    resumed = lora_trainer()
    checkpoint = read_checkpoint(directory)
    TrainerRanks(resumed).load(checkpoint.weights, checkpoint.training_state, directory)
    assert torch.equal(logits(resumed.model), logits(trainer.model))
    moments = optimizer_moments(resumed.state_dict())
    saved = optimizer_moments(trainer.state_dict())
    assert moments.keys() == saved.keys() and all(".lora_" in n for n in moments)
    assert all(torch.equal(moments[n], saved[n]) for n in saved)


def test_lora_is_refused_only_where_an_engine_cannot_refit_from_adapters():
    """The torch engine merges adapters, vLLM loads them (in process, and on a server through
    /v1/load_lora_adapter); the SGLang client does not; tensor parallelism splits peft's layers
    too."""
    from dockyard.config.capabilities import not_implemented

    def refused(*overrides: str) -> list[str]:
        config = load_config("configs/quickstart.yaml", [*LORA, *overrides])
        return [issue.path for issue in not_implemented(config)]

    assert refused() == []
    assert refused("policy.generation.backend=vllm") == []
    lora = ["policy.dtensor_cfg.lora_cfg.enabled"]
    url = "[http://127.0.0.1:8000]"
    sglang = ["policy.generation.backend=sglang", f"policy.generation.sglang_cfg.server_urls={url}"]
    assert refused(*sglang) == lora
    server = [
        "policy.generation.backend=vllm",
        "policy.generation.vllm_cfg.mode=server",
        f"policy.generation.vllm_cfg.server_urls={url}",
    ]
    assert "policy.dtensor_cfg.lora_cfg.enabled" not in refused(*server)
    assert refused("policy.dtensor_cfg.tensor_parallel_size=2") == []
