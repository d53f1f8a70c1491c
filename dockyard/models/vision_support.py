"""What a vision-language policy cannot be combined with, refused at launch with the key path.

Each refusal names why the combination cannot carry a sample's images, so the run never
starts with images trained as text or scored against the wrong features. A key left out here is
one whose plans keep each sample's images with it (fixed or dynamic micro-batches, data-parallel
shares, LoRA).
"""

from __future__ import annotations

from dockyard.config.errors import ConfigIssue
from dockyard.config.master import MasterConfig
from dockyard.models.names import is_vision_model


def vision_issues(config: MasterConfig) -> list[ConfigIssue]:
    """The settings of ``config`` a vision-language ``policy.model_name`` cannot run with
    (``[]`` for a text model)."""
    policy = config.policy
    if not is_vision_model(policy.model_name):
        return []
    vlm = f"policy.model_name={policy.model_name} is a vision-language model"
    issues: list[ConfigIssue] = []
    if policy.sequence_packing.enabled:
        issues.append(
            ConfigIssue(
                "policy.sequence_packing.enabled",
                f"{vlm}: packed rows restart 1-D positions per sample, while Qwen2-VL's M-RoPE "
                "positions are 3-D and computed per row from its images (use "
                "policy.dynamic_batching, which keeps one sample per row)",
            )
        )
    dtensor = policy.dtensor_cfg
    if dtensor.context_parallel_size > 1:
        issues.append(
            ConfigIssue(
                "policy.dtensor_cfg.context_parallel_size",
                f"{vlm}: context parallelism splits each sequence across ranks, and an image's "
                "placeholder run and its vision-tower features cannot be split with it",
            )
        )
    if dtensor.tensor_parallel_size > 1:
        issues.append(
            ConfigIssue(
                "policy.dtensor_cfg.tensor_parallel_size",
                f"{vlm}: the tensor-parallel plan splits the language model's projections only; "
                "the vision tower has none",
            )
        )
    if policy.jax_cfg.enabled:
        issues.append(
            ConfigIssue(
                "policy.jax_cfg.enabled",
                f"{vlm}: the JAX trainer's model has no vision tower, so image samples would be "
                "trained as text (use the torch trainer)",
            )
        )
    backend = policy.generation.backend
    if backend != "torch":
        why = {
            "vllm": "the vllm engine does not return the expanded prompt ids and the sample "
            "images the trainer needs yet, and vLLM 0.32 on these CPUs cannot load Qwen2-VL at "
            "all (its model module imports transformers' torchvision image processor, and "
            "torchvision does not load against the CPU build of torch)",
            "sglang": "the sglang engine does not forward images",
        }[backend]
        issues.append(ConfigIssue("policy.generation.backend", f"{vlm}: {why}; use torch"))
    return issues
