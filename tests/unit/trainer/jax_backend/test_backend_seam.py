"""The trainer loop's backend seam: ``policy.jax_cfg.enabled`` picks the JAX trainer, the torch
path never imports JAX, and what the JAX backend cannot do is refused or warned at launch."""

from __future__ import annotations

import subprocess
import sys

from dockyard.config.capabilities import ignored, not_implemented
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.backend import build_policy_trainer
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.models import load_policy

JAX_ON = ["policy.dtensor_cfg.enabled=false", "policy.jax_cfg.enabled=true"]


def test_the_torch_trainer_path_never_imports_jax():
    # A fresh interpreter: this test process may have imported jax already.
    code = (
        "import sys\n"
        "from dockyard.config.loader import load_config\n"
        "from dockyard.consumers.trainer.loop import TrainerLoop\n"
        "from dockyard.consumers.trainer.backend import build_policy_trainer\n"
        "from dockyard.models import load_policy\n"
        "config = load_config('configs/quickstart.yaml')\n"
        "model, _ = load_policy(config.policy.model_name)\n"
        "trainer = build_policy_trainer(model, config)\n"
        "assert type(trainer).__name__ == 'PolicyTrainer', type(trainer)\n"
        "assert not [m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'flax'))]\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_jax_cfg_enabled_builds_the_jax_trainer_on_the_same_torch_model():
    from dockyard.consumers.trainer.jax_backend.trainer import JaxPolicyTrainer

    config = load_config("configs/quickstart.yaml", JAX_ON)
    model, _ = load_policy(config.policy.model_name)
    trainer = build_policy_trainer(model, config)
    assert isinstance(trainer, JaxPolicyTrainer) and not isinstance(trainer, PolicyTrainer)
    assert trainer.model is model  # the mirror the loop publishes, validates and saves


def test_the_quickstart_with_jax_launches_and_float16_or_packing_do_not_pass_silently():
    assert not_implemented(load_config("configs/quickstart.yaml", JAX_ON)) == []
    half = load_config("configs/quickstart.yaml", [*JAX_ON, "policy.precision=float16"])
    assert [issue.path for issue in not_implemented(half)] == ["policy.precision"]
    # The torch trainer does float16 (with loss scaling): refused only under JAX.
    assert (
        not_implemented(load_config("configs/quickstart.yaml", ["policy.precision=float16"])) == []
    )
    packed = load_config(
        "configs/quickstart.yaml", [*JAX_ON, "policy.sequence_packing.enabled=true"]
    )
    assert [issue.path for issue in ignored(packed)] == ["policy.sequence_packing.enabled"]


def test_a_mesh_larger_than_the_devices_is_refused_at_launch(capsys, tmp_path):
    """Two data-parallel devices where JAX sees one (this test process's CPU): `dockyard run`
    refuses with the key path before it starts anything (no run directory is written)."""
    from dockyard.cli import main

    run_dir = tmp_path / "run"
    argv = [
        "run",
        "--config",
        "configs/quickstart.yaml",
        *JAX_ON,
        "policy.jax_cfg.data_parallel_size=2",
        "--run-dir",
        str(run_dir),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "policy.jax_cfg.data_parallel_size: " in err
    assert "= 2 devices, but JAX sees 1" in err
    assert not run_dir.exists()
