"""A micro-batch's images into its forward pass (vision-language policies).

Each sample's images travel with its row (``TrainingBatch.images``), so whatever rows a plan
puts into a forward pass, that pass gets exactly their images, in row order and, within a row,
in placeholder-run order — the order Qwen2-VL consumes ``pixel_values`` in. The π_old,
reference and loss passes all go through here, so all three see the pixels the engine saw.

Before a pass, every row's placeholder runs are checked against its images' expanded sizes
(:func:`~dockyard.models.vision.check_expanded`): a sample whose ids and images disagree would
otherwise be scored against the wrong image features, or fail deep inside the model.
"""

from __future__ import annotations

import dataclasses

from dockyard.consumers.trainer.batch import TrainingBatch
from dockyard.consumers.trainer.micro_batches import MicroBatch
from dockyard.models.vision import (
    VisionProcessor,
    check_expanded,
    decode_png,
    forward_kwargs,
    pixel_inputs,
)


def with_images(
    micro: MicroBatch, batch: TrainingBatch, processor: VisionProcessor, *, max_pixels: int
) -> MicroBatch:
    """``micro`` with the pixel values, grids and modality map of its rows' images (unchanged
    when none of its rows has an image)."""
    if batch.images is None:
        return micro
    rows = [int(index) for index in micro.indices.tolist()]
    files = [batch.images[index] for index in rows]
    if not any(files):
        return micro
    if micro.position_ids is not None:
        # Packed rows restart 1-D positions per sample; Qwen2-VL's M-RoPE positions are 3-D.
        raise ValueError("a packed micro-batch cannot carry images (policy.sequence_packing)")
    decoded = [[decode_png(data, max_pixels=max_pixels) for data in row] for row in files]
    inputs = pixel_inputs(processor, [image for row in decoded for image in row])
    start = 0
    for position, (index, images) in enumerate(zip(rows, decoded, strict=True)):
        length = int(batch.attention_mask[index].sum())
        grid = inputs.image_grid_thw[start : start + len(images)]
        try:
            check_expanded(processor, micro.input_ids[position, :length].tolist(), grid)
        except ValueError as error:
            raise ValueError(f"sample of group {batch.group_ids[index]!r}: {error}") from None
        start += len(images)
    kwargs = forward_kwargs(processor, micro.input_ids, inputs)
    return dataclasses.replace(micro, vision=kwargs)
