"""How far a batch's behaviour log-probs are from the trainer's, per sample, as plain sums.

Pure torch, no worker ids and no judging (that is :mod:`.worker_trust`): what every trainer
rank computes on its share of a screened batch (:mod:`.ranks`), so that rank 0 can put the
shares' rows back together before it judges any worker. Sums, not means, because a worker's
agreement is pooled over its samples' tokens: rows from different ranks add up exactly.
"""

from __future__ import annotations

import torch

from dockyard.algorithms.kl import kl_estimate
from dockyard.algorithms.masked import masked_sum
from dockyard.consumers.trainer.batch import TrainingBatch

#: The columns of :func:`agreement_sums`.
TOKENS, MULT_ERROR_SUM, GEN_KL_SUM = 0, 1, 2


def agreement_sums(batch: TrainingBatch, trainer_logprobs: torch.Tensor) -> torch.Tensor:
    """``[B, 3]`` float64 on the CPU: per sample (row of ``batch``), its response tokens, the
    sum over them of exp(|behaviour − trainer|) and of the k3 estimate of
    KL(π_behaviour ‖ π_trainer). ``trainer_logprobs``: ``[B, L-1]``, as
    ``PolicyTrainer.batch_logprobs`` returns them."""
    behaviour = batch.generation_logprobs.float()
    trainer = trainer_logprobs.detach().float().to(behaviour.device)
    mask = batch.token_mask
    mult = masked_sum(torch.exp((behaviour - trainer).abs()), mask, dim=-1)
    kl = masked_sum(kl_estimate(behaviour, trainer, "k3"), mask, dim=-1)
    tokens = mask.sum(dim=-1)
    # float64 holds each float32 sum exactly: one rank or several, the same numbers.
    return torch.stack([tokens.double(), mult.double(), kl.double()], dim=1).cpu()
