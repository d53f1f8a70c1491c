"""Builds of a trained model for other runtimes: GGUF for llama.cpp and ollama
(:mod:`.gguf_build`, internals in :mod:`.gguf`). The Hugging Face directory is written from a
checkpoint by :mod:`dockyard.checkpoints.model_files`."""
