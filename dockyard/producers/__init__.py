"""Producers: the dispatcher and the rollout workers."""
