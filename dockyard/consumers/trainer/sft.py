"""Supervised warm start: teach the answer format before GRPO has anything to reinforce.

A policy that never produces a correct answer gets zero-variance groups and no gradient; a short
SFT stage on (prompt, ground truth) pairs fixes that. The loss covers the answer tokens (and EOS)
only, unless ``sft.loss_on: all``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dockyard.config.sections.sft import SFTConfig
from dockyard.data.base import Dataset, PromptRecord
from dockyard.data.demonstrations import Continuation
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class SFTResult:
    steps: int
    val_accuracy: float | None
    seconds: float
    stopped_early: bool
    #: Steps whose gradient was not finite: not applied (the weights stayed as they were).
    skipped_nonfinite_grad_steps: int = 0


def sft_batch(
    prompts: list[list[int]],
    answers: list[list[int]],
    pad_token_id: int,
    loss_on: str,
    answer_masks: list[list[int]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and the ``[B, L-1]`` target mask of a batch;
    ``answer_masks``: which answer tokens are learnt (all of them when None)."""
    width = max(len(p) + len(a) for p, a in zip(prompts, answers, strict=True))
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    target_mask = torch.zeros((len(prompts), width - 1))
    for row, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        sequence = prompt + answer
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention[row, : len(sequence)] = 1
        first_target = 0 if loss_on == "all" else len(prompt) - 1
        target_mask[row, first_target : len(sequence) - 1] = 1.0
        if answer_masks is not None:
            # Position t predicts token t+1: the answer's token i is predicted at len(prompt)-1+i.
            mask = torch.tensor(answer_masks[row], dtype=target_mask.dtype)
            target_mask[row, len(prompt) - 1 : len(sequence) - 1] = mask
    return input_ids, attention, target_mask


def run_sft(
    model: torch.nn.Module,
    tokenizer: object,
    dataset: Dataset,
    config: SFTConfig,
    evaluate: Callable[[], float],
    continuation: Callable[[PromptRecord], Continuation] | None = None,
) -> SFTResult:
    """Train until ``max_num_steps`` or until ``evaluate()`` (every ``val_period`` steps)
    reaches ``stop_at_val_accuracy``. ``continuation``: what follows a record's prompt and
    which of it is learnt (a tool-use demonstration); by default its ground truth and EOS."""
    started = time.perf_counter()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    device = next(model.parameters()).device  # the trainer's: the model is trained in place
    rng = random.Random(config.seed)
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]  # tokenizer: object here (no transformers types in consumers)
    pad = tokenizer.pad_token_id  # type: ignore[attr-defined]  # tokenizer: object here
    accuracy: float | None = None
    step = 0
    skipped = 0
    for step in range(1, config.max_num_steps + 1):
        records = [dataset[rng.randrange(len(dataset))] for _ in range(config.batch_size)]
        prompts = [tokenizer(r.prompt)["input_ids"] for r in records]  # type: ignore[operator]  # a transformers tokenizer, typed object here
        masks: list[list[int]] | None = None
        if continuation is None:
            answers = [
                tokenizer(r.ground_truth, add_special_tokens=False)["input_ids"] + [eos]  # type: ignore[operator]  # a transformers tokenizer, typed object here
                for r in records
            ]
        else:
            continued = [continuation(r) for r in records]
            answers, masks = [c.token_ids for c in continued], [c.loss_mask for c in continued]
        input_ids, attention, target_mask = (
            t.to(device) for t in sft_batch(prompts, answers, pad, config.loss_on, masks)
        )
        model.train()
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            input_ids[:, 1:].reshape(-1),
            reduction="none",
        ).view_as(target_mask)
        loss = (losses * target_mask).sum() / target_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        # A non-finite gradient is never applied: AdamW would write NaN into every weight, and
        # the warm-started weights are what GRPO starts from and the workers first load.
        grad_norm = torch.nn.utils.get_total_norm(
            [p.grad for p in model.parameters() if p.grad is not None]
        )
        if torch.isfinite(grad_norm):
            optimizer.step()
        else:
            skipped += 1
            log.warning(
                "sft.nonfinite_gradient_skipped",
                step=step,
                grad_norm=float(grad_norm),
                loss=float(loss),
                reason="the optimizer step is not applied; the weights stay as they were",
            )
        if step % config.val_period == 0:
            model.eval()
            accuracy = evaluate()
            # Detached: a scalar read off a tensor that requires grad makes torch warn, on the
            # terminal of a run whose roles share it.
            log.info("sft.progress", step=step, loss=float(loss.detach()), val_accuracy=accuracy)
            if config.stop_at_val_accuracy is not None and accuracy >= config.stop_at_val_accuracy:
                return SFTResult(step, accuracy, time.perf_counter() - started, True, skipped)
    model.eval()
    return SFTResult(step, accuracy, time.perf_counter() - started, False, skipped)
