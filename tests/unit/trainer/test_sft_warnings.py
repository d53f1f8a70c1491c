"""The SFT warm start reports its progress without a torch warning (issue #42, item 6: a
``UserWarning`` from the warm start's progress line was printed over ``dockyard run``'s table)."""

from __future__ import annotations

import warnings

from dockyard.config.sections.sft import SFTConfig
from dockyard.consumers.trainer.sft import run_sft
from dockyard.data.arithmetic import ArithmeticDataset
from dockyard.models.tiny import build_arithmetic_policy


def test_the_warm_start_progress_line_warns_about_nothing() -> None:
    model, tokenizer = build_arithmetic_policy()
    dataset = ArithmeticDataset("arithmetic/train", ((12, 30), (45, 11)), env="arithmetic")
    config = SFTConfig(max_num_steps=2, batch_size=2, lr=1e-3, val_period=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test, torch's UserWarning included
        result = run_sft(model, tokenizer, dataset, config, evaluate=lambda: 0.0)
    assert result.steps == 2 and result.val_accuracy == 0.0
