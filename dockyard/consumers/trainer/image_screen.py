"""Groups whose images disagree with their token ids, dead-lettered before a step.

Every forward pass checks its rows' placeholder runs against their images
(:mod:`.vision_batches`), but a mismatch found there would stop the step. A worker's bug (or a
tampered message) must cost its own group only: before a step, each new group's samples are
checked the same way, and a group that fails goes to the dead letters with
``image_placeholder_mismatch`` and the reason, and is dropped from the ledger.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dockyard.broker.plane import DataPlane
from dockyard.consumers.trainer.ledger import Ledger
from dockyard.consumers.trainer.pending_screen import PendingScreen
from dockyard.models.vision import (
    VisionProcessor,
    check_expanded,
    decode_png,
    pixel_inputs,
    placeholder_runs,
)
from dockyard.schemas import ScoredRollout

REASON = "image_placeholder_mismatch"


def image_mismatch(
    scored: ScoredRollout, processor: VisionProcessor, *, max_pixels: int
) -> str | None:
    """Why the group's first bad sample cannot be trained with its images; None when every
    sample's placeholder runs match its images' expanded sizes."""
    samples = scored.rollout.samples
    offsets = samples.response_offsets()
    for index, prompt in enumerate(samples.prompts()):
        response = samples.response_token_ids[offsets[index] : offsets[index + 1]]
        ids = np.concatenate([prompt, response]).tolist()
        files = samples.sample_images(index)
        try:
            images = [decode_png(data, max_pixels=max_pixels) for data in files]
            if images:
                check_expanded(processor, ids, pixel_inputs(processor, images).image_grid_thw)
            elif runs := placeholder_runs(ids, processor.image_token_id):
                raise ValueError(f"{len(runs)} image placeholder run(s) but no image")
        except ValueError as error:
            return f"sample {index}: {error}"
    return None


class ImageScreen(PendingScreen):
    """Before a step: the pending groups not checked yet, checked; the bad ones dead-lettered."""

    event = "trainer.dropped_image_mismatch"

    def __init__(
        self,
        processor: VisionProcessor,
        max_pixels: int,
        plane: DataPlane,
        ledger: Callable[[], Ledger],
    ) -> None:
        super().__init__(plane, ledger)
        self.processor = processor
        self.max_pixels = max_pixels

    async def refusals(self, fresh: list[ScoredRollout]) -> dict[str, tuple[str, str]]:
        refused = {}
        for scored in fresh:
            why = image_mismatch(scored, self.processor, max_pixels=self.max_pixels)
            if why is not None:
                refused[scored.group_id] = (REASON, why)
        return refused
