"""The SGLang engine: a client of SGLang's native HTTP API.

- ``POST /generate`` with ``input_ids`` (the prompt repeated ``num_samples`` times as one
  batch), ``sampling_params``, ``return_logprob`` and ``logprob_start_len=-1`` (log-probs of
  the generated tokens only); token ids and log-probs come from
  ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` triples).
- Refit: ``POST /update_weights_from_disk {model_path, weight_version, flush_cache}``. SGLang
  lets running requests finish before it swaps weights, so this backend implements the
  ``finish_on_old`` in-flight policy; the version of a sample is the ``weight_version`` SGLang
  reports in ``meta_info`` when it does, else the version current when the request was sent.
- Images are refused with an explicit error (not forwarded yet).

Which distribution SGLang's log-probs describe depends on its version and flags (see its
``return_logprob`` documentation); compare with the torch engine before relying on them for
importance sampling.
"""

from __future__ import annotations

import time
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


class _FinishReason(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str


class _MetaInfo(BaseModel):
    model_config = ConfigDict(extra="allow")
    output_token_logprobs: list[tuple[float, int, str | None]]
    finish_reason: _FinishReason | None = None
    weight_version: str | None = None


class _GenerateOutput(BaseModel):
    model_config = ConfigDict(extra="allow")
    meta_info: _MetaInfo


class _UpdateWeightsReply(BaseModel):
    model_config = ConfigDict(extra="allow")
    success: bool
    message: str = ""


_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def sglang_sampling_params(params: SamplingParams) -> dict[str, object]:
    body: dict[str, object] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": -1 if params.top_k is None else params.top_k,
        "ignore_eos": params.ignore_eos,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.stop_strings:
        body["stop"] = list(params.stop_strings)
    if params.seed is not None:
        body["sampling_seed"] = params.seed
    return body


class SglangEngine(HttpServerEngine):
    backend = "sglang"
    label = "sglang"

    async def _generate_one(
        self,
        index: int,
        request: GenerationRequest,
        params: SamplingParams,
        num_samples: int,
        started: float,
    ) -> list[GenerationResult]:
        body = {
            "input_ids": [list(request.prompt_token_ids)] * num_samples,
            "sampling_params": sglang_sampling_params(params),
            "return_logprob": True,
            "logprob_start_len": -1,
            "stream": False,
        }
        async with self._gate.request():
            version_at_send = self._version
            response = await self._pool.post(self._pool.pick(), "/generate", json=body)
        finished = time.perf_counter() - started
        try:
            payload = response.json()
            outputs = [_GenerateOutput.model_validate(item) for item in payload]
        except (ValueError, ValidationError, TypeError) as error:
            raise EngineError(f"unexpected /generate reply from SGLang: {error}") from error
        if len(outputs) != num_samples:
            raise EngineError(f"SGLang returned {len(outputs)} outputs for {num_samples} samples")
        results = []
        for sample, output in enumerate(outputs):
            meta = output.meta_info
            triples = meta.output_token_logprobs
            version = int(meta.weight_version) if meta.weight_version else version_at_send
            reason = _FINISH_REASONS.get(meta.finish_reason.type if meta.finish_reason else "")
            results.append(
                GenerationResult(
                    request_index=index,
                    sample_index=sample,
                    request_id=request.request_id,
                    token_ids=np.asarray([t[1] for t in triples], dtype=np.int64),
                    logprobs=np.asarray([t[0] for t in triples], dtype=np.float32),
                    weight_versions=np.full(len(triples), version, dtype=np.int64),
                    finish_reason=reason or "abort",
                    timings=GenerationTimings(first_token_s=None, total_s=finished),
                )
            )
        return results

    async def _refit_server(self, url: str, version: int, path: Path) -> None:
        body = {"model_path": str(path), "weight_version": str(version), "flush_cache": True}
        reply = await self._pool.post(url, "/update_weights_from_disk", json=body)
        parsed = _UpdateWeightsReply.model_validate(reply.json())
        if not parsed.success:
            raise EngineError(f"SGLang {url} refused the refit: {parsed.message}")
