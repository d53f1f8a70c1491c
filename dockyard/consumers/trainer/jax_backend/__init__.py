"""The JAX (Flax NNX) trainer backend, ``policy.jax_cfg``: see docs/trainer.md."""
