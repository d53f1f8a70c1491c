"""One training dataloader's order: a seeded permutation per epoch, and where it stands.

The dispatcher keeps one :class:`LoaderCursor` for ``data.train`` and one for each of
``data.extra_train_dataloaders``. A cursor's position is part of the trainer checkpoint (its
:meth:`LoaderCursor.state_dict`), so a resumed run continues every loader where it stopped —
over data of the same size: a file that grew or shrank would put the saved position into a
different permutation, so that is refused.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dockyard.data.base import Dataset, PromptRecord


@dataclass
class LoaderPosition:
    epoch: int = 0
    position: int = 0  # next index into the epoch's order
    # How many records the dataset had: a position only means the same prompts again over a
    # dataset of the same size. -1 = not recorded (a checkpoint written before this field).
    dataset_size: int = -1


class LoaderCursor:
    def __init__(self, dataset: Dataset, *, loader: int, seed: int, shuffle: bool) -> None:
        """``loader``: 0 for ``data.train``, ``i + 1`` for ``data.extra_train_dataloaders[i]``
        (each loader walks its own permutations)."""
        self.dataset = dataset
        self.loader = loader
        self.seed = seed
        self.shuffle = shuffle
        self.at = LoaderPosition(dataset_size=len(dataset))
        self.order = self._epoch_order(0)
        #: Prompts in a row too long to dispatch; a whole epoch of them means none ever will.
        self.skipped_in_a_row = 0

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            # data.train keeps the seed its runs have always used; an extra loader seeds from
            # its own index too, so two loaders over equal data do not walk in lock-step.
            seed: int | str = self.seed * 1_000_003 + epoch
            if self.loader:
                seed = f"{self.seed}/{self.loader}/{epoch}"
            random.Random(seed).shuffle(order)
        return order

    @property
    def no_prompt_fits(self) -> bool:
        return self.skipped_in_a_row >= len(self.dataset)

    def done(self, max_epochs: int) -> bool:
        return self.no_prompt_fits or self.at.epoch >= max_epochs

    def take(self) -> tuple[PromptRecord, int, int]:
        """The next record with its epoch and position; the cursor moves past it."""
        epoch, position = self.at.epoch, self.at.position
        record = self.dataset[self.order[position]]
        self.at.position += 1
        if self.at.position >= len(self.order):
            self.at.epoch += 1
            self.at.position = 0
            self.order = self._epoch_order(self.at.epoch)
        return record, epoch, position

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.at.epoch,
            "position": self.at.position,
            "dataset_size": self.at.dataset_size,
        }

    def load_state_dict(self, state: dict[str, int], where: str) -> None:
        """``where``: the config key of this loader, for the refusal."""
        restored = LoaderPosition(**state)
        size = len(self.dataset)
        if restored.dataset_size not in (-1, size):
            raise ValueError(
                f"the checkpoint's dispatcher position ({where}) is into a dataset of "
                f"{restored.dataset_size} records, and {self.dataset.name} now has {size}: "
                "resume with the data the run started with (or start a new run)"
            )
        restored.dataset_size = size
        self.at = restored
        self.order = self._epoch_order(restored.epoch)
