"""Reference maths for engine tests: the processed distribution, computed independently."""

from __future__ import annotations

import numpy as np
import torch


def reference_logprobs(
    model: torch.nn.Module,
    prompt: list[int],
    response: list[int],
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
) -> np.ndarray:
    """Log-probs of ``response`` under the processed distribution, from one fresh forward pass
    of the whole sequence (no cache, no padding) and an independent float64 numpy
    implementation of temperature → top-k → top-p."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double().numpy()
    out = []
    for row, token in zip(logits, response, strict=True):
        scaled = row / temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        if top_k is not None:
            kept = np.zeros_like(probs, dtype=bool)
            kept[np.argsort(-scaled, kind="stable")[:top_k]] = True
            probs = np.where(kept, probs, 0.0)
            probs /= probs.sum()
        if top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            mass_before = np.cumsum(probs[order]) - probs[order]
            kept = np.zeros_like(probs, dtype=bool)
            kept[order[mass_before < top_p]] = True
            probs = np.where(kept, probs, 0.0)
            probs /= probs.sum()
        out.append(np.log(probs[token]))
    return np.asarray(out)
