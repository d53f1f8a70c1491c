"""Cross-cutting utilities: logging, metrics loggers, checkpoints, export."""
