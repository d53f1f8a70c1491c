"""Consumers: scorers, teachers and the trainer."""
