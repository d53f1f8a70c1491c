"""How many trainer ranks a run has: ``cluster`` against the machine and torchrun's world, and
what ``dockyard run`` / ``dockyard trainer`` refuse (exit 2, the key named) before starting."""

from __future__ import annotations

import sys

import pytest
import torch

from dockyard.cli import main
from dockyard.config.loader import load_config
from dockyard.config.sections.cluster import ClusterConfig
from dockyard.fleet.supervisor import Supervisor
from dockyard.fleet.trainer_ranks import (
    LaunchRefused,
    check_ranks_can_run,
    check_torchrun_world,
    ranks_for_run,
)

QUICKSTART = "configs/quickstart.yaml"


def test_gpus_per_node_starts_one_rank_per_gpu():
    assert ranks_for_run(ClusterConfig(gpus_per_node=4), requested=None, cuda_devices=8) == 4


def test_without_gpus_the_ranks_are_asked_for_on_the_command_line():
    assert ranks_for_run(ClusterConfig(), requested=None, cuda_devices=0) == 1
    assert ranks_for_run(ClusterConfig(), requested=3, cuda_devices=0) == 3


@pytest.mark.parametrize(
    ("cluster", "requested", "cuda_devices", "key", "reason"),
    [
        (ClusterConfig(gpus_per_node=2), None, 0, "cluster.gpus_per_node", "sees no CUDA GPU"),
        (ClusterConfig(gpus_per_node=4), None, 2, "cluster.gpus_per_node", "torch sees 2"),
        (ClusterConfig(gpus_per_node=2), 3, 2, "--trainer-ranks", "contradicts"),
        (ClusterConfig(num_nodes=2, gpus_per_node=2), None, 2, "cluster.num_nodes", "one machine"),
        (ClusterConfig(), 0, 0, "--trainer-ranks", "at least one"),
    ],
)
def test_a_run_refuses_what_this_machine_cannot_give(cluster, requested, cuda_devices, key, reason):
    with pytest.raises(LaunchRefused) as refused:
        ranks_for_run(cluster, requested=requested, cuda_devices=cuda_devices)
    assert refused.value.key == key and reason in refused.value.reason


