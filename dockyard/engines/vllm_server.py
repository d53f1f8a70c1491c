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
- LoRA (a weight event that is an adapter, ``dockyard.models.lora``; the server started with
  ``--enable-lora --max-lora-rank N`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): the
  adapter's PEFT files travel in the body of ``/collective_rpc dockyard_write_adapter``, which
  writes them on the server's host (no shared filesystem needed), then ``/v1/load_lora_adapter``
  loads them under a name of this engine's own and requests name that adapter as ``model``; the
  previous adapter is then unloaded and its files deleted. A full-weights event drops the adapter
  (requests name the base model again).
- This client holds its own requests back during a refit (``finish_on_old``), so every token of
  a sample carries the version that was live when the request was sent.
"""

from __future__ import annotations

import asyncio
import base64
import json
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from dockyard.engines.base import (
    EngineError,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    GenerationTimings,
    SamplingParams,
    WeightSource,
)
from dockyard.engines.http_engine import HttpServerEngine
from dockyard.engines.vllm_engine import vllm_sampling_kwargs
from dockyard.engines.weight_loading import read_state_dict, tensor_names
from dockyard.models.lora import is_adapter, write_engine_adapter
from dockyard.utils.logging import get_logger

if TYPE_CHECKING:
    import torch

log = get_logger(__name__)

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


class _RpcResults(BaseModel):
    model_config = ConfigDict(extra="allow")
    results: list[str]


def adapter_files(adapter: Mapping[str, torch.Tensor]) -> str:
    """An adapter (as the engines receive it) as PEFT files, ``{file name: base64}`` in JSON: the
    one string argument ``dockyard_write_adapter`` takes through ``/collective_rpc``."""
    with tempfile.TemporaryDirectory(prefix="dockyard-adapter-") as tmp:
        write_engine_adapter(adapter, Path(tmp))
        return json.dumps(
            {f.name: base64.b64encode(f.read_bytes()).decode("ascii") for f in Path(tmp).iterdir()}
        )


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
        #: The adapter requests name (None: the base model alone), loaded on every server.
        self._adapter: str | None = None
        # Adapter names are this engine's own: rollout workers sharing a server never load,
        # use or unload each other's adapters.
        self._adapter_prefix = f"dockyard-{uuid.uuid4().hex[:8]}"

    async def _before_generate(self) -> None:
        if self._model_name is None:
            reply = await self._pool.get(self._pool.urls[0], "/v1/models")
            # Loaded adapters are listed too, with their base model as ``parent``.
            models = [
                m for m in _ModelList.model_validate(reply.json()).data if m.get("parent") is None
            ]
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
            "prompt": list(request.prompt_token_ids),
            "logprobs": 1,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "echo": False,
            **vllm_sampling_kwargs(params, num_samples),
        }
        async with self._gate.request():
            version = self._version
            body["model"] = self._adapter or self._model_name  # both change only under the gate
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

    async def shutdown(self) -> None:
        # The adapter is this engine's own: nobody else will request or unload it.
        if not self._closed and self._adapter is not None:
            await self._retire_adapter(self._adapter, successor=None)
        await super().shutdown()

    async def _refit_all(self, version: int, source: WeightSource) -> None:
        if is_adapter(await asyncio.to_thread(tensor_names, source)):
            await self._load_adapter(version, source)
            return
        await super()._refit_all(version, source)
        # New base weights: the adapter trained on the old ones is void.
        await self._retire_adapter(self._adapter, successor=None)

    async def _load_adapter(self, version: int, source: WeightSource) -> None:
        """Load adapter ``version`` on every server, switch requests to it, retire the old one."""
        adapter = await asyncio.to_thread(read_state_dict, source)
        try:
            files = await asyncio.to_thread(adapter_files, adapter)
        except ValueError as error:  # not one rank: not an adapter vLLM can load
            raise EngineError(f"weight version {version}: {error}") from None
        name = f"{self._adapter_prefix}-v{version}"
        try:
            await self._on_every_server(
                f"loading adapter version {version}",
                lambda url: self._load_adapter_on(url, name, files),
            )
        except EngineError:
            await self._forget(name)  # the servers that loaded it never serve it
            raise
        await self._retire_adapter(self._adapter, successor=name)

    async def _load_adapter_on(self, url: str, name: str, files: str) -> None:
        reply = await self._pool.post(
            url, "/collective_rpc", json={"method": "dockyard_write_adapter", "args": [name, files]}
        )
        paths = set(_RpcResults.model_validate(reply.json()).results)
        if len(paths) != 1:  # every worker writes under the same temp path on its host
            raise EngineError(f"workers wrote adapter {name} to different paths: {sorted(paths)}")
        try:
            await self._pool.post(
                url, "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": paths.pop()}
            )
        except EngineError as error:
            if " answered 404" in str(error):
                raise EngineError(
                    f"{url} has no /v1/load_lora_adapter: start the vLLM server with "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora --max-lora-rank N "
                    "(N >= policy.dtensor_cfg.lora_cfg.rank) to serve LoRA weight events"
                ) from None
            raise

    async def _retire_adapter(self, previous: str | None, *, successor: str | None) -> None:
        """Requests name ``successor`` from now on; ``previous`` is unloaded and deleted."""
        self._adapter = successor
        if previous is not None:
            await self._forget(previous)

    async def _forget(self, name: str) -> None:
        """Unload adapter ``name`` and delete its files on every server. Best effort: a failure
        is logged, never raised — requests no longer name it, and vLLM evicts adapters that are
        not requested (least recently used) when it needs the slot."""
        for what, call in (
            (
                "unload",
                lambda url: self._pool.post(
                    url, "/v1/unload_lora_adapter", json={"lora_name": name}
                ),
            ),
            (
                "delete",
                lambda url: self._pool.post(
                    url,
                    "/collective_rpc",
                    json={"method": "dockyard_remove_adapter", "args": [name]},
                ),
            ),
        ):
            try:
                await self._on_every_server(f"{what} of adapter {name}", call)
            except EngineError as error:
                log.warning("adapter_retire_failed", adapter=name, step=what, error=str(error))
