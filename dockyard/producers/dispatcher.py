"""The dispatcher (trainer side): dataset → prompt groups on the work queue, paced.

It never generates work the trainer would throw away. The trainer tells it how many groups are
in flight (dispatched, not yet trained or dropped) and it tops the pipeline up to a capacity:

- async GRPO: ``(max_trajectory_age_steps + 1) × num_prompts_per_step`` — every group in flight
  can still be trained within the staleness budget (the admission rule of AReaL);
- sync GRPO: one step's prompts; the trainer tops up only after a step has trained and its
  weights are published, so every group of step N+1 is dispatched after the weights of step N.

The dataset order is a deterministic permutation per epoch, and the position is part of the
trainer checkpoint, so a restarted run dispatches exactly what was not dispatched before —
with the same group ids, which the broker's dedupe window and the trainer's ledger recognise.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from dockyard.algorithms.grpo import MasterConfig
from dockyard.broker.typed import MessagePlane
from dockyard.data.base import Dataset
from dockyard.producers.prompts import make_prompt_group
from dockyard.schemas import PromptGroup
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


@dataclass
class DispatcherState:
    epoch: int = 0
    position: int = 0  # next index into the epoch's order
    dispatched: int = 0  # total groups published by this run
    skipped_too_long: int = 0  # prompts over data.max_input_seq_length, never dispatched
    # How many records the dataset had: the order is a permutation of that many indices, so a
    # position only means the same prompts again over a dataset of the same size. -1 = not
    # recorded (a checkpoint written before this field existed).
    dataset_size: int = -1


def capacity(config: MasterConfig) -> int:
    per_step = config.grpo.num_prompts_per_step
    if config.grpo.async_grpo.enabled:
        return (config.grpo.async_grpo.max_trajectory_age_steps + 1) * per_step
    return per_step


class Dispatcher:
    def __init__(
        self,
        config: MasterConfig,
        messages: MessagePlane,
        dataset: Dataset,
        tokenizer: object,
        *,
        run_id: str,
        state: DispatcherState | None = None,
    ) -> None:
        self.config = config
        self.messages = messages
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.run_id = run_id
        self.state = state or DispatcherState(dataset_size=len(dataset))
        self.capacity = capacity(config)
        self._order = self._epoch_order(self.state.epoch)
        self._skipped_in_a_row = 0

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.config.data.shuffle:
            random.Random(self.config.grpo.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def budget(self, in_flight: int) -> int:
        # Sync: capacity is one step, so the next step's prompts go out only once this step
        # has trained (its weights are published first); groups dropped on the way are
        # replaced, so a step never waits for prompts that were never sent.
        return max(0, self.capacity - in_flight)

    @property
    def exhausted(self) -> bool:
        # A whole epoch of prompts in a row too long to dispatch: none ever will be.
        no_prompt_fits = self._skipped_in_a_row >= len(self.dataset)
        return no_prompt_fits or self.state.epoch >= self.config.grpo.max_num_epochs

    async def top_up(self, in_flight: int, weight_version: int) -> list[str]:
        """Publish up to the budget; returns the group ids dispatched."""
        count = self.budget(in_flight)
        groups: list[PromptGroup] = []
        cap = self.config.data.max_input_seq_length
        while len(groups) < count and not self.exhausted:
            index = self._order[self.state.position]
            group = make_prompt_group(
                self.dataset[index],
                self.tokenizer,
                run_id=self.run_id,
                dataset_name=self.dataset.name,
                epoch=self.state.epoch,
                position=self.state.position,
                num_generations=self.config.grpo.num_generations_per_prompt,
                weight_version=weight_version,
            )
            if cap is not None and len(group.prompt_token_ids) > cap:
                self._skip_too_long(group, cap)
            else:
                self._skipped_in_a_row = 0
                groups.append(group)
            self.state.position += 1
            if self.state.position >= len(self._order):
                self.state.epoch += 1
                self.state.position = 0
                self._order = self._epoch_order(self.state.epoch)
        if groups:
            await self.messages.publish_many(groups)
            self.state.dispatched += len(groups)
        return [group.group_id for group in groups]

    def _skip_too_long(self, group: PromptGroup, cap: int) -> None:
        self.state.skipped_too_long += 1
        self._skipped_in_a_row += 1
        log.warning(
            "dispatcher.prompt_too_long",
            group_id=group.group_id,
            prompt_tokens=len(group.prompt_token_ids),
            max_input_seq_length=cap,
        )
        if self._skipped_in_a_row >= len(self.dataset):
            log.error(
                "dispatcher.no_prompt_fits",
                max_input_seq_length=cap,
                hint="every prompt of the dataset is longer than data.max_input_seq_length",
            )

    def state_dict(self) -> dict[str, int]:
        return asdict(self.state)

    def load_state_dict(self, state: dict[str, int]) -> None:
        restored = DispatcherState(**state)
        size = len(self.dataset)
        if restored.dataset_size not in (-1, size):
            # A file that grew or shrank since the checkpoint: the saved position would point
            # into a different permutation, re-training some prompts and skipping others.
            raise ValueError(
                f"the checkpoint's dispatcher position is into a dataset of "
                f"{restored.dataset_size} records, and {self.dataset.name} now has {size}: "
                "resume with the data the run started with (or start a new run)"
            )
        restored.dataset_size = size
        self.state = restored
        self._order = self._epoch_order(self.state.epoch)
