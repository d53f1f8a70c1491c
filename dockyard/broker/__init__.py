"""The data plane: JetStream and in-memory implementations of one interface."""
