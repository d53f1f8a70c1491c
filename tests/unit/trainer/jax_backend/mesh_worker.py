"""Run by test_mesh.py in a fresh interpreter with XLA_FLAGS faking two CPU devices (the flag
must be set before jax is imported). Prints one JSON line: for each mesh layout, the largest
gradient and weight differences against one device, and how the parameters were placed."""

from __future__ import annotations

import copy
import json
import sys

import jax
import numpy as np

from dockyard.consumers.trainer.jax_backend.trainer import JaxPolicyTrainer
from tests.unit.trainer.jax_backend.test_trainer_matches_torch import fixed_batch


def relative_gap(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.abs(a[k] - b[k]).max() / (np.abs(b[k]).max() + 1e-12)) for k in b)


def run(layout: list[str]):
    config, model, batch = fixed_batch(layout)
    trainer = JaxPolicyTrainer(copy.deepcopy(model), config)
    grads = trainer.gradients(batch).grads
    for _ in range(2):
        trainer.step(batch)
    weights = {k: v.numpy().copy() for k, v in trainer.model.state_dict().items()}
    return trainer, grads, weights


def main() -> None:
    assert len(jax.devices()) == 2, jax.devices()
    _, base_grads, base_weights = run([])
    report: dict[str, object] = {}
    for name, layout in {
        "dp2": ["policy.jax_cfg.data_parallel_size=2"],
        "tp2": ["policy.jax_cfg.tensor_parallel_size=2"],
    }.items():
        trainer, grads, weights = run(layout)
        q = trainer.params["model"]["layers"][0]["self_attn"]["q_proj"]["weight"].get_value()
        report[name] = {
            "grad_gap": relative_gap(grads, base_grads),
            "weight_gap": max(float(np.abs(weights[k] - base_weights[k]).max()) for k in weights),
            "mesh": dict(trainer.jax_mesh.shape) if trainer.jax_mesh is not None else None,
            "q_proj_shard_rows": [s.data.shape[0] for s in q.addressable_shards],
        }
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
