"""dockyard: asynchronous GRPO post-training over NATS JetStream."""

__version__ = "0.1.0"
