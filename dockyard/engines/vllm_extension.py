"""The worker extension loaded into every vLLM worker process
(``LLM(worker_extension_cls="dockyard.engines.vllm_extension.DockyardWorkerExtension")``).

Methods are called through ``LLM.collective_rpc(name, args=...)`` with plain strings (tensors
cannot travel inside lists through collective_rpc).

On GPU, weights are streamed from safetensors into vLLM's own ``reload_weights``, which also
re-quantizes for online FP8. On CPU (vLLM 0.32) that path is not enough: at start-up every
unquantized linear layer packs its weight into a oneDNN/SGL kernel handle and replaces the
``weight`` parameter with an empty tensor, and ``reload_weights`` updates the parameters but
not those handles — measured: embeddings and norms take the new values while every projection
keeps computing with the old weights (reloading the *original* weights looks exact, which hides
it). So on CPU the extension gives each packed layer a real ``weight`` parameter again (its own
``create_weights``), runs the model's ``load_weights``, and re-packs every linear layer and the
LM head with ``process_weights_after_loading``. (Calling ``load_weights`` without restoring
the parameters first fails half-way on the empty tensors.)

LoRA on a vLLM *server* (``vllm_cfg.mode=server``): the adapter's files travel inside the
``/collective_rpc`` request (base64 in JSON: collective_rpc carries strings only) and
:meth:`DockyardWorkerExtension.dockyard_write_adapter` writes them on the server's own host, where
``/v1/load_lora_adapter`` then finds them (vLLM's workers read an adapter's path, the API server
never does). So adapters need no filesystem shared with the rollout worker.

This module must not import vLLM at top level: it is imported by name inside the workers.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: Where the workers keep the adapters they were sent (one directory per adapter name).
ADAPTER_ROOT = Path(tempfile.gettempdir()) / "dockyard-lora"
#: An adapter name is also a directory name: no separators, no leading dot.
_ADAPTER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
#: The files of a PEFT adapter directory, the only ones an adapter write may create.
_ADAPTER_FILES = frozenset({"adapter_config.json", "adapter_model.safetensors"})


def adapter_dir(name: str) -> Path:
    """The directory of adapter ``name`` under :data:`ADAPTER_ROOT`; refuses a name that is not a
    plain file name (it arrives over HTTP)."""
    if not _ADAPTER_NAME.fullmatch(name):
        raise ValueError(f"adapter name {name!r} is not a plain name ([A-Za-z0-9._-], no '/')")
    return ADAPTER_ROOT / name


def _iter_safetensors(path: str) -> Iterator[tuple[str, object]]:
    from safetensors import safe_open

    source = Path(path)
    files = [source] if source.is_file() else sorted(source.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors under {path}")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not mappings
                yield name, handle.get_tensor(name)


class DockyardWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker."""

    def dockyard_reload_weights(self, path: str) -> bool:
        """Load every tensor of a safetensors file or directory into the running model."""
        from vllm.platforms import current_platform

        quantized = self.vllm_config.model_config.quantization is not None  # type: ignore[attr-defined]  # self is vLLM's worker (mixed in)
        if current_platform.is_cpu() and not quantized:
            self._dockyard_cpu_reload(path)
        else:
            self.reload_weights(weights_iterator=_iter_safetensors(path))  # type: ignore[attr-defined]  # self is vLLM's worker (mixed in)
        return True

    def _dockyard_cpu_reload(self, path: str) -> None:
        import torch
        from vllm.model_executor.layers.linear import WEIGHT_LOADER_V2_SUPPORTED, LinearBase
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        model = self.model_runner.model  # type: ignore[attr-defined]  # self is vLLM's worker (mixed in)
        for layer in model.modules():
            weight = layer.weight if isinstance(layer, LinearBase) else None
            if not isinstance(weight, torch.Tensor) or weight.numel() > 0:
                continue
            del layer._parameters["weight"]  # the empty placeholder left by packing
            method = layer.quant_method
            v2 = method.__class__.__name__ in WEIGHT_LOADER_V2_SUPPORTED
            method.create_weights(
                layer=layer,
                input_size_per_partition=getattr(
                    layer, "input_size_per_partition", layer.input_size
                ),
                output_partition_sizes=layer.output_partition_sizes,
                input_size=layer.input_size,
                output_size=layer.output_size,
                params_dtype=layer.params_dtype,
                weight_loader=layer.weight_loader_v2 if v2 else layer.weight_loader,
            )
        model.load_weights(_iter_safetensors(path))
        for layer in model.modules():
            if isinstance(layer, LinearBase | VocabParallelEmbedding) and hasattr(
                layer, "cpu_linear"
            ):
                layer.quant_method.process_weights_after_loading(layer)

    def dockyard_write_adapter(self, name: str, files_json: str) -> str:
        """Write a PEFT adapter directory from ``{file name: base64 bytes}`` (JSON) and return its
        path, for ``/v1/load_lora_adapter``. Every worker writes its own copy: with tensor
        parallelism over several hosts, each host's workers read their local one."""
        files = json.loads(files_json)
        if not isinstance(files, dict) or set(files) != _ADAPTER_FILES:
            got = sorted(files) if isinstance(files, dict) else type(files).__name__
            raise ValueError(f"an adapter is exactly {sorted(_ADAPTER_FILES)}, got {got}")
        directory = adapter_dir(name)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=_made(ADAPTER_ROOT)))
        for file_name, encoded in files.items():
            (staging / file_name).write_bytes(base64.b64decode(encoded, validate=True))
        shutil.rmtree(directory, ignore_errors=True)  # a resent version replaces its own copy
        staging.rename(directory)  # whole or absent: the loader never sees half an adapter
        return str(directory)

    def dockyard_remove_adapter(self, name: str) -> bool:
        """Delete adapter ``name``'s directory (once vLLM holds it in memory, or never will)."""
        shutil.rmtree(adapter_dir(name), ignore_errors=True)
        return True

    def dockyard_weight_checksum(self) -> float:
        """Sum of all parameters (float64): cheap evidence that a refit changed the weights."""
        import torch

        model = self.model_runner.model  # type: ignore[attr-defined]  # self is vLLM's worker (mixed in)
        with torch.no_grad():
            return float(sum(p.detach().double().sum() for p in model.parameters()))


def _made(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory
