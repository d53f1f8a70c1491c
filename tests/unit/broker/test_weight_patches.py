"""Sparse weight patches: bit-identical reconstruction, and refusal of every wrong patch."""

from __future__ import annotations

import hashlib

import msgpack
import pytest
import torch
import zstandard

from dockyard.broker.weight_blobs.patch import (
    ChainLink,
    PatchError,
    PatchHeader,
    apply_patch,
    encode_patch,
    state_digest,
)

SNAPSHOT = ChainLink(0, "sha256:" + "a" * 64, 123)


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bytes differ (NaN == NaN here when the bits agree, unlike float ==)."""
    width = a.element_size()
    rows_a = a.contiguous().reshape(-1).view(torch.uint8).reshape(-1, width)
    rows_b = b.contiguous().reshape(-1).view(torch.uint8).reshape(-1, width)
    return int((rows_a != rows_b).any(dim=1).sum())


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(300, 64, generator=generator).to(torch.bfloat16),
        "norm.weight": torch.ones(64, dtype=torch.bfloat16),
        "head.bias": torch.randn(17, generator=generator),  # float32
        "scale": torch.tensor(0.5, dtype=torch.float16),  # 0-dim
    }


def _next_version(base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A realistic small update (a few elements per tensor cross a rounding boundary) plus the
    values a float delta could not carry exactly: NaN with a payload, −0.0, ±inf."""
    new = {name: t.clone() for name, t in base.items()}
    embed = new["embed.weight"].view(-1)
    embed[::97] = (embed[::97].float() * 1.02).to(torch.bfloat16)
    embed[5] = float("-inf")
    embed[6] = -0.0
    new["norm.weight"][3] = float("nan")
    new["head.bias"].view(torch.int32)[2] = 0x7FC00123  # a NaN with a payload
    new["head.bias"][4] = float("inf")
    return new


def _patch(base, new, version=1, base_version=0, **header):
    fields = {
        "version": version,
        "base_version": base_version,
        "base_digest": state_digest(base),
        "result_digest": state_digest(new),
        "snapshot": SNAPSHOT,
        **header,
    }
    return encode_patch(base, new, PatchHeader(**fields))


def test_applying_a_patch_reproduces_the_new_weights_bit_for_bit() -> None:
    base = _weights()
    new = _next_version(base)
    blob, stats = _patch(base, new)
    rebuilt = apply_patch(base, blob, base_version=0, base_digest=state_digest(base))
    assert set(rebuilt) == set(new)
    for name in new:
        assert rebuilt[name].dtype == new[name].dtype and rebuilt[name].shape == new[name].shape
        assert _bits(rebuilt[name]) == _bits(new[name]), name
    # Only what changed travels: the elements whose bit patterns differ.
    expected_changed = sum(_differing(base[n], new[n]) for n in new)
    assert stats.changed == expected_changed
    assert stats.total == sum(t.numel() for t in base.values())
    # The base is left as it was (a refused patch must not have touched it either).
    assert _bits(base["embed.weight"]) == _bits(_weights()["embed.weight"])


def test_a_patch_with_no_change_applies_to_the_same_weights() -> None:
    base = _weights()
    blob, stats = _patch(base, {k: v.clone() for k, v in base.items()})
    assert stats.changed == 0
    rebuilt = apply_patch(base, blob, base_version=0, base_digest=state_digest(base))
    assert state_digest(rebuilt) == state_digest(base)


def test_a_result_whose_digest_does_not_match_is_refused() -> None:
    base = _weights()
    new = _next_version(base)
    wrong = _next_version(base)
    wrong["embed.weight"].view(-1)[7] = 1.0  # the patch's result differs from what it claims
    blob, _ = _patch(base, wrong, result_digest=state_digest(new))
    with pytest.raises(PatchError, match=r"hash to .* refusing"):
        apply_patch(base, blob, base_version=0, base_digest=state_digest(base))


def test_an_out_of_order_patch_is_refused_with_the_versions_it_needs() -> None:
    v0 = _weights()
    v1 = _next_version(v0)
    v2 = _next_version(v1)
    patch_2, _ = _patch(v1, v2, version=2, base_version=1)
    with pytest.raises(PatchError, match=r"v2 applies to v1.*held are v0.*out of order"):
        apply_patch(v0, patch_2, base_version=0, base_digest=state_digest(v0))


def test_a_patch_for_other_weights_under_the_same_version_is_refused() -> None:
    base, other = _weights(0), _weights(1)
    blob, _ = _patch(base, _next_version(base))
    with pytest.raises(PatchError, match="another chain"):
        apply_patch(other, blob, base_version=0, base_digest=state_digest(other))


