"""The warm start's batch: position t of the target mask is the loss on predicting token t+1."""

from __future__ import annotations

import torch

from dockyard.consumers.trainer.sft import sft_batch

PAD = 0


def test_the_answer_is_learnt_and_the_prompt_and_padding_are_not() -> None:
    input_ids, attention, target = sft_batch([[5, 6], [7]], [[8, 9], [10]], PAD, "response")
    assert input_ids.tolist() == [[5, 6, 8, 9], [7, 10, PAD, PAD]]
    assert attention.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    # Row 0 predicts 6 (prompt), 8, 9; row 1 predicts 10, then padding.
    assert target.tolist() == [[0, 1, 1], [1, 0, 0]]


def test_an_answer_mask_leaves_out_the_tokens_it_zeroes() -> None:
    # A tool demonstration: call 8, observation 9 (not learnt), answer 10.
    _, _, target = sft_batch([[5, 6]], [[8, 9, 10]], PAD, "response", [[1, 0, 1]])
    assert target.tolist() == [[0, 1, 0, 1]]
    _, _, everything = sft_batch([[5, 6]], [[8, 9, 10]], PAD, "all", [[1, 0, 1]])
    assert everything.tolist() == [[1, 1, 0, 1]]
    assert target.dtype == torch.float32
