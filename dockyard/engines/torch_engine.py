"""The torch engine: batched sampling with a KV cache on any ``transformers`` causal LM.

A vision-language policy (built with its :class:`~dockyard.models.vision.VisionProcessor`)
generates with images: each request's placeholders are expanded
(:func:`~dockyard.models.vision.ensure_expanded`), the prefill gets the images' pixel values
and Qwen2-VL's 3-D M-RoPE positions (the model's own ``get_rope_index``, as in training), and
every result reports the expanded prompt ids the model attended to.

The default backend on CPU. Prompts are left-padded into one batch (attention mask + explicit
position ids), the prompt is prefilled once and every step feeds one token per row with the
cache. Sampling follows :func:`processed_logprobs`, so the returned log-prob of a token is the
log of its probability in the distribution it was drawn from. A ``seed`` makes a call
reproducible (a private ``torch.Generator``; the global RNG is untouched).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

import numpy as np
import torch
from PIL import Image

from dockyard.engines.base import (
    EngineError,
    EngineHealth,
    FinishReason,
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    GenerationTimings,
    InflightRefitPolicy,
    SamplingParams,
    WeightSource,
    check_request_shapes,
    refuse_images,
)
from dockyard.engines.refit import ModelClaim, RefitTicket
from dockyard.engines.sampling import processed_logprobs
from dockyard.engines.weight_loading import load_into_module, read_state_dict
from dockyard.models.vision import (
    VisionProcessor,
    ensure_expanded,
    forward_kwargs,
    mrope_positions,
    pixel_inputs,
)
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

StepObserver = Callable[[int], None]
StateDict = dict[str, torch.Tensor]


class _EngineOptions(TypedDict, total=False):
    """The keyword options of :class:`TorchEngine` that ``from_pretrained`` passes through."""

    initial_version: int
    inflight_refit_policy: InflightRefitPolicy
    max_batch_size: int | None
    max_model_len: int | None
    step_observer: StepObserver | None


# How many characters of decoded tail to search for stop strings: a stop string must end in
# the newest token, so a window a little longer than the longest stop string suffices.
_STOP_TAIL_TOKENS_MARGIN = 8


@dataclass
class _Row:
    """One sample being generated."""

    request_index: int
    sample_index: int
    request_id: str
    prompt: Sequence[int]
    images: Sequence[Image.Image] = ()
    #: The prompt differs from the request's (placeholders expanded): reported in the result.
    expanded: bool = False
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    finished_at: float | None = None


class TorchEngine(GenerationEngine):
    """Generation on a ``transformers`` model held in this process.

    ``inflight_refit_policy`` decides what a refit does to a batch being decoded:
    ``finish_on_old`` applies it when the batch ends; ``continue_on_new`` applies it between
    two decode steps (the KV cache of earlier tokens stays as computed). Each token records the
    version of the weights that produced its distribution either way.

    ``step_observer(num_generated)`` is called in the decode thread after every step; it is an
    instrumentation hook (metrics, tests) and must not block for long.
    """

    backend = "torch"

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        tokenizer: object | None = None,
        initial_version: int = 0,
        inflight_refit_policy: InflightRefitPolicy = "finish_on_old",
        max_batch_size: int | None = None,
        max_model_len: int | None = None,
        step_observer: StepObserver | None = None,
        processor: VisionProcessor | None = None,
    ) -> None:
        self._model = model.eval()
        self._processor = processor
        # A policy never writes an image: a sampled placeholder would be an image run with no
        # pixels (the next turn's prefill and the trainer refuse it), so they are never drawn.
        self._unsampled = (
            []
            if processor is None
            else [
                processor.image_token_id,
                processor.vision_start_token_id,
                processor.vision_end_token_id,
            ]
        )
        self._eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self._pad_token_id = int(pad_token_id)
        self._tokenizer = tokenizer
        self._version = initial_version
        self._policy: InflightRefitPolicy = inflight_refit_policy
        self._max_batch_size = max_batch_size
        config = getattr(model, "config", None)
        self._max_model_len = max_model_len or getattr(config, "max_position_embeddings", None)
        self._step_observer = step_observer
        self._claim: ModelClaim[StateDict] = ModelClaim(self._apply_refit)
        self._abort = threading.Event()
        self._closed = False
        #: The weights LoRA adapters merge onto (taken at the first adapter: LoRA never changes
        #: the base), so every version is base + its adapter, never a merge of merges.
        self._lora_base: dict[str, torch.Tensor] | None = None

    @classmethod
    def from_pretrained(
        cls,
        model_name: str,
        *,
        precision: str = "float32",
        tokenizer_name: str | None = None,
        **kwargs: Unpack[_EngineOptions],
    ) -> TorchEngine:
        """Load ``model_name`` (``tiny://NAME`` or an HF directory) with its tokenizer."""
        from dockyard.models import load_policy, load_processor

        model, tokenizer = load_policy(model_name, precision, tokenizer_name=tokenizer_name)
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        if eos is None or pad is None:
            raise EngineError(f"tokenizer of {model_name} defines no EOS token")
        processor = load_processor(model_name)
        return cls(
            model,
            eos_token_ids=[eos],
            pad_token_id=pad,
            tokenizer=tokenizer,
            processor=processor,
            **kwargs,
        )

    @property
    def current_version(self) -> int:
        return self._version

    @property
    def accepts_images(self) -> bool:
        """Only a vision-language policy (one built with its processor) sees images."""
        return self._processor is not None

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @property
    def inflight_refit_policy(self) -> InflightRefitPolicy:
        return self._policy

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams, num_samples: int
    ) -> list[GenerationResult]:
        self._check_open()
        check_request_shapes(requests, num_samples)
        if self._processor is None:
            refuse_images(requests, self.backend)
        if params.stop_strings and self._tokenizer is None:
            raise EngineError("stop strings need a tokenizer; construct the engine with one")
        return await asyncio.to_thread(self.generate_blocking, requests, params, num_samples)

    def generate_blocking(
        self, requests: Sequence[GenerationRequest], params: SamplingParams, num_samples: int
    ) -> list[GenerationResult]:
        """The synchronous body of :meth:`generate` (for callers already in a thread)."""
        self._check_open()
        check_request_shapes(requests, num_samples)
        started = time.perf_counter()
        prompts = [self._prompt(request) for request in requests]
        rows = [
            _Row(
                index,
                sample,
                request.request_id,
                prompts[index],
                request.images,
                expanded=len(prompts[index]) != len(request.prompt_token_ids),
            )
            for index, request in enumerate(requests)
            for sample in range(num_samples)
        ]
        generator = None
        if params.seed is not None:
            device = next(self._model.parameters()).device  # multinomial needs it there
            generator = torch.Generator(device=device).manual_seed(params.seed)
        batch_size = self._max_batch_size or len(rows)
        first_token_at: float | None = None
        self._claim.acquire()
        try:
            for offset in range(0, len(rows), batch_size):
                if offset and self._policy == "continue_on_new":
                    self._claim.apply_pending()
                batch_first = self._decode_batch(
                    rows[offset : offset + batch_size], params, generator
                )
                if first_token_at is None:
                    first_token_at = batch_first
        finally:
            self._claim.release()
        return [self._result(row, started, first_token_at) for row in rows]

    def request_refit(self, version: int, state: StateDict) -> RefitTicket[StateDict]:
        """Queue (or apply at once, when idle) a refit without blocking; thread-safe.

        The state is validated against the model first, so a bad source raises here and
        leaves the model untouched. Wait on ``ticket.done`` for the outcome.
        """
        self._check_open()
        state = self._merged_if_adapter(state)
        load_into_module(self._model, state, dry_run=True)
        ticket: RefitTicket[StateDict] = RefitTicket(version, state)
        self._claim.request(ticket)
        return ticket

    async def update_weights(self, version: int, source: WeightSource) -> None:
        started = time.perf_counter()
        state = await asyncio.to_thread(read_state_dict, source)
        ticket = self.request_refit(version, state)
        await asyncio.to_thread(ticket.done.wait)
        if ticket.outcome == "failed":
            raise EngineError(f"refit to version {version} failed: {ticket.error}")
        log.info(
            "refit_done",
            backend=self.backend,
            version=version,
            outcome=ticket.outcome,
            seconds=round(time.perf_counter() - started, 4),
        )

    async def health(self) -> EngineHealth:
        detail = "shut down" if self._closed else ""
        pending = self._claim.pending_version
        extra = {} if pending is None else {"pending_version": str(pending)}
        return EngineHealth(not self._closed, self.backend, self._version, detail, extra)

    async def shutdown(self) -> None:
        self._closed = True
        self._abort.set()

    def _merged_if_adapter(self, state: StateDict) -> StateDict:
        """A LoRA adapter (``dockyard.models.lora``) as the whole weights it stands for."""
        from dockyard.models.lora import is_adapter, merge_adapter

        if not is_adapter(state):
            return state
        own = self._model.state_dict()
        if self._lora_base is None:
            targets = {name.rsplit(".lora_", 1)[0] + ".weight" for name in state}
            self._lora_base = {n: own[n].detach().clone() for n in targets if n in own}
        try:
            merged = merge_adapter(self._lora_base, state)
        except ValueError as error:
            raise EngineError(f"refit adapter does not fit the model: {error}") from None
        return {**own, **merged}

    def _prompt(self, request: GenerationRequest) -> list[int]:
        """The ids the model attends to: image placeholders expanded for a VLM."""
        ids = list(request.prompt_token_ids)
        if self._processor is None:
            return ids
        try:
            return ensure_expanded(self._processor, ids, request.images)
        except ValueError as error:
            raise EngineError(f"request {request.request_id!r}: {error}") from None

    def _vision(self, rows: list[_Row], input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Pixel values, grids and the modality map of ``rows``' images, in row order."""
        images = [image for row in rows for image in row.images]
        if not images:
            return {}
        assert self._processor is not None  # images reach rows only through a processor
        inputs = pixel_inputs(self._processor, images)
        return forward_kwargs(self._processor, input_ids.cpu(), inputs)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the torch engine is shut down")

    def _apply_refit(self, ticket: RefitTicket[StateDict]) -> None:
        assert ticket.state is not None
        load_into_module(self._model, ticket.state)
        self._version = ticket.version

    def _stop_ids(self, params: SamplingParams) -> frozenset[int]:
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops |= self._eos_token_ids
        return frozenset(stops)

    def _hit_stop_string(self, row: _Row, params: SamplingParams) -> bool:
        if not params.stop_strings:
            return False
        window = max(len(stop) for stop in params.stop_strings) + _STOP_TAIL_TOKENS_MARGIN
        tail = self._tokenizer.decode(row.tokens[-window:])  # type: ignore[union-attr]  # stop strings need a tokenizer (checked at request)
        return any(stop in tail for stop in params.stop_strings)

    @torch.no_grad()
    def _decode_batch(
        self, rows: list[_Row], params: SamplingParams, generator: torch.Generator | None
    ) -> float | None:
        """Generate for ``rows`` in place; returns the time of the first sampled token."""
        prompt_len = max(len(row.prompt) for row in rows)
        budget = params.max_new_tokens
        if self._max_model_len is not None:
            budget = min(budget, self._max_model_len - prompt_len)
            if budget < 1:
                raise EngineError(
                    f"prompt of {prompt_len} tokens leaves no room in the model's context "
                    f"of {self._max_model_len} tokens"
                )
        input_ids = torch.full((len(rows), prompt_len), self._pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), prompt_len), dtype=torch.long)
        for index, row in enumerate(rows):
            input_ids[index, prompt_len - len(row.prompt) :] = torch.tensor(row.prompt)
            attention[index, prompt_len - len(row.prompt) :] = 1
        # The model's device (the trainer's validation runs on its GPU when it has one).
        device = next(self._model.parameters()).device
        vision = {name: value.to(device) for name, value in self._vision(rows, input_ids).items()}
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (
            mrope_positions(self._model, input_ids, attention, vision)
            if vision
            else (attention.cumsum(-1) - 1).clamp(min=0)
        )
        output = self._model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            **vision,
        )
        stop_ids = self._stop_ids(params)
        active = list(range(len(rows)))
        first_token_at: float | None = None
        for step in range(1, budget + 1):
            logits = output.logits[:, -1, :]
            if self._unsampled:
                logits = logits.index_fill(
                    -1, torch.tensor(self._unsampled, device=logits.device), float("-inf")
                )
            logprobs = processed_logprobs(logits, params)
            if params.greedy:
                chosen = logprobs.argmax(dim=-1)
            else:
                chosen = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)
            chosen_logprobs = logprobs.gather(-1, chosen[:, None]).squeeze(-1)
            now = time.perf_counter()
            first_token_at = first_token_at or now
            for index in active:
                row = rows[index]
                token = int(chosen[index])
                row.tokens.append(token)
                row.logprobs.append(float(chosen_logprobs[index]))
                row.versions.append(self._version)
                if token in stop_ids or self._hit_stop_string(row, params):
                    row.finish_reason, row.finished_at = "stop", now
                elif step == budget:
                    row.finish_reason, row.finished_at = "length", now
            active = [index for index in active if rows[index].finish_reason is None]
            if not active:
                break
            if self._step_observer is not None:
                self._step_observer(step)
            if self._abort.is_set():
                for index in active:
                    rows[index].finish_reason, rows[index].finished_at = "abort", now
                break
            if self._policy == "continue_on_new":
                self._claim.apply_pending()
            # Finished rows keep decoding a pad token (their output is ignored) so the batch
            # and its cache stay rectangular.
            feed = chosen.clone()
            done = torch.tensor([row.finish_reason is not None for row in rows], device=device)
            feed[done] = self._pad_token_id
            attention = torch.cat(
                [attention, torch.ones((len(rows), 1), dtype=torch.long, device=device)], 1
            )
            # Text after the prompt: one more position (on each M-RoPE axis for a VLM).
            positions = positions[..., -1:] + 1
            output = self._model(
                input_ids=feed[:, None],
                attention_mask=attention,
                position_ids=positions,
                past_key_values=output.past_key_values,
                use_cache=True,
            )
        return first_token_at

    @staticmethod
    def _result(row: _Row, started: float, first_token_at: float | None) -> GenerationResult:
        finished_at = row.finished_at or time.perf_counter()
        return GenerationResult(
            request_index=row.request_index,
            sample_index=row.sample_index,
            request_id=row.request_id,
            token_ids=np.asarray(row.tokens, dtype=np.int64),
            logprobs=np.asarray(row.logprobs, dtype=np.float32),
            weight_versions=np.asarray(row.versions, dtype=np.int64),
            finish_reason=row.finish_reason or "abort",
            timings=GenerationTimings(
                first_token_s=None if first_token_at is None else first_token_at - started,
                total_s=finished_at - started,
            ),
            prompt_token_ids=np.asarray(row.prompt, dtype=np.int64) if row.expanded else None,
        )