def _tamper(blob: bytes, change) -> bytes:
    body = msgpack.unpackb(blob, raw=False)
    change(body)
    return msgpack.packb(body, use_bin_type=True)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda b: b["tensors"][0].update(count=b["tensors"][0]["count"] + 1), "bytes"),
        (lambda b: b["tensors"][0].update(index_gaps=b"\x28\xb5\x2f\xfd junk"), "zstd"),
        (lambda b: b["tensors"][0].update(name="nope"), "unknown or repeated tensor"),
        (lambda b: b["tensors"].append(b["tensors"][0]), "unknown or repeated tensor"),
        (lambda b: b.update(format="something-else"), "patch format"),
        (lambda b: b.pop("result_digest"), "keys"),
        # docs/wire-format.md, "Weight patches": every key is required, `format` and
        # `format_version` have one value each, no other key, tensors in name order.
        (lambda b: b.pop("format"), "keys"),
        (lambda b: b.pop("format_version"), "keys"),
        (lambda b: b.update(format_version=2), "patch format"),
        (lambda b: b.update(added_later=1), "keys"),
        (lambda b: b["tensors"][0].update(added_later=1), "malformed tensor entry"),
        (lambda b: b["tensors"].reverse(), "name order"),
    ],
)
def test_a_corrupt_patch_is_refused_with_its_reason(change, reason: str) -> None:
    base = _weights()
    blob, _ = _patch(base, _next_version(base))
    with pytest.raises(PatchError, match=reason):
        apply_patch(base, _tamper(blob, change), base_version=0, base_digest=state_digest(base))


def _content(frame: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompress(frame)


def _raw_frame(content: bytes, declared: int | None) -> bytes:
    """``content`` in one zstd frame written from RFC 8878 §3.1.1: magic, a descriptor with an
    8-byte Frame_Content_Size field holding ``declared`` and Single_Segment_flag (0xE0), or,
    with ``declared`` None, none of them and a 128 KiB window (0x00, then 7 << 3); then the
    content as one raw block marked last; no checksum."""
    if declared is None:
        header = bytes([0x00, 7 << 3])
    else:
        header = bytes([0xE0]) + declared.to_bytes(8, "little")
    block = ((len(content) << 3) | 1).to_bytes(3, "little")
    return b"\x28\xb5\x2f\xfd" + header + block + content


def _patched_array(base, key: str, frame_of) -> bytes:
    blob, _ = _patch(base, _next_version(base))

    def change(body):
        entry = body["tensors"][0]
        entry[key] = frame_of(_content(entry[key]))

    return _tamper(blob, change)


@pytest.mark.parametrize("key", ["index_gaps", "value_deltas"])
def test_a_patch_array_in_any_frame_that_declares_its_size_applies(key: str) -> None:
    base = _weights()
    blob = _patched_array(base, key, lambda content: _raw_frame(content, len(content)))
    rebuilt = apply_patch(base, blob, base_version=0, base_digest=state_digest(base))
    assert state_digest(rebuilt) == state_digest(_next_version(base))


@pytest.mark.parametrize("key", ["index_gaps", "value_deltas"])
@pytest.mark.parametrize(
    "declared",
    [lambda n: None, lambda n: n + 4, lambda n: n - 4, lambda n: 2**64 - 1],
    ids=["no size", "4 bytes more", "4 bytes fewer", "2**64-1"],
)
def test_a_patch_array_must_declare_exactly_its_size(key: str, declared) -> None:
    # docs/wire-format.md, "Weight patches": each array is one zstd frame that declares its
    # content size (count × 4, count × width); a reader refuses a frame that declares anything
    # else (or nothing) before decompressing it.
    base = _weights()
    blob = _patched_array(base, key, lambda content: _raw_frame(content, declared(len(content))))
    with pytest.raises(PatchError, match="declares"):
        apply_patch(base, blob, base_version=0, base_digest=state_digest(base))


def test_garbage_is_not_a_patch() -> None:
    base = _weights()
    with pytest.raises(PatchError, match="not a weight patch"):
        apply_patch(base, b"\xc1garbage", base_version=0, base_digest=state_digest(base))


def test_a_layout_change_cannot_be_a_patch() -> None:
    base = _weights()
    grown = {**base, "extra": torch.zeros(3)}
    with pytest.raises(PatchError, match="names differ"):
        _patch(base, grown)
    reshaped = {**base, "head.bias": torch.zeros(18)}
    with pytest.raises(PatchError, match=r"head\.bias"):
        _patch(base, reshaped)


def test_the_state_digest_is_the_documented_hash() -> None:
    # docs/wire-format.md: per tensor in name order, a length-prefixed "name\0dtype\0shape"
    # then the length-prefixed raw little-endian bytes.
    state = {"b": torch.tensor([1.0, 2.0]), "a": torch.tensor([3], dtype=torch.int64)}
    hasher = hashlib.sha256()
    for meta, raw in (
        (b"a\0int64\0(1,)", (3).to_bytes(8, "little")),
        (b"b\0float32\0(2,)", _bits(torch.tensor([1.0, 2.0]))),
    ):
        for part in (meta, raw):
            hasher.update(len(part).to_bytes(8, "little") + part)
    assert state_digest(state) == "sha256:" + hasher.hexdigest()
    # The layout is part of the digest: the same bytes under another shape hash differently.
    assert state_digest({**state, "b": state["b"].reshape(2, 1)}) != state_digest(state)
