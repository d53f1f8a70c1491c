"""Reward environments (pure functions of a rollout group, no transport)."""
