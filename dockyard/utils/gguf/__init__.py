"""GGUF export internals: the native gguf-py writer, llama.cpp tools, validation.

The public entry points are in :mod:`dockyard.utils.gguf_export`.
"""
