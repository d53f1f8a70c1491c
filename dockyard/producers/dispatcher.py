"""The dispatcher (trainer side): dataset → prompt groups on the work queue, paced.

It never generates work the trainer would throw away. The trainer tells it how many groups are
in flight (dispatched, not yet trained or dropped) and it tops the pipeline up to a capacity:

- async GRPO: ``(max_trajectory_age_steps + 1) × num_prompts_per_step`` — every group in flight
  can still be trained within the staleness budget (the admission rule of AReaL);
- sync GRPO: one step's prompts; the trainer tops up only after a step has trained and its
  weights are published, so every group of step N+1 is dispatched after the weights of step N;
- either way, no more than the experience stream holds (each group stores a raw and a scored
  rollout there): a full stream refuses new messages (``broker/stream_room``), so more in
  flight would only wait at the publishers.

The dataset order is a deterministic permutation per epoch, and the position is part of the
trainer checkpoint, so a restarted run dispatches exactly what was not dispatched before —
with the same group ids, which the broker's dedupe window and the trainer's ledger recognise.

Several training dataloaders (``data.extra_train_dataloaders``, sync GRPO only) are mixed by
round robin: ``data.train`` and each extra loader give one prompt in turn, so while every loader
has epochs left each gives ``1 / (1 + len(extra_train_dataloaders))`` of the prompts. Each walks
its own permutations (:mod:`dockyard.producers.prompt_order`) with its own env and agent name; a
loader that has done ``grpo.max_num_epochs`` leaves the turn, and the data ends when all have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from dockyard.algorithms.grpo import MasterConfig
from dockyard.broker.typed import MessagePlane
from dockyard.data.base import Dataset
from dockyard.producers.prompt_order import LoaderCursor
from dockyard.producers.prompts import make_prompt_group
from dockyard.schemas import PromptGroup
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


@dataclass
class DispatcherState:
    dispatched: int = 0  # total groups published by this run
    skipped_too_long: int = 0  # prompts over data.max_input_seq_length, never dispatched
    next_loader: int = 0  # the loader the round robin asks first next time


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
        extra_datasets: Sequence[Dataset] = (),
    ) -> None:
        """``dataset`` is data.train's; ``extra_datasets`` data.extra_train_dataloaders' in
        order (sync GRPO only: the config refuses them with async GRPO, as the spec says)."""
        self.config = config
        self.messages = messages
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.run_id = run_id
        self.state = DispatcherState()
        self.capacity = capacity(config)
        self._warned_small_stream = False
        self.loaders = [
            LoaderCursor(data, loader=index, seed=config.grpo.seed, shuffle=config.data.shuffle)
            for index, data in enumerate([dataset, *extra_datasets])
        ]

    def budget(self, in_flight: int, room_for: int | None = None) -> int:
        """``room_for``: the groups the experience stream holds (None: no limit)."""
        # Sync: capacity is one step, so the next step's prompts go out only once this step
        # has trained (its weights are published first); groups dropped on the way are
        # replaced, so a step never waits for prompts that were never sent.
        limit = self.capacity if room_for is None else min(self.capacity, room_for)
        return max(0, limit - in_flight)

    async def groups_the_stream_holds(self) -> int | None:
        """How many groups the experience stream holds below its full mark: each in-flight
        group stores a raw and a scored rollout there, sized like the messages it holds now
        (None: no limit; one step while nothing is stored to size them by). Putting more in
        flight would only have the publishers wait for room (``stream_room``)."""
        room = await self.messages.plane.stream_room(self.messages.names.experience_stream.name)
        if room is None or (room.max_bytes <= 0 and room.max_msgs <= 0):
            return None
        per_step = self.config.grpo.num_prompts_per_step
        if not room.messages:
            return per_step  # nothing to size a group by yet: one step until there is
        fits = room.messages_that_fit(room.mean_message_bytes)
        if fits is None:
            return None
        groups = fits // 2
        if groups < per_step and not self._warned_small_stream:
            self._warned_small_stream = True
            log.error(
                "dispatcher.stream_too_small",
                stream=room.stream,
                holds_groups=groups,
                num_prompts_per_step=per_step,
                hint="the experience stream cannot hold one step's groups: raise "
                "data_plane.streams.max_bytes (and max_msgs)",
            )
        return groups

    @property
    def exhausted(self) -> bool:
        # Every loader has done its epochs, or has a whole epoch in a row too long to dispatch.
        max_epochs = self.config.grpo.max_num_epochs
        return all(loader.done(max_epochs) for loader in self.loaders)

    def _next_loader(self) -> LoaderCursor:
        """The round robin: each loader with epochs left gives one prompt in its turn, so
        while all have some, each gives 1 / (number of loaders) of the prompts."""
        max_epochs = self.config.grpo.max_num_epochs
        count = len(self.loaders)
        for step in range(count):
            index = (self.state.next_loader + step) % count
            if not self.loaders[index].done(max_epochs):
                self.state.next_loader = (index + 1) % count
                return self.loaders[index]
        raise AssertionError("asked for a prompt after the last epoch")  # callers check first

    async def top_up(self, in_flight: int, weight_version: int) -> list[str]:
        """Publish up to the budget; returns the group ids dispatched."""
        count = self.budget(in_flight)
        if count:
            count = self.budget(in_flight, await self.groups_the_stream_holds())
        groups: list[PromptGroup] = []
        cap = self.config.data.max_input_seq_length
        while len(groups) < count and not self.exhausted:
            loader = self._next_loader()
            record, epoch, position = loader.take()
            group = make_prompt_group(
                record,
                self.tokenizer,
                run_id=self.run_id,
                dataset_name=loader.dataset.name,
                epoch=epoch,
                position=position,
                num_generations=self.config.grpo.num_generations_per_prompt,
                weight_version=weight_version,
                loader=loader.loader,
            )
            if cap is not None and len(group.prompt_token_ids) > cap:
                self._skip_too_long(group, cap, loader)
            else:
                loader.skipped_in_a_row = 0
                groups.append(group)
        if groups:
            await self.messages.publish_many(groups)
            self.state.dispatched += len(groups)
        return [group.group_id for group in groups]

    def _skip_too_long(self, group: PromptGroup, cap: int, loader: LoaderCursor) -> None:
        self.state.skipped_too_long += 1
        loader.skipped_in_a_row += 1
        log.warning(
            "dispatcher.prompt_too_long",
            group_id=group.group_id,
            prompt_tokens=len(group.prompt_token_ids),
            max_input_seq_length=cap,
        )
        if loader.no_prompt_fits:
            log.error(
                "dispatcher.no_prompt_fits",
                dataset=loader.dataset.name,
                max_input_seq_length=cap,
                hint="every prompt of the dataset is longer than data.max_input_seq_length",
            )

    def state_dict(self) -> dict[str, int]:
        """Flat, as the checkpoint stores it: data.train's position under the keys it always
        had, each extra loader's under ``extra<i>.<key>``."""
        state = {**asdict(self.state), **self.loaders[0].state_dict()}
        state["loaders"] = len(self.loaders)
        for loader in self.loaders[1:]:
            for key, value in loader.state_dict().items():
                state[f"extra{loader.loader - 1}.{key}"] = value
        return state

    def load_state_dict(self, state: dict[str, int]) -> None:
        saved = dict(state)
        loaders = saved.pop("loaders", 1)  # checkpoints before several loaders: one
        if loaders != len(self.loaders):
            raise ValueError(
                f"the checkpoint dispatched from {loaders} training dataloader(s) and the "
                f"config has {len(self.loaders)} (data.train + data.extra_train_dataloaders): "
                "resume with the data the run started with (or start a new run)"
            )
        for loader in self.loaders[1:]:
            prefix = f"extra{loader.loader - 1}."
            own = {
                key[len(prefix) :]: saved.pop(key) for key in list(saved) if key.startswith(prefix)
            }
            loader.load_state_dict(own, f"data.extra_train_dataloaders.{loader.loader - 1}")
        own_keys: tuple[str, ...] = ("epoch", "position", "dataset_size")
        main = {key: saved.pop(key) for key in own_keys if key in saved}
        self.loaders[0].load_state_dict(main, "data.train")
        self.state = DispatcherState(**saved)
