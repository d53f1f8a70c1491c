"""Image inputs at the rollout-worker boundary: the gate, the limits, and normalisation.

Images reach an engine only when ``policy.generation.allow_multimodal_inputs`` is true. Every
image is then normalised so the engine sees one canonical form (GHSA-8jr5-v98p-w75m): EXIF
orientation applied, transparency flattened onto white, RGB, and multi-frame inputs pinned to
their first frame. ``max_image_pixels`` is checked against the size the file *declares* in its
header, before a single pixel is decoded, so a decompression bomb is refused without
allocating; ``max_images_per_sample`` bounds how many images one sample may carry.

Each refusal is an :class:`ImageInputError` with a stable ``reason`` code for dead-lettering.
Samples without images pass through untouched whatever the flag says.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from PIL import Image, ImageOps, UnidentifiedImageError

from dockyard.config.sections.policy import GenerationConfig

ImageRefusal = Literal[
    "multimodal_disabled",
    "too_many_images",
    "image_too_large",
    "image_undecodable",
    "images_unsupported_by_backend",
]

# Formats a policy may be shown; anything else is refused before a decoder plug-in runs.
ALLOWED_FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")
# Backends that forward images to the model; the others refuse them explicitly.
IMAGE_BACKENDS = frozenset({"vllm"})
_FLATTEN_BACKGROUND = (255, 255, 255)

ImageInput = bytes | str | Path


class ImageInputError(ValueError):
    """A sample's images were refused; ``reason`` is a stable code for the dead-letter."""

    def __init__(self, reason: ImageRefusal, message: str) -> None:
        super().__init__(message)
        self.reason: ImageRefusal = reason


@dataclass(frozen=True)
class MultimodalLimits:
    allow_multimodal_inputs: bool = False
    max_image_pixels: int = 89_478_485
    max_images_per_sample: int = 8

    @classmethod
    def from_config(cls, generation: GenerationConfig) -> MultimodalLimits:
        return cls(
            allow_multimodal_inputs=generation.allow_multimodal_inputs,
            max_image_pixels=generation.max_image_pixels,
            max_images_per_sample=generation.max_images_per_sample,
        )


def _read_bytes(image: ImageInput) -> bytes:
    if isinstance(image, bytes):
        return image
    return Path(image).read_bytes()


def declared_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` from the image header; no pixel data is decoded."""
    with _open(data, max_pixels=None) as image:
        return image.size


def _open(data: bytes, *, max_pixels: int | None) -> Image.Image:
    # PIL's own bomb check (a warning above Image.MAX_IMAGE_PIXELS, an error above twice
    # that) is process-global; ours is per-config and explicit, so silence PIL's and turn its
    # hard error into our refusal.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=list(ALLOWED_FORMATS))
    except Image.DecompressionBombError as error:
        raise ImageInputError(
            "image_too_large", f"image refused before decoding: {error}"
        ) from None
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise ImageInputError(
            "image_undecodable",
            f"not a readable image in an allowed format ({', '.join(ALLOWED_FORMATS)}): {error}",
        ) from None
    if max_pixels is not None:
        width, height = image.size
        if width * height > max_pixels:
            image.close()
            raise ImageInputError(
                "image_too_large",
                f"image declares {width}x{height} = {width * height:,} pixels, over "
                f"policy.generation.max_image_pixels ({max_pixels:,}); refused before decoding",
            )
    return image


def _flatten_to_rgb(image: Image.Image) -> Image.Image:
    has_alpha = image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (
        image.mode == "P" and "transparency" in image.info
    )
    if not has_alpha:
        return image.convert("RGB")
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (*_FLATTEN_BACKGROUND, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def normalize_image(image: ImageInput, *, max_image_pixels: int) -> Image.Image:
    """One canonical RGB image: size checked from the header first, then the first frame only
    decoded, EXIF orientation applied and transparency flattened onto white."""
    data = _read_bytes(image)
    with _open(data, max_pixels=max_image_pixels) as opened:
        opened.seek(0)  # multi-frame (GIF, APNG, WebP): the first frame, and only that one
        try:
            opened.load()
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            raise ImageInputError("image_undecodable", f"image data is corrupt: {error}") from None
        oriented = ImageOps.exif_transpose(opened)
        return _flatten_to_rgb(oriented)


def gate_sample_images(
    images: Sequence[ImageInput],
    limits: MultimodalLimits,
    *,
    backend: str,
    accepts_images: bool | None = None,
    shown: int = 0,
) -> list[Image.Image]:
    """The worker-boundary check for one sample: refused unless multimodal inputs are allowed
    and the engine forwards images; limits enforced; every image normalised. ``shown``: the
    images the sample already carries (an episode's, before a new screenshot), which count
    towards ``max_images_per_sample`` too.

    ``accepts_images``: the engine's own answer (the torch engine forwards images for a
    vision-language policy only); None: decided by ``backend`` (:data:`IMAGE_BACKENDS`).
    A sample without images returns ``[]`` whatever the settings are.
    """
    if not images:
        return []
    if not limits.allow_multimodal_inputs:
        raise ImageInputError(
            "multimodal_disabled",
            f"sample carries {len(images)} image(s) but "
            "policy.generation.allow_multimodal_inputs is false",
        )
    if not (backend in IMAGE_BACKENDS if accepts_images is None else accepts_images):
        raise ImageInputError(
            "images_unsupported_by_backend",
            f"the {backend} backend does not forward images yet; the sample's "
            f"{len(images)} image(s) are refused rather than dropped",
        )
    if shown + len(images) > limits.max_images_per_sample:
        raise ImageInputError(
            "too_many_images",
            f"sample carries {shown + len(images)} images, over "
            f"policy.generation.max_images_per_sample ({limits.max_images_per_sample})",
        )
    return [normalize_image(image, max_image_pixels=limits.max_image_pixels) for image in images]
