"""The vLLM engine, remote: a client of vLLM's OpenAI-compatible server over httpx.

- Generation: ``POST /v1/completions`` with the prompt as token ids, ``n`` samples,
  ``logprobs=1``, ``return_token_ids`` and ``return_tokens_as_token_ids``; the sampled tokens'
  log-probs come from ``choices[].logprobs.token_logprobs``. Start the server with
  ``--logprobs-mode processed_logprobs`` so they describe the distribution actually sampled.
- Refit (server started with ``VLLM_SERVER_DEV_MODE=1`` and
  ``--worker-extension-cls dockyard.engines.vllm_extension.DockyardWorkerExtension``):
  ``/pause?mode=wait`` → ``/collective_rpc dockyard_reload_weights`` → ``/update_weight_version``
  → ``/reset_prefix_cache`` → ``/resume``, on every server. The weights path must be readable by
  the server (same machine or a shared volume: see ``staging_dir``).
- This client holds its own requests back during a refit (``finish_on_old``), so every token of
  a sample carries the version that was live when the request was sent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from dockyard.engines.base import (
    EngineError,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    GenerationTimings,
    SamplingParams,
)
from dockyard.engines.http_engine import HttpServerEngine
from dockyard.engines.vllm_engine import vllm_sampling_kwargs

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class _ChoiceLogprobs(BaseModel):
    model_config = ConfigDict(extra="allow")
    token_logprobs: list[float | None]


class _Choice(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: int
    token_ids: list[int]
    logprobs: _ChoiceLogprobs
    finish_reason: str | None = None


class _Completion(BaseModel):
    model_config = ConfigDict(extra="allow")
    choices: list[_Choice]


class _ModelList(BaseModel):
    model_config = ConfigDict(extra="allow")
    data: list[dict[str, object]]


class VllmServerEngine(HttpServerEngine):
    """Image parts would go through ``/v1/chat/completions``, which takes no token-id prompt:
    requests with images are refused."""

    backend = "vllm"
    label = "vllm-server"

    def __init__(
        self,
        server_urls: Sequence[str],
        *,
        request_timeout_s: float = 600.0,
        initial_version: int = 0,
        staging_dir: str | Path | None = None,
        served_model_name: str | None = None,
    ) -> None:
        super().__init__(
            server_urls,
            request_timeout_s=request_timeout_s,
            initial_version=initial_version,
            staging_dir=staging_dir,
        )
        self._model_name = served_model_name

    async def _before_generate(self) -> None:
        if self._model_name is None:
            reply = await self._pool.get(self._pool.urls[0], "/v1/models")
            models = _ModelList.model_validate(reply.json()).data
            if not models:
                raise EngineError(f"vLLM server {self._pool.urls[0]} serves no model")
            self._model_name = str(models[0]["id"])

    async def _generate_one(
        self,
        index: int,
        request: GenerationRequest,
        params: SamplingParams,
        num_samples: int,
        started: float,
    ) -> list[GenerationResult]:
        body = {
            "model": self._model_name,
            "prompt": list(request.prompt_token_ids),
            "logprobs": 1,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "echo": False,
            **vllm_sampling_kwargs(params, num_samples),
        }
        async with self._gate.request():
            version = self._version
            reply = await self._pool.post(self._pool.pick(), "/v1/completions", json=body)
        total = time.perf_counter() - started
        try:
            choices = sorted(
                _Completion.model_validate(reply.json()).choices, key=lambda c: c.index
            )
        except (ValueError, ValidationError) as error:
            raise EngineError(f"unexpected /v1/completions reply from vLLM: {error}") from error
        if len(choices) != num_samples:
            raise EngineError(f"vLLM returned {len(choices)} choices for {num_samples} samples")
        results = []
        for choice in choices:
            logprobs = choice.logprobs.token_logprobs
            if len(logprobs) != len(choice.token_ids) or any(lp is None for lp in logprobs):
                raise EngineError("vLLM returned no log-prob for some generated tokens")
            results.append(
                GenerationResult(
                    request_index=index,
                    sample_index=choice.index,
                    request_id=request.request_id,
                    token_ids=np.asarray(choice.token_ids, dtype=np.int64),
                    logprobs=np.asarray(logprobs, dtype=np.float32),
                    weight_versions=np.full(len(choice.token_ids), version, dtype=np.int64),
                    finish_reason=_FINISH_REASONS.get(choice.finish_reason or "", "abort"),
                    timings=GenerationTimings(first_token_s=None, total_s=total),
                )
            )
        return results

    async def _refit_server(self, url: str, version: int, path: Path) -> None:
        await self._pool.post(url, "/pause", params={"mode": "wait"})
        try:
            await self._pool.post(
                url,
                "/collective_rpc",
                json={"method": "dockyard_reload_weights", "args": [str(path)]},
            )
            await self._pool.post(url, "/update_weight_version", json={"new_version": str(version)})
            await self._pool.post(url, "/reset_prefix_cache")
        finally:
            await self._pool.post(url, "/resume")
