"""Subcommands of ``dockyard``; each module defines ``register(registrar)``.

See :mod:`dockyard.cli` for how they are discovered.
"""
