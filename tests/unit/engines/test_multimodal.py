"""Image inputs at the worker boundary, with real image files built with Pillow."""

from __future__ import annotations

import io
import struct
import tracemalloc
import zlib

import pytest
from PIL import Image

from dockyard.config.sections.policy import GenerationConfig
from dockyard.producers.multimodal import (
    ImageInputError,
    MultimodalLimits,
    declared_size,
    gate_sample_images,
    normalize_image,
)

ENABLED = MultimodalLimits(allow_multimodal_inputs=True, max_image_pixels=1_000_000)
EXIF_ORIENTATION = 0x0112
ROTATE_90_CW = 6  # EXIF: the stored image must be rotated 90° clockwise to display


def encode(image: Image.Image, fmt: str, **save_args) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save_args)
    return buffer.getvalue()


def test_exif_orientation_is_applied():
    # Stored 40 wide × 20 high, left half red, right half blue; EXIF says rotate 90° CW.
    stored = Image.new("RGB", (40, 20), (0, 0, 255))
    stored.paste((255, 0, 0), (0, 0, 20, 20))
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = ROTATE_90_CW
    data = encode(stored, "JPEG", exif=exif, quality=95)

    image = normalize_image(data, max_image_pixels=10_000)
    assert image.size == (20, 40)
    assert image.mode == "RGB"
    top, bottom = image.getpixel((10, 5)), image.getpixel((10, 35))
    assert top[0] > 200 and top[2] < 60  # red half is on top after rotating clockwise
    assert bottom[2] > 200 and bottom[0] < 60
    assert EXIF_ORIENTATION not in image.getexif() or image.getexif()[EXIF_ORIENTATION] == 1


def test_transparency_is_flattened_onto_white():
    rgba = Image.new("RGBA", (8, 8), (0, 0, 0, 0))  # fully transparent black
    rgba.putpixel((0, 0), (255, 0, 0, 255))  # one opaque red pixel
    rgba.putpixel((1, 0), (0, 0, 255, 128))  # half-transparent blue
    image = normalize_image(encode(rgba, "PNG"), max_image_pixels=10_000)
    assert image.mode == "RGB"
    assert image.getpixel((5, 5)) == (255, 255, 255)
    assert image.getpixel((0, 0)) == (255, 0, 0)
    red, green, blue = image.getpixel((1, 0))
    assert blue == 255 and 120 <= red <= 135 and 120 <= green <= 135


def test_palette_transparency_is_flattened_too():
    palette = Image.new("P", (4, 4), 0)
    palette.putpalette([0, 255, 0] + [255, 0, 0] * 255)
    palette.putpixel((0, 0), 1)
    data = encode(palette, "PNG", transparency=0)
    image = normalize_image(data, max_image_pixels=10_000)
    assert image.getpixel((3, 3)) == (255, 255, 255)
    assert image.getpixel((0, 0)) == (255, 0, 0)


def test_an_animated_gif_is_pinned_to_its_first_frame():
    frames = [Image.new("RGB", (6, 6), color) for color in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    with Image.open(io.BytesIO(data)) as check:
        assert getattr(check, "n_frames", 1) == 3
    image = normalize_image(data, max_image_pixels=10_000)
    assert image.mode == "RGB"
    assert getattr(image, "n_frames", 1) == 1
    assert image.getpixel((3, 3)) == (255, 0, 0)


def png_declaring(width: int, height: int) -> bytes:
    """A real (small) PNG from Pillow whose IHDR is rewritten to declare a huge size, with
    a valid CRC: the classic decompression-bomb shape."""
    data = bytearray(encode(Image.new("L", (16, 16), 0), "PNG"))
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr : ihdr + 17])) & 0xFFFFFFFF
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


@pytest.mark.parametrize("side", [12_000, 100_000])
def test_a_decompression_bomb_is_refused_from_its_header_without_allocating(side):
    # 144 M pixels (under Pillow's own hard limit, so our check is what refuses it) and
    # 10 G pixels (over it), each declared in ~100 bytes.
    bomb = png_declaring(side, side)
    if side == 12_000:
        assert declared_size(bomb) == (side, side)
    tracemalloc.start()
    try:
        with pytest.raises(ImageInputError) as caught:
            gate_sample_images([bomb], ENABLED, backend="vllm")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.reason == "image_too_large"
    assert "refused before decoding" in str(caught.value)
    assert peak < 2_000_000  # decoding even one row of 10^5 RGB pixels would not fit


def test_max_image_pixels_refuses_a_genuine_large_image_before_decoding():
    # A real 3000×3000 image (9 MP, 27 MB decoded) that compresses to a few KB.
    data = encode(Image.new("RGB", (3000, 3000), (10, 20, 30)), "PNG")
    tracemalloc.start()
    try:
        with pytest.raises(ImageInputError, match="max_image_pixels") as caught:
            normalize_image(data, max_image_pixels=1_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.reason == "image_too_large"
    assert peak < 5_000_000
    # Within the limit the same image decodes.
    assert normalize_image(data, max_image_pixels=9_000_000).size == (3000, 3000)


def test_the_gate_refuses_images_when_multimodal_inputs_are_off():
    data = encode(Image.new("RGB", (4, 4)), "PNG")
    disabled = MultimodalLimits.from_config(GenerationConfig())
    assert disabled.allow_multimodal_inputs is False
    with pytest.raises(ImageInputError, match="allow_multimodal_inputs is false") as caught:
        gate_sample_images([data], disabled, backend="vllm")
    assert caught.value.reason == "multimodal_disabled"
    # The text path is untouched by the flag, whatever the backend.
    for backend in ("torch", "vllm", "sglang"):
        assert gate_sample_images([], disabled, backend=backend) == []
        assert gate_sample_images([], ENABLED, backend=backend) == []


def test_the_gate_enforces_max_images_per_sample(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(encode(Image.new("RGB", (4, 4), (1, 2, 3)), "PNG"))
    limits = MultimodalLimits(allow_multimodal_inputs=True, max_images_per_sample=2)
    images = gate_sample_images([path, str(path)], limits, backend="vllm")
    assert [image.getpixel((0, 0)) for image in images] == [(1, 2, 3)] * 2
    with pytest.raises(ImageInputError, match="max_images_per_sample") as caught:
        gate_sample_images([path] * 3, limits, backend="vllm")
    assert caught.value.reason == "too_many_images"


@pytest.mark.parametrize("backend", ["sglang", "torch"])
def test_backends_that_cannot_forward_images_refuse_them_explicitly(backend):
    data = encode(Image.new("RGB", (4, 4)), "PNG")
    with pytest.raises(ImageInputError, match="does not forward images") as caught:
        gate_sample_images([data], ENABLED, backend=backend)
    assert caught.value.reason == "images_unsupported_by_backend"


def test_unreadable_or_disallowed_data_is_refused():
    with pytest.raises(ImageInputError) as caught:
        normalize_image(b"definitely not an image", max_image_pixels=1_000)
    assert caught.value.reason == "image_undecodable"
    tiff = encode(Image.new("RGB", (4, 4)), "TIFF")
    with pytest.raises(ImageInputError, match="allowed format"):
        normalize_image(tiff, max_image_pixels=1_000)
    truncated = encode(Image.new("RGB", (64, 64), (9, 9, 9)), "PNG")[:60]
    with pytest.raises(ImageInputError) as caught:
        normalize_image(truncated, max_image_pixels=10_000)
    assert caught.value.reason == "image_undecodable"
