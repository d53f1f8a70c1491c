"""Configuration: YAML with inheritance, Hydra overrides, resolvers, typed validation.

Import from the submodules (``dockyard.config.loader.load_config``); this package keeps its
``__init__`` empty of imports so section models can be imported without the loader.
"""
