"""Build the engine ``policy.generation.backend`` selects."""

from __future__ import annotations

from pathlib import Path

from dockyard.config.sections.policy import PolicyConfig
from dockyard.engines.base import GenerationEngine


def create_engine(
    policy: PolicyConfig,
    *,
    cache_dir: str | Path,
    initial_version: int = 0,
    staging_dir: str | Path | None = None,
) -> GenerationEngine:
    """An engine for ``policy``. ``cache_dir`` holds materialised ``tiny://`` models for vLLM;
    ``staging_dir`` is where refit weights given as state dicts are written for servers to
    read (defaults to the system temp directory)."""
    generation = policy.generation
    if generation.backend == "torch":
        from dockyard.engines.torch_engine import TorchEngine

        return TorchEngine.from_pretrained(
            policy.model_name,
            precision=policy.precision,
            tokenizer_name=policy.tokenizer.name,
            initial_version=initial_version,
            inflight_refit_policy=generation.inflight_refit_policy,
            max_batch_size=policy.generation_batch_size,
        )
    if generation.backend == "sglang":
        from dockyard.engines.sglang_engine import SglangEngine

        return SglangEngine(
            generation.sglang_cfg.server_urls,
            request_timeout_s=generation.sglang_cfg.request_timeout_s,
            initial_version=initial_version,
            staging_dir=staging_dir,
        )
    vllm_cfg = generation.vllm_cfg
    if vllm_cfg.mode == "server":
        from dockyard.engines.vllm_server import VllmServerEngine

        return VllmServerEngine(
            vllm_cfg.server_urls, initial_version=initial_version, staging_dir=staging_dir
        )
    from dockyard.engines.vllm_engine import VllmEngine
    from dockyard.models import materialize_model_dir

    lora = policy.dtensor_cfg.lora_cfg  # weight events carry adapters: vLLM's enable_lora
    return VllmEngine(
        materialize_model_dir(policy.model_name, cache_dir),
        vllm_cfg,
        seed=generation.seed,
        max_model_len=policy.max_total_sequence_length,
        initial_version=initial_version,
        staging_dir=staging_dir,
        lora_rank=lora.rank if lora.enabled else None,
    )
