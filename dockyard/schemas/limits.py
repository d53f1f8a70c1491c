"""Resource limits a decoder enforces before it allocates (invariants 4 and 5 of the design)."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Bounds on one decoded message. Every limit is checked before the memory is allocated.

    The defaults fit the largest messages the benchmarks use (a group of 64 samples × 8,192
    response tokens is ≈5 MB uncompressed) with a wide margin; a consumer that knows its
    traffic can tighten them. The metadata's strings, bins and lists are bounded by the
    decompressed size: msgspec builds at most one Python object per msgpack value.
    """

    #: The zstd frame as received (after any chunk reassembly by the broker).
    max_compressed_bytes: int = 64 * MiB
    #: The frame's content: checked against the size the frame declares, before decompressing.
    max_decompressed_bytes: int = 256 * MiB
    #: Elements of any one array (token ids, log-probs, ...).
    max_array_elements: int = 32 * MiB
    #: Token ids must be ``< vocab_size`` when set (the consumer's tokenizer size).
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "max_compressed_bytes",
            "max_decompressed_bytes",
            "max_array_elements",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"DecodeLimits.{name} must be positive")
        if self.vocab_size is not None and self.vocab_size <= 0:
            raise ValueError("DecodeLimits.vocab_size must be positive or None")


DEFAULT_LIMITS = DecodeLimits()
