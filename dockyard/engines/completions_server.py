"""A model served over the OpenAI-compatible completions API for scoring: the teacher server of
on-policy distillation (``dockyard model serve``).

It answers the request a teacher scorer sends to vLLM's OpenAI server — ``POST
/v1/completions`` with token-id prompts, ``prompt_logprobs`` and ``max_tokens: 1`` — in vLLM's
reply format: ``choices[i].prompt_logprobs`` is ``null`` for the first token, then for every
later token ``{"<token id>": {"logprob", "rank", "decoded_token"}}``. The one completion token a
completions request must produce is the greedy next token (``temperature: 0``). Sampling is the
rollout engines' job (torch/vLLM/SGLang): a request for anything else — several tokens, sampling,
top-k prompt log-probs — is refused with 400 and the reason, never answered approximately.

Forward passes run one at a time in a worker thread (torch already uses every core for one
batch); the event loop stays free to accept requests meanwhile.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from dockyard.engines.token_logprobs import batched_logits, token_logprobs
from dockyard.utils.logging import get_logger

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = get_logger(__name__)


class CompletionRequest(BaseModel):
    """The subset of vLLM's completions request this server answers exactly."""

    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: list[list[int]] = Field(min_length=1)
    max_tokens: Literal[1] = Field(
        description="scoring needs the prompt's log-probs; the one token vLLM insists on"
    )
    temperature: float = Field(0.0, ge=0.0, le=0.0, description="greedy: the one token")
    n: Literal[1] = 1
    prompt_logprobs: Literal[0] = Field(
        description="0: only the prompt tokens' own log-probs (top-k alternatives not served)"
    )

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt_is_a_batch_of_one(cls, value: object) -> object:
        # The API takes a single token-id prompt or a list of them.
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            return [value]
        return value


@dataclass
class ServedModel:
    """The model a server answers for, its tokenizer, and how it batches forwards."""

    name: str
    model: PreTrainedModel
    tokenizer: Any
    batch_size: int = 8
    device: str = "cpu"

    def __post_init__(self) -> None:
        # The logits' width: a token id at or past it has no log-prob to return.
        self._vocab = int(self.model.config.vocab_size)
        self._lock = threading.Lock()

    def check_tokens(self, prompts: list[list[int]]) -> str | None:
        """Why the prompts cannot be scored, or None."""
        for index, prompt in enumerate(prompts):
            if len(prompt) < 1:
                return f"prompt {index} is empty"
            bad = [t for t in prompt if not 0 <= t < self._vocab]
            if bad:
                return (
                    f"prompt {index} has token ids outside the vocabulary "
                    f"[0, {self._vocab}): {bad[:5]}"
                )
        return None

    def complete(self, prompts: list[list[int]]) -> list[dict[str, Any]]:
        """vLLM-shaped ``choices``: each prompt's log-probs and its greedy next token."""
        sequences = [np.asarray(p, dtype=np.int64) for p in prompts]
        choices: list[dict[str, Any]] = [{} for _ in prompts]
        with self._lock:
            for index, logits in batched_logits(
                self.model, sequences, batch_size=self.batch_size, device=self.device
            ):
                choices[index] = self._choice(index, sequences[index], logits)
        return choices

    def _choice(self, index: int, sequence: np.ndarray, logits: torch.Tensor) -> dict[str, Any]:
        prompt_logprobs: list[dict[str, dict[str, Any]] | None] = [None]
        if len(sequence) > 1:
            scored = token_logprobs(logits, sequence, 1)
            for token, logprob, rank in zip(
                sequence[1:].tolist(), scored.logprobs.tolist(), scored.ranks.tolist(), strict=True
            ):
                prompt_logprobs.append(
                    {
                        str(token): {
                            "logprob": logprob,
                            "rank": rank,
                            "decoded_token": self.tokenizer.decode([token]),
                        }
                    }
                )
        last = torch.log_softmax(logits[-1].float(), dim=-1)
        greedy = int(torch.argmax(last))
        return {
            "index": index,
            "text": self.tokenizer.decode([greedy]),
            "token_ids": [greedy],
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "prompt_logprobs": prompt_logprobs,
        }


def _error(status: int, message: str) -> JSONResponse:
    # vLLM's error body, so a client handles both servers' refusals alike.
    return JSONResponse(
        {"error": {"message": message, "type": "BadRequestError", "code": status}}, status
    )


def build_app(served: ServedModel) -> Starlette:
    async def health(_: Request) -> JSONResponse:
        return JSONResponse({})

    async def models(_: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": served.name, "object": "model", "owned_by": "dockyard"}],
            }
        )

    async def completions(request: Request) -> JSONResponse:
        try:
            body = CompletionRequest.model_validate(await request.json())
        except ValueError as error:  # a JSON syntax error or a ValidationError
            detail = (
                "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
                if isinstance(error, ValidationError)
                else str(error)
            )
            return _error(400, f"this server answers scoring requests only: {detail}")
        if body.model != served.name:
            return _error(
                404, f"the model {body.model!r} does not exist; this server serves {served.name!r}"
            )
        problem = served.check_tokens(body.prompt)
        if problem is not None:
            return _error(400, problem)
        choices = await asyncio.to_thread(served.complete, body.prompt)
        prompt_tokens = sum(len(p) for p in body.prompt)
        return JSONResponse(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": served.name,
                "choices": choices,
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(choices),
                    "total_tokens": prompt_tokens + len(choices),
                },
            }
        )

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/completions", completions, methods=["POST"]),
        ]
    )


def serve(
    served: ServedModel,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until interrupted. The socket is bound and listening before ``on_ready(url)`` is
    called (connections made from then on wait in its backlog until the loop accepts them), so
    ``port=0`` works: the URL names the port the system chose."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    url = f"http://{host}:{sock.getsockname()[1]}"
    # No uvicorn logging config: its access log writes to stdout, which carries the ready line.
    config = uvicorn.Config(build_app(served), log_config=None, access_log=False, lifespan="off")
    log.info("completions_server.listening", url=url, model=served.name)
    if on_ready is not None:
        on_ready(url)
    uvicorn.Server(config).run(sockets=[sock])
