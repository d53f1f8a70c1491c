"""Where the trainer's tensors live and in which precision its math runs.

Device: ``cuda:$LOCAL_RANK`` when torch sees a GPU (``torchrun`` sets ``LOCAL_RANK``; a single
process uses GPU 0), else the CPU. ``CUDA_VISIBLE_DEVICES=`` (empty) keeps a GPU machine's trainer
on the CPU. The policy, its frozen reference copy, the π_old pass, the loss and its metrics all
use the policy's device.

Precision (``policy.precision``): the usual mixed-precision policy. Parameters, gradients and
the optimizer state stay float32 (the *master weights*: small updates to bf16 weights round to
nothing); forward and backward run under :func:`torch.autocast` in ``bfloat16`` / ``float16``;
log-probs and the loss are computed in float32 from the logits. ``float16`` adds dynamic loss
scaling (:class:`torch.amp.GradScaler`) against gradient underflow. ``float32`` runs everything
in float32. Published weights are cast to ``policy.precision`` (what the engines load).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from dockyard.models.loading import precision_dtype


def training_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


@contextlib.contextmanager
def compute_precision(device: torch.device, precision: str) -> Iterator[None]:
    """Autocast to ``precision`` on ``device`` (nothing for float32)."""
    dtype = precision_dtype(precision)
    if dtype == torch.float32:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """Dynamic loss scaling for float16; a pass-through (``enabled=False``) otherwise."""
    return torch.amp.GradScaler(device.type, enabled=precision == "float16")
