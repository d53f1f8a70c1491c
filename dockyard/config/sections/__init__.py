"""Typed config sections. :class:`dockyard.algorithms.grpo.MasterConfig` assembles them."""
