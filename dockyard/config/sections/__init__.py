"""Typed config sections. :class:`dockyard.config.master.MasterConfig` assembles them."""
