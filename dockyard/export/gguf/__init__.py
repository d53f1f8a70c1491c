"""GGUF export internals: the native gguf-py writer, llama.cpp tools, validation.

The public entry points are in :mod:`dockyard.export.gguf_build`.
"""