def test_under_torchrun_the_world_must_be_the_clusters():
    two_by_two = ClusterConfig(gpus_per_node=2, num_nodes=2)
    check_torchrun_world(two_by_two, world_size=4, local_world_size=2, cuda_devices=2)
    with pytest.raises(LaunchRefused, match="--nnodes 2 --nproc_per_node 2"):
        check_torchrun_world(two_by_two, world_size=2, local_world_size=2, cuda_devices=2)
    # No GPUs declared: whatever torchrun started (CPU ranks, or a GPU each).
    check_torchrun_world(ClusterConfig(), world_size=3, local_world_size=3, cuda_devices=0)
    with pytest.raises(LaunchRefused, match="set the GPUs per node"):
        check_torchrun_world(
            ClusterConfig(num_nodes=2), world_size=2, local_world_size=1, cuda_devices=0
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU machine")
def test_the_trainer_refuses_a_gpu_count_on_a_machine_without_one(capsys, tmp_path):
    code = main(
        ["trainer", "--config", QUICKSTART, "cluster.gpus_per_node=2", "--run-dir", str(tmp_path)]
    )
    assert code == 2
    assert "cluster.gpus_per_node: 2 GPUs asked for but torch sees no CUDA GPU" in (
        capsys.readouterr().err
    )


def test_several_ranks_refuse_the_supervised_warm_start(capsys, tmp_path, monkeypatch):
    # What torchrun tells rank 0 of two; refused before any rank joins the others.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    code = main(["trainer", "--config", QUICKSTART, "sft.enabled=true", "--run-dir", str(tmp_path)])
    assert code == 2
    assert "sft.enabled: the supervised warm start runs in one process" in capsys.readouterr().err


def test_lora_runs_on_data_and_tensor_parallel_ranks_but_not_dropout_under_tensor_parallel(
    capsys, tmp_path, monkeypatch
):
    lora = "policy.dtensor_cfg.lora_cfg.enabled=true"
    tensor = "policy.dtensor_cfg.tensor_parallel_size=2"
    # FSDP2 shards the peft model, or the tensor-parallel plan splits its wrapped projections
    # (the quickstart's supervised warm start runs in one process)
    check_ranks_can_run(load_config(QUICKSTART, [lora, "sft.enabled=false"]), 2)
    check_ranks_can_run(load_config(QUICKSTART, [lora, tensor, "sft.enabled=false"]), 2)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dropout = "policy.dtensor_cfg.lora_cfg.dropout=0.1"
    code = main(
        ["trainer", "--config", QUICKSTART, lora, tensor, dropout, "--run-dir", str(tmp_path)]
    )
    assert code == 2
    assert "policy.dtensor_cfg.lora_cfg.dropout: LoRA dropout with tensor_parallel_size > 1" in (
        capsys.readouterr().err
    )


def test_run_refuses_ranks_without_processes(capsys, tmp_path):
    ranks = ["--trainer-ranks", "2", "--run-dir", str(tmp_path)]
    code = main(["run", "--config", QUICKSTART, "data_plane=null", "sft.enabled=false", *ranks])
    assert code == 2
    assert "2 trainer ranks need processes" in capsys.readouterr().err


def test_the_supervisor_starts_several_ranks_under_torchrun(tmp_path):
    supervisor = Supervisor(
        tmp_path / "c.yaml", [], tmp_path, num_rollout_workers=1, num_scorers=1, trainer_ranks=2
    )
    argv = supervisor.trainer.argv
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    assert argv[:5] == [*torchrun, "--nproc_per_node=2"]
    assert argv[5:10] == ["-m", "dockyard", "--log-format", "json", "trainer"]


def test_cpu_offload_asks_for_ranks():
    config = load_config(QUICKSTART, ["policy.dtensor_cfg.cpu_offload=true", "sft.enabled=false"])
    with pytest.raises(LaunchRefused) as refused:
        check_ranks_can_run(config, 1)
    assert refused.value.key == "policy.dtensor_cfg.cpu_offload"
    check_ranks_can_run(config, 2)


def test_run_refuses_cpu_offload_for_one_trainer_process(capsys, tmp_path):
    offload = "policy.dtensor_cfg.cpu_offload=true"
    code = main(["run", "--config", QUICKSTART, offload, "--run-dir", str(tmp_path)])
    assert code == 2
    assert "policy.dtensor_cfg.cpu_offload: offloads FSDP2 shards" in capsys.readouterr().err


def test_tensor_parallel_size_must_divide_the_ranks():
    config = load_config(QUICKSTART, ["policy.dtensor_cfg.tensor_parallel_size=2"])
    with pytest.raises(LaunchRefused, match="2 must divide the 3 trainer rank"):
        check_ranks_can_run(config, 3)
    offload = load_config(
        QUICKSTART,
        ["policy.dtensor_cfg.tensor_parallel_size=2", "policy.dtensor_cfg.cpu_offload=true"],
    )
    with pytest.raises(LaunchRefused, match="without data-parallel ranks nothing is sharded"):
        check_ranks_can_run(offload, 2)  # one data-parallel group of two tensor-parallel ranks


def test_the_worker_screen_runs_on_any_number_of_trainer_ranks():
    # Every rank measures its share of the screened groups and rank 0 gathers the rows
    # (consumers/trainer/ranks.py); tests/unit/trainer/test_trainer_ranks.py checks the verdict.
    config = load_config(QUICKSTART, ["grpo.worker_trust.enabled=true", "sft.enabled=false"])
    check_ranks_can_run(config, 1)
    check_ranks_can_run(config, 2)


def test_tensor_times_context_parallel_size_must_divide_the_ranks():
    config = load_config(
        QUICKSTART, ["policy.dtensor_cfg.context_parallel_size=2", "sft.enabled=false"]
    )
    with pytest.raises(LaunchRefused, match="1 × 2 must divide the 3 trainer rank") as refused:
        check_ranks_can_run(config, 3)
    assert refused.value.key == "policy.dtensor_cfg.context_parallel_size"
    check_ranks_can_run(config, 2)


def test_expert_parallel_size_must_divide_the_ranks():
    # The ep ranks are data-parallel ranks (consumers/trainer/expert_parallel.py): 2 of them
    # cannot be cut out of 3.
    config = load_config(
        QUICKSTART, ["policy.dtensor_cfg.expert_parallel_size=2", "sft.enabled=false"]
    )
    with pytest.raises(LaunchRefused, match="2 must divide the 3 trainer rank") as refused:
        check_ranks_can_run(config, 3)
    assert refused.value.key == "policy.dtensor_cfg.expert_parallel_size"
    check_ranks_can_run(config, 2)
    check_ranks_can_run(config, 4)
