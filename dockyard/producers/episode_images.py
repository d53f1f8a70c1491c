"""The images of an episode: its prompt's, then each screenshot its observations show.

An episode's token sequence holds every image as its *expanded* placeholder run (one image
token per merged patch: exactly the ids the model attends to), and its images in the order of
those runs. Images from the environment (a desktop's screenshot) pass the same gate as a
prompt's (:func:`~dockyard.producers.multimodal.gate_sample_images`: the multimodal switch,
the backend, ``max_image_pixels`` read from the header, ``max_images_per_sample`` counting the
images the episode already shows), so a desktop cannot show the model what a dataset may not.

Rendered text (a chat template's) holds each image as a single placeholder; :meth:`expand`
turns those into the runs the processor writes (``dockyard.models.vision``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dockyard.models.vision import expand_placeholders, placeholder_runs
from dockyard.producers.multimodal import ImageInputError, MultimodalLimits, gate_sample_images

if TYPE_CHECKING:
    from PIL import Image

    from dockyard.models.vision import VisionProcessor


class ImagePlaceholderError(ValueError):
    """A rendered sequence's image placeholders do not pair up with its images."""


@dataclass(frozen=True)
class EpisodeImages:
    """The run's image settings, for every episode of a rollout worker."""

    limits: MultimodalLimits
    backend: str
    #: The engine's own answer (``GenerationEngine.accepts_images``).
    accepts_images: bool
    #: None: the model has no image processor (a text model); any image is then refused.
    processor: VisionProcessor | None = None

    def admit(self, images: Sequence[bytes], shown: int) -> list[Image.Image]:
        """The normalised images; ImageInputError (its ``reason``) for what the gate refuses."""
        admitted = gate_sample_images(
            images,
            self.limits,
            backend=self.backend,
            accepts_images=self.accepts_images,
            shown=shown,
        )
        if admitted and self.processor is None:
            raise ImageInputError(
                "images_unsupported_by_backend",
                f"{len(admitted)} image(s) to show, but the policy has no image processor "
                "(not a vision-language model)",
            )
        return admitted

    def expand(self, token_ids: Sequence[int], images: Sequence[Image.Image]) -> list[int]:
        if not images:
            return list(token_ids)
        assert self.processor is not None  # admit() refused images without a processor
        try:
            return expand_placeholders(self.processor, token_ids, images)
        except ValueError as error:
            raise ImagePlaceholderError(str(error)) from None

    def complete_images(self, token_ids: Sequence[int], kept: int) -> tuple[int, int]:
        """``(tokens, images)`` of the first ``kept`` tokens that hold only whole image runs:
        a cut inside a run moves back to the run's start (half an image is no image)."""
        if self.processor is None:
            return kept, 0
        whole = 0
        for start, length in placeholder_runs(token_ids, self.processor.image_token_id):
            if start + length > kept:
                return min(kept, start), whole
            whole += 1
        return kept, whole
