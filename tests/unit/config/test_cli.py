"""``dockyard config show|validate``: output, exit codes, one-line errors without tracebacks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dockyard.cli import main
from dockyard.config.loader import load_config

REPO_ROOT = Path(__file__).resolve().parents[3]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dockyard", *args], capture_output=True, text=True, timeout=60
    )


def test_validate_prints_ok_for_a_valid_config(write_config):
    result = run_cli("config", "validate", "--config", str(write_config()))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_validate_reports_every_problem_and_exits_2(write_config):
    result = run_cli(
        "config",
        "validate",
        "--config",
        str(write_config()),
        "grpo.num_prompts_per_step=3",
        "loss_fn.use_cispo=true",
        "loss_fn.token_level_loss=false",
    )
    assert result.returncode == 2
    # A section rule and a cross-section rule, reported by the same run.
    assert "policy.train_global_batch_size" in result.stderr
    assert "loss_fn.use_cispo" in result.stderr
    assert "Traceback" not in result.stderr


def test_each_kind_of_load_failure_is_one_reason_and_exit_2(write_config, capsys):
    good = str(write_config())
    broken_yaml = str(write_config("policy: [unclosed\n", name="broken.yaml"))
    cases = {
        "missing file": (["--config", "/nonexistent/config.yaml"], "not found"),
        "yaml syntax": (["--config", broken_yaml], "YAML syntax error"),
        "bad override": (["--config", good, "grpo.seed=[1,"], "cannot parse override"),
        "unknown key": (["--config", good, "grpo.sed=1"], "did you mean 'grpo.seed'"),
        "interpolation": (["--config", good, "grpo.seed=${nope.x}"], "cannot resolve"),
    }
    for name, (args, expected) in cases.items():
        assert main(["config", "validate", *args]) == 2, name
        err = capsys.readouterr().err
        assert expected in err, (name, err)
        assert "Traceback" not in err


def test_show_prints_the_resolved_config_which_loads_again(write_config, tmp_path, capsys):
    assert main(["config", "show", "--config", str(write_config()), "grpo.seed=7"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["grpo"]["seed"] == 7
    assert shown["loss_fn"]["ratio_clip_min"] == 0.2  # defaults are included
    reloaded = tmp_path / "reloaded.yaml"
    reloaded.write_text(yaml.safe_dump(shown))
    assert load_config(reloaded).grpo.seed == 7


def test_show_only_set_omits_defaults(write_config, capsys):
    assert main(["config", "show", "--only-set", "--config", str(write_config())]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert "ratio_clip_min" not in shown["loss_fn"]


def test_warnings_go_to_stderr(write_config, minimal_config, capsys):
    minimal_config["grpo"]["sed"] = 1
    assert main(["config", "validate", "--config", str(write_config(minimal_config))]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "ok"
    assert "did you mean 'grpo.seed'" in captured.err


def test_validate_and_run_warn_about_a_near_miss_of_a_section(write_config, capsys, tmp_path):
    quickstart = Path("configs/quickstart.yaml").resolve()
    config = write_config(f"defaults: {quickstart}\ngrpoo:\n  max_num_steps: 2\n")
    expected = "warning: unknown key 'grpoo' (kept, but no typed section reads it); did you mean"
    assert main(["config", "validate", "--config", str(config)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "ok"
    assert f"{expected} 'grpo'?" in captured.err
    # `dockyard run` loads the config the same way and says so before it starts anything; the
    # last role's metrics port out of range makes it stop right after that.
    argv = ["run", "--config", str(config), "--run-dir", str(tmp_path / "run")]
    assert main([*argv, "run.metrics_port=65535"]) == 2
    err = capsys.readouterr().err
    assert f"{expected} 'grpo'?" in err and "run.metrics_port" in err
    assert not (tmp_path / "run").exists()


def test_help_lists_subcommands():
    result = run_cli("--help")
    assert result.returncode == 0
    assert "config" in result.stdout


def test_an_unknown_dataset_stops_the_trainer_before_anything_starts(capsys, tmp_path):
    config = "configs/grpo_hle.yaml"  # a family config whose dataset is not built in here
    # runnable here but for the data: one device, no GPU
    one_device = [
        "policy.dtensor_cfg.tensor_parallel_size=1",
        "cluster.gpus_per_node=0",
        "cluster.num_nodes=1",
    ]
    # The family config leaves data_plane out (in-memory), which `dockyard trainer` alone
    # refuses first: a broker is what a trainer started on its own meets the others through.
    plane = "+data_plane.url=embedded"
    argv = ["trainer", "--config", config, "--run-dir", str(tmp_path), *one_device, plane]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "data.train.name: unknown dataset 'hle'" in err
    assert "Traceback" not in err
    assert not list(tmp_path.iterdir())  # no run directory content, no server started


def test_a_setting_this_build_cannot_run_stops_every_role_with_its_key_path(capsys, tmp_path):
    # The config family validates as the spec writes it, but its 4-node JAX trainer is not
    # what this build runs (the JAX backend itself is, on one host: issue #28).
    assert main(["config", "validate", "--config", "configs/grpo_swe_jax.yaml"]) == 0
    capsys.readouterr()
    for role in ("trainer", "rollout", "score", "run"):
        argv = [role, "--config", "configs/grpo_swe_jax.yaml"]
        if role in ("trainer", "run"):
            argv += ["--run-dir", str(tmp_path / role)]
        assert main(argv) == 2, role
        err = capsys.readouterr().err
        assert "cluster.num_nodes: with policy.jax_cfg.enabled: the JAX trainer is one" in err
        assert "the JAX trainer backend is not in this build" not in err


def test_ignored_speed_settings_only_warn(tmp_path):
    from dockyard.config.capabilities import ignored, not_implemented
    from dockyard.config.loader import load_config

    config = load_config(
        "configs/quickstart.yaml",
        ["++policy.dtensor_cfg.sequence_parallel=true", "++policy.dtensor_cfg.cpu_offload=true"],
    )
    assert not_implemented(config) == []
    # cpu_offload takes effect (FSDP2's CPUOffloadPolicy); sequence parallelism is warned about
    # with tensor_parallel_size=1 (nothing to split over)
    assert [issue.path for issue in ignored(config)] == ["policy.dtensor_cfg.sequence_parallel"]
    packed = load_config("configs/quickstart.yaml", ["policy.sequence_packing.enabled=true"])
    assert ignored(packed) == [] and not_implemented(packed) == []  # it takes effect
    turns = load_config("configs/quickstart.yaml", ["grpo.max_rollout_turns=3"])
    assert [issue.path for issue in not_implemented(turns)] == ["grpo.max_rollout_turns"]


def test_an_unknown_default_environment_stops_the_trainer(capsys, tmp_path):
    argv = ["trainer", "--config", "configs/quickstart.yaml", "--run-dir", str(tmp_path)]
    assert main([*argv, "data.default_env=nosuch"]) == 2
    assert "data.default_env: unknown environment 'nosuch'" in capsys.readouterr().err


def test_the_specs_example_entry_point_runs_the_same_pipeline():
    script = REPO_ROOT / "examples" / "run_grpo_swe.py"
    config = "examples/configs/quickstart.yaml"
    result = subprocess.run(
        [sys.executable, str(script), "--config", config, "grpo.num_prompts_per_step=3"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode == 2  # the override went through the config pipeline
    assert "policy.train_global_batch_size" in result.stderr


def test_built_processors_are_not_refused_and_unused_counts_warn():
    from dockyard.config.capabilities import ignored, not_implemented
    from dockyard.config.loader import load_config

    # Processors are built (an unknown one is refused when the config loads:
    # tests/unit/data/test_processors.py); unbuilt data settings: the next test.
    built = load_config(
        "configs/quickstart.yaml",
        ["data.default_processor=boxed_answer", "data.train.processor=shell_script"],
    )
    assert not_implemented(built) == []
    warned = load_config(
        "configs/quickstart.yaml",
        ["logger.num_val_samples_to_print=4", "env.arithmetic.num_scoring_workers=2"],
    )
    assert not_implemented(warned) == []
    assert [issue.path for issue in ignored(warned)] == ["env.arithmetic.num_scoring_workers"]


def test_extra_dataloaders_of_a_sync_run_are_accepted_at_launch():
    # Implemented for sync GRPO (the dispatcher mixes them in); async GRPO refuses them as the
    # spec says (tests/unit/config/test_validation_rules.py).
    from dockyard.config.capabilities import not_implemented
    from dockyard.config.loader import load_config

    sync_with_extra = load_config(
        "configs/quickstart.yaml",
        [
            "grpo.async_grpo.enabled=false",
            "loss_fn.use_importance_sampling_correction=false",
            "~loss_fn.truncated_importance_sampling_type",
            "~loss_fn.truncated_importance_sampling_ratio",
            "~loss_fn.truncated_importance_sampling_ratio_min",
            "data.extra_train_dataloaders=[{name: arithmetic}]",
        ],
    )
    assert not_implemented(sync_with_extra) == []


def test_validate_refuses_an_unregistered_estimator_with_exit_2(write_config, capsys):
    # The loader in config/ cannot see the algorithms' registry; the command passes it in.
    args = ["--config", str(write_config()), "grpo.adv_estimator.name=magic"]
    assert main(["config", "validate", *args]) == 2
    err = capsys.readouterr().err
    assert "grpo.adv_estimator.name: unknown estimator 'magic'; choose one of" in err
    assert "Traceback" not in err


def test_tool_use_with_an_environment_that_has_no_toolbox_is_refused_at_launch(capsys, tmp_path):
    # Otherwise every group of that environment would be dead-lettered `no_toolbox` after launch.
    argv = ["trainer", "--config", "configs/quickstart.yaml", "--run-dir", str(tmp_path)]
    tools = ["grpo.structured_tool_use.enabled=true", "grpo.max_rollout_turns=2"]
    assert main([*argv, *tools, "data.train.env=math"]) == 2
    err = capsys.readouterr().err
    assert "grpo.structured_tool_use.enabled: the environment 'math' of data.train has no" in err


def test_a_nats_password_never_comes_from_the_command_line(capsys, monkeypatch):
    # argv is readable by every local user (ps, /proc/PID/cmdline): no --password flag exists.
    from dockyard.commands._plane_args import PASSWORD_VARIABLE

    url = ["replay", "ls", "--url", "nats://127.0.0.1:1", "--user", "ops"]
    with pytest.raises(SystemExit):
        main([*url, "--password", "hunter2"])
    assert "unrecognized arguments: --password" in capsys.readouterr().err
    monkeypatch.delenv(PASSWORD_VARIABLE, raising=False)
    assert main(url) != 0
    assert f"--user ops needs its password in ${PASSWORD_VARIABLE}" in capsys.readouterr().err


def test_an_environment_served_as_a_tool_service_counts_as_having_a_toolbox():
    # The served toolbox lives in its own process (and build): the worker needs no local one.
    from dockyard.commands._cli import CliError
    from dockyard.commands._roles import _refuse_environments_without_tools

    tools = ["grpo.structured_tool_use.enabled=true", "grpo.max_rollout_turns=2"]
    math = [*tools, "data.train.env=math", "data_plane.url=nats://127.0.0.1:1"]
    with pytest.raises(CliError, match=r"the environment 'math' of data\.train has no toolbox"):
        _refuse_environments_without_tools(load_config("configs/quickstart.yaml", math))
    served = load_config(
        "configs/quickstart.yaml", [*math, "grpo.structured_tool_use.tool_services=[math]"]
    )
    _refuse_environments_without_tools(served)  # refused no more


def test_tool_services_without_nats_are_refused_at_launch(capsys, tmp_path):
    # `dockyard run` checks as the trainer does (every run has one), before any role starts.
    argv = ["run", "--config", "configs/multiturn_tools.yaml", "--run-dir", str(tmp_path)]
    served = "grpo.structured_tool_use.tool_services=[arithmetic]"
    assert main([*argv, served, "data_plane=null"]) == 2
    assert "tool_services: a tool service is reached over NATS" in capsys.readouterr().err


def test_tools_serve_refuses_an_unknown_toolbox_and_a_plane_no_worker_reaches(capsys):
    argv = ["tools", "serve", "--config", "configs/multiturn_tools.yaml"]
    assert main([*argv, "--toolbox", "arithmetic"]) == 2  # the config's url is `embedded`
    assert "data_plane.url: dockyard tools serve joins a run's NATS server" in (
        capsys.readouterr().err
    )
    assert main([*argv, "--toolbox", "nope", "data_plane.url=nats://127.0.0.1:1"]) == 2
    assert "--toolbox: no toolbox for environment 'nope'" in capsys.readouterr().err
    slow = ["env.terminal_bench.limits.wall_time_s=30", "data_plane.url=nats://127.0.0.1:1"]
    assert main([*argv, "--toolbox", "terminal_bench", *slow]) == 2
    assert "--toolbox terminal_bench: env.terminal_bench.limits.wall_time_s=30 must be under" in (
        capsys.readouterr().err
    )


def test_tool_service_names_and_prefix_must_be_subject_tokens():
    from dockyard.config.errors import ConfigError

    served = "grpo.structured_tool_use.tool_services=[arithmetic]"
    bad = {
        "grpo.structured_tool_use.tool_services=[a.b]": "'a.b' cannot be a NATS subject token",
        "grpo.structured_tool_use.tool_services=[x,x]": "lists x twice",
        "grpo.structured_tool_use.tool_service_prefix=tools.*": "without wildcards",
        "grpo.structured_tool_use.tool_service_timeout_s=0": "tool_service_timeout_s",
        "grpo.structured_tool_use.enabled=false": "tools are called only with enabled=true",
    }
    for override, reason in bad.items():
        with pytest.raises(ConfigError, match=re.escape(reason)):
            load_config("configs/multiturn_tools.yaml", [served, override])


def test_terminal_bench_with_tool_use_is_accepted_and_a_sandbox_slower_than_a_tool_refused(
    capsys,
):
    # The terminal_bench environment has a toolbox now: a config with tool use passes the
    # toolbox checks; a sandbox wall clock at the tool timeout (30 s) would let the episode's
    # timeout strike first, so it is refused before the engine loads.
    from dockyard.commands._roles import prepare_rollout

    tools = ["grpo.structured_tool_use.enabled=true", "grpo.max_rollout_turns=4"]
    prepare_rollout(load_config("configs/cpu/grpo_terminal_bench.yaml", tools))
    argv = ["rollout", "--config", "configs/cpu/grpo_terminal_bench.yaml", *tools]
    assert main([*argv, "env.terminal_bench.limits.wall_time_s=30"]) == 2
    err = capsys.readouterr().err
    assert "the toolbox of data.train's environment 'terminal_bench'" in err
    assert "env.terminal_bench.limits.wall_time_s=30 must be under the tool call timeout" in err


@pytest.mark.parametrize(
    "key", ["tensor_parallel_size", "context_parallel_size", "expert_parallel_size"]
)
def test_torch_model_parallel_degrees_are_refused_with_the_jax_backend(key):
    """The JAX trainer never reads dtensor_cfg's degrees: a value > 1 there would be silently
    ignored, so it is refused with its key path (1 stays accepted)."""
    from dockyard.config.capabilities import not_implemented
    from dockyard.config.loader import load_config

    jax = ["policy.jax_cfg.enabled=true", "policy.dtensor_cfg.enabled=false"]
    config = load_config("configs/quickstart.yaml", [*jax, f"policy.dtensor_cfg.{key}=2"])
    paths = [issue.path for issue in not_implemented(config)]
    assert f"policy.dtensor_cfg.{key}" in paths
    assert not [
        issue
        for issue in not_implemented(load_config("configs/quickstart.yaml", jax))
        if issue.path.startswith("policy.dtensor_cfg.")
    ]


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`dockyard ... | head`: the pipe's reader is gone before the output is written; the
    command ends as a shell expects (128 + SIGPIPE), with no traceback on the terminal."""
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "dockyard", "config", "keys"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the table is printed: its first write finds no reader
    err = process.stderr.read()
    assert process.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err
