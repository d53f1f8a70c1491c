"""The trainer's validation runs (``data.validation``): at the start, every ``grpo.val_period``
steps and at the end; the accuracy goes to the metrics, the status file and the run summary.
And the supervised warm start (``sft``), which validates with the same evaluator."""

from __future__ import annotations

import asyncio

from dockyard.config.master import MasterConfig
from dockyard.consumers.trainer.build import TrainerParts
from dockyard.consumers.trainer.evaluation import Evaluator, log_val_samples
from dockyard.consumers.trainer.progress import TrainerSummary
from dockyard.consumers.trainer.sft import run_sft
from dockyard.data.chat import build_prompt_dataset, episode_observations
from dockyard.data.demonstrations import ToolDemonstrations
from dockyard.observability.status_files import StatusFile
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


class Validation:
    def __init__(
        self, config: MasterConfig, parts: TrainerParts, summary: TrainerSummary, status: StatusFile
    ) -> None:
        self.config = config
        self.parts = parts
        self.summary = summary
        self.status = status

    def validated_at(self, step: int) -> bool:
        return bool(self.summary.history) and self.summary.history[-1][0] == step

    async def run(self, step: int, *, log_now: bool = True) -> dict[str, float]:
        """The validation metrics at ``step`` (none without ``data.validation``); ``log_now``:
        written to the metrics at once, else the caller writes them with the step's."""
        parts = self.parts
        if parts.evaluator is None:
            return {}
        if parts.evaluation_model is not None:  # sharded: the whole copy gets the weights
            parts.evaluation_model.load_state_dict(parts.ranks.model_state())
        result = await parts.evaluator.evaluate()
        metrics = result.as_metrics()
        summary = self.summary
        if summary.val_accuracy_start is None:
            summary.val_accuracy_start = result.accuracy
        start = summary.val_accuracy_start
        summary.val_accuracy_end = result.accuracy
        summary.history.append((step, result.accuracy))
        # Both ends, so that `dockyard run` can say how accuracy moved (its end-of-run summary
        # reads the roles' status files, not the trainer's log).
        self.status.update(val_accuracy=result.accuracy, val_accuracy_start=start)
        if log_now:
            parts.metrics.log_metrics(metrics, step=step)
        log.info("trainer.validation", step=step, accuracy=result.accuracy)
        log_val_samples(result.samples[: self.config.logger.num_val_samples_to_print], step)
        return metrics

    async def warm_start(self) -> None:
        """``sft``: supervised steps on the training data before the first weights go out,
        stopped early by the validation accuracy (``sft.dev_dataset``'s, when given)."""
        sft, parts = self.config.sft, self.parts
        if sft is None or not sft.enabled or sft.max_num_steps == 0:
            return
        if parts.evaluator is None:
            raise ValueError("sft needs data.validation for its early-stop check")
        evaluator = parts.evaluator
        if sft.dev_dataset is not None:
            config = self.config
            dev = build_prompt_dataset(
                sft.dev_dataset, config.data, config.policy.tokenizer, parts.tokenizer
            )
            evaluator = Evaluator(
                parts.model,
                parts.tokenizer,
                dev,
                parts.evaluator.environment,
                max_new_tokens=config.policy.generation.max_new_tokens,
                episodes=parts.episodes,
            )
        self.status.update("warm-start", detail="supervised warm start")
        result = await asyncio.to_thread(
            run_sft,
            parts.model,
            parts.tokenizer,
            parts.train_data,
            sft,
            lambda: evaluator.evaluate_blocking().accuracy,
            self._demonstrations(),
        )
        parts.metrics.log_metrics(
            {
                "sft/steps": result.steps,
                "sft/val_accuracy": result.val_accuracy or 0.0,
                "sft/skipped_nonfinite_grad_steps": result.skipped_nonfinite_grad_steps,
                "timing/sft_s": result.seconds,
            },
            step=0,
        )
        log.info(
            "sft.done",
            steps=result.steps,
            val_accuracy=result.val_accuracy,
            skipped_nonfinite_grad_steps=result.skipped_nonfinite_grad_steps,
        )

    def _demonstrations(self) -> ToolDemonstrations | None:
        """With structured tool use, records that demonstrate tool calls are imitated as the
        episodes they show (the observations rendered as the episodes render them)."""
        tools = self.config.grpo.structured_tool_use
        if not tools.enabled:
            return None
        tokenizer = self.parts.tokenizer
        observations = episode_observations(self.config.policy.tokenizer, tokenizer)
        return ToolDemonstrations(tokenizer, tools.tool_call_format, observations)  # type: ignore[arg-type]  # a transformers tokenizer, typed object here
