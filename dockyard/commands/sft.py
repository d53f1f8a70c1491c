"""``dockyard sft --config PATH [--run-dir DIR] [overrides]``: supervised fine-tuning as a stage
of its own (stage 1 of the V4-style recipe).

The same SFT step as the quickstart's warm start (:func:`dockyard.consumers.trainer.sft.run_sft`)
on ``data.train`` (prompts rendered as the GRPO stage renders them, the record's ``answer`` as
the target), checked every ``sft.val_period`` steps on ``sft.dev_dataset`` (else
``data.validation``) with its environment, then written as a Hugging Face directory
``<run-dir>/model`` that a GRPO config starts from with ``policy.model_name: <run-dir>/model``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dockyard.commands._cli import CliError, CommandRegistrar, add_config_arguments
from dockyard.commands._common import EXIT_INVALID_CONFIG, load_role_config
from dockyard.utils.private_files import private_dir

MODEL_DIR = "model"
RESULT_FILE = "sft_result.json"


def _run(args: argparse.Namespace) -> int:
    from dockyard.config.errors import ConfigIssue
    from dockyard.consumers.trainer.evaluation import Evaluator
    from dockyard.consumers.trainer.sft import run_sft
    from dockyard.data.chat import build_prompt_dataset
    from dockyard.environments.base import EnvironmentContext
    from dockyard.environments.registry import build_environment
    from dockyard.models import load_policy, load_processor
    from dockyard.models.tiny import save_policy
    from dockyard.utils.logging import get_logger

    config = load_role_config(args)
    sft, data = config.sft, config.data
    if sft is None or not sft.enabled:
        raise CliError(f"{ConfigIssue('sft.enabled', 'is false: nothing to train')}", 2)
    dev_config = sft.dev_dataset or data.validation
    if dev_config is None:
        issue = ConfigIssue(
            "sft.dev_dataset", "sft needs sft.dev_dataset or data.validation for its check"
        )
        raise CliError(str(issue), exit_code=EXIT_INVALID_CONFIG)
    if data.extra_train_dataloaders:
        # The GRPO dispatcher mixes them; SFT trains on data.train alone, so they would be
        # read by nothing here.
        issue = ConfigIssue(
            "data.extra_train_dataloaders",
            "dockyard sft trains on data.train only; put the records in one file",
        )
        raise CliError(str(issue), exit_code=EXIT_INVALID_CONFIG)
    if data.train.fields.images is not None:
        # SFT's batches are the prompt text and the answer: the images would be dropped.
        issue = ConfigIssue(
            "data.train.fields.images",
            "dockyard sft trains on text only; its records' images would be dropped",
        )
        raise CliError(str(issue), exit_code=EXIT_INVALID_CONFIG)
    run_dir = Path(args.run_dir or Path(config.run.output_dir) / config.run.name)
    private_dir(run_dir)
    model, tokenizer = load_policy(
        config.policy.model_name, "float32", tokenizer_name=config.policy.tokenizer.name
    )
    train = build_prompt_dataset(data.train, data, config.policy.tokenizer, tokenizer)
    dev = build_prompt_dataset(dev_config, data, config.policy.tokenizer, tokenizer)
    context = EnvironmentContext(env=config.env, distillation=config.on_policy_distillation)
    evaluator = Evaluator(
        model,
        tokenizer,
        dev,
        build_environment(dev_config.env or data.default_env, context),
        max_new_tokens=config.policy.generation.max_new_tokens,
        max_samples=config.grpo.max_val_samples,
        batch_size=config.grpo.val_batch_size,
    )
    result = run_sft(model, tokenizer, train, sft, lambda: evaluator.evaluate_blocking().accuracy)
    # A VLM's directory keeps its image processor, so the GRPO stage it starts can feed images.
    processor = load_processor(config.policy.model_name)
    out = save_policy(model, tokenizer, run_dir / MODEL_DIR, processor=processor)
    summary = {
        "steps": result.steps,
        "val_accuracy": result.val_accuracy,
        "stopped_early": result.stopped_early,
        "skipped_nonfinite_grad_steps": result.skipped_nonfinite_grad_steps,
        "seconds": result.seconds,
        "model": str(out),
    }
    (run_dir / RESULT_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    get_logger(__name__).info("sft.done", **summary)
    print(
        f"trained {result.steps} SFT steps; dev accuracy {result.val_accuracy}; model written to "
        f"{out} (start GRPO from it with policy.model_name={out})"
    )
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "sft", help="Supervised fine-tuning: train on data.train, write a model GRPO starts from"
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--run-dir",
        default=None,
        help=f"default: <run.output_dir>/<run.name>; the model goes to RUN_DIR/{MODEL_DIR}",
    )
    parser.set_defaults(handler=_run)
