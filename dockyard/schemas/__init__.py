"""Message models and the msgpack+zstd codec: what crosses the broker."""
