"""Datasets: deterministic prompt sources the dispatcher turns into prompt groups."""
