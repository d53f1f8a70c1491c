"""``policy.jax_cfg.data_parallel_size`` / ``tensor_parallel_size`` shard the step over a
``jax.sharding`` mesh and compute the one-device step.

The CPU stands in for accelerators: XLA is told to expose two host devices
(``--xla_force_host_platform_device_count=2``, set before jax is imported, hence a fresh
interpreter), which run the same SPMD programs and collectives a two-GPU mesh would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dockyard.config.sections.policy import JaxConfig
from dockyard.consumers.trainer.jax_backend.mesh import build_mesh, parameter_spec

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def two_device_report():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "tests.unit.trainer.jax_backend.mesh_worker"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["dp2", "tp2"])
def test_a_sharded_step_equals_the_one_device_step(two_device_report, layout):
    report = two_device_report[layout]
    assert report["mesh"] == (
        {"data": 2, "model": 1} if layout == "dp2" else {"data": 1, "model": 2}
    )
    # Sharded reductions sum in another order: float32 rounding, no more.
    assert report["grad_gap"] < 1e-4
    # 2 AdamW steps of lr 3e-3 move each coordinate by ≈6e-3; float32 differences in the
    # gradients change that by a small fraction of lr (the bound the torch comparison uses).
    assert report["weight_gap"] < 1e-2 * 3e-3
    # q_proj [128, 128]: split by rows across "model" under tensor parallelism, whole otherwise.
    expected_rows = [64, 64] if layout == "tp2" else [128, 128]
    assert report["q_proj_shard_rows"] == expected_rows


def test_more_devices_than_there_are_is_refused_with_the_key_path():
    with pytest.raises(ValueError, match=r"policy\.jax_cfg: .* = 4 devices, but JAX sees 1"):
        build_mesh(JaxConfig(enabled=True, data_parallel_size=2, tensor_parallel_size=2))


def test_a_tensor_parallel_size_that_does_not_divide_a_dimension_is_refused():
    spec = parameter_spec("model.layers.0.mlp.down_proj.weight", (128, 512), 2)
    assert tuple(spec) == (None, "model")
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 does not divide dimension 0"):
        parameter_spec("model.layers.0.self_attn.q_proj.weight", (128, 128), 3)
