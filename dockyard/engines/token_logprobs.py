"""Log-probs of given tokens under a causal LM: what a teacher scores and what a completions
server returns as ``prompt_logprobs``.

Sequences are right-padded into batches, shortest first (causal attention: padding after a
sequence cannot change its logits), and ``log_softmax`` runs only on the positions asked for, so
a long sequence over a large vocabulary never materialises ``len × vocab`` log-probs at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch


def batched_logits(
    model: torch.nn.Module,
    sequences: Sequence[np.ndarray],
    *,
    batch_size: int,
    device: str = "cpu",
) -> Iterator[tuple[int, torch.Tensor]]:
    """``(index, logits)`` for every non-empty sequence: ``logits[p]`` predicts token ``p + 1``
    (``len(sequence) × vocab``, a view into its batch's output)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    with torch.inference_mode():
        for begin in range(0, len(order), batch_size):
            indices = [i for i in order[begin : begin + batch_size] if len(sequences[i])]
            if not indices:
                continue
            longest = max(len(sequences[i]) for i in indices)
            input_ids = torch.zeros((len(indices), longest), dtype=torch.long)
            attention = torch.zeros((len(indices), longest), dtype=torch.long)
            for row, index in enumerate(indices):
                length = len(sequences[index])
                input_ids[row, :length] = torch.as_tensor(
                    np.asarray(sequences[index], dtype=np.int64)
                )
                attention[row, :length] = 1
            logits = model(
                input_ids=input_ids.to(device), attention_mask=attention.to(device)
            ).logits
            for row, index in enumerate(indices):
                yield index, logits[row, : len(sequences[index])]


@dataclass(frozen=True)
class TokenLogprobs:
    """``logprobs[j]`` = ``log p(sequence[start + j] | sequence[: start + j])``; ``ranks[j]`` its
    1-based rank in that distribution (1 = the most likely token)."""

    logprobs: np.ndarray
    ranks: np.ndarray


def token_logprobs(logits: torch.Tensor, sequence: np.ndarray, start: int) -> TokenLogprobs:
    """The log-probs (and ranks) of ``sequence[start:]``, each given the tokens before it."""
    if start < 1:
        raise ValueError(f"start must be at least 1 (the first token has no context), not {start}")
    # The token at position p is predicted by the logits at p - 1.
    positions = torch.arange(start - 1, len(sequence) - 1, device=logits.device)
    targets = torch.as_tensor(np.asarray(sequence[start:], dtype=np.int64), device=logits.device)
    distribution = torch.log_softmax(logits[positions].float(), dim=-1)
    chosen = distribution.gather(-1, targets.unsqueeze(-1))
    ranks = (distribution > chosen).sum(dim=-1) + 1
    return TokenLogprobs(
        logprobs=chosen.squeeze(-1).cpu().numpy().astype(np.float32),
        ranks=ranks.cpu().numpy().astype(np.int64),
    )


def continuation_logprobs(
    model: torch.nn.Module,
    prompt_ids: np.ndarray,
    continuations: Sequence[np.ndarray],
    *,
    batch_size: int,
    device: str = "cpu",
) -> list[np.ndarray]:
    """``log p(continuation[t] | prompt, continuation[:t])`` for every token of every
    continuation (an empty continuation gets an empty array)."""
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    sequences = [
        np.concatenate([prompt, np.asarray(c, dtype=np.int64)]) if len(c) else prompt[:0]
        for c in continuations
    ]
    results = [np.zeros(0, dtype=np.float32) for _ in continuations]
    for index, logits in batched_logits(model, sequences, batch_size=batch_size, device=device):
        results[index] = token_logprobs(logits, sequences[index], len(prompt)).logprobs
    return results
