"""A client asking an OpenAI-compatible completions server (``dockyard model serve``, vLLM's
server) for the log-probs of given token sequences: the teacher side of on-policy distillation.

Each sequence (prompt + sampled response) goes out as a token-id prompt with
``prompt_logprobs: 0`` and ``max_tokens: 1``; the reply's ``choices[i].prompt_logprobs[t]`` holds
``log p(sequence[t] | sequence[:t])`` under the token's id. A reply that does not describe exactly
the tokens sent (wrong count, a missing token) is an error, never patched up.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from dockyard.engines.base import EngineError
from dockyard.engines.http_client import ServerPool


class _TokenLogprob(BaseModel):
    model_config = ConfigDict(extra="allow")
    logprob: float


class _Choice(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: int
    prompt_logprobs: list[dict[str, _TokenLogprob] | None]


class _Completion(BaseModel):
    model_config = ConfigDict(extra="allow")
    choices: list[_Choice]


class PromptLogprobsClient:
    """Log-probs of continuations from the server at ``base_url``, which must serve
    ``model_name`` (the server refuses a name it does not serve)."""

    def __init__(
        self, base_url: str, model_name: str, *, timeout_s: float, batch_size: int
    ) -> None:
        self._pool = ServerPool([base_url], timeout_s=timeout_s, backend="teacher")
        self.url = self._pool.urls[0]
        self.model_name = model_name
        self.batch_size = batch_size

    async def continuation_logprobs(
        self, prompt_ids: np.ndarray, continuations: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """``log p(continuation[t] | prompt, continuation[:t])`` per token of each continuation
        (an empty continuation gets an empty array and is not sent)."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EngineError("prompt log-probs need a non-empty prompt (the first token has none)")
        results = [np.zeros(0, dtype=np.float32) for _ in continuations]
        pending = [i for i, c in enumerate(continuations) if len(c)]
        for begin in range(0, len(pending), self.batch_size):
            indices = pending[begin : begin + self.batch_size]
            sequences = [prompt + [int(t) for t in continuations[i]] for i in indices]
            for index, values in zip(
                indices, await self._score(sequences, len(prompt)), strict=True
            ):
                results[index] = values
        return results

    async def _score(self, sequences: list[list[int]], start: int) -> list[np.ndarray]:
        body = {
            "model": self.model_name,
            "prompt": sequences,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        }
        reply = await self._pool.post(self.url, "/v1/completions", json=body)
        try:
            completion = _Completion.model_validate(reply.json())
        except (ValueError, ValidationError) as error:
            raise EngineError(f"unexpected completions reply from {self.url}: {error}") from error
        choices = sorted(completion.choices, key=lambda c: c.index)
        if [c.index for c in choices] != list(range(len(sequences))):
            raise EngineError(
                f"{self.url} answered choices {[c.index for c in choices]} for "
                f"{len(sequences)} prompts"
            )
        return [
            self._read(choice.prompt_logprobs, sequence, start)
            for choice, sequence in zip(choices, sequences, strict=True)
        ]

    def _read(
        self,
        entries: list[dict[str, _TokenLogprob] | None],
        sequence: list[int],
        start: int,
    ) -> np.ndarray:
        if len(entries) != len(sequence):
            raise EngineError(
                f"{self.url} returned {len(entries)} prompt log-probs for {len(sequence)} tokens"
            )
        values = []
        for position in range(start, len(sequence)):
            entry = entries[position]
            token = str(sequence[position])
            if entry is None or token not in entry:
                raise EngineError(
                    f"{self.url} returned no log-prob for token {token} at position {position}"
                )
            values.append(entry[token].logprob)
        return np.asarray(values, dtype=np.float32)

    async def aclose(self) -> None:
        await self._pool.aclose()
