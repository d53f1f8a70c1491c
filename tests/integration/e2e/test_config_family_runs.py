"""Every file of the config family runs end to end on this machine, through its CPU preset
(``configs/cpu/<name>``: a tiny model built in code, a dataset shipped in the repo, the file's
own environment), or is listed in :data:`EXCLUDED` with the reason, and the reason is checked to
still hold. A file that is neither fails the test, so the family cannot grow a member that
silently never runs.

Each run is the real ``dockyard run`` (an embedded nats-server, separate role processes, the
real scorer and its environment; the SWE runs a real ``dockyard sandbox serve``, gdpval a real
vLLM server as its judge, osworld a real ``dockyard osworld serve``), a few steps,
then its own records are read back: the ledger holds every group exactly once, and the scorer
scored with the environment the config names.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from dockyard.fleet.recipe import plan_recipe
from dockyard.observability.status_files import read_statuses
from tests.integration.e2e.conftest import QUICKSTART, ROOT, SMALL_RUN, run_dockyard
from tests.integration.e2e.ledger_checks import (
    assert_every_group_accounted,
    assert_exactly_once,
    metric_steps,
    read_trail,
)
from tests.judge_server import JUDGE_GROUP

CONFIGS = ROOT / "configs"
PRESETS = CONFIGS / "cpu"
STEPS = 2


@dataclass(frozen=True)
class CpuRun:
    """How a family file runs here: its preset, the environment that must have scored it, and
    whether it needs the SWE sandbox service or goes without a broker."""

    preset: Path
    env: str
    overrides: tuple[str, ...] = ()
    sandbox_service: bool = False
    judge: bool = False  # needs the LLM judge server (a real vLLM server on a tiny model)
    desktops: bool = False  # needs the desktop simulator (`dockyard osworld serve`)
    broker: bool = True
    # Dead-letter reasons the environment may produce by design on a random tiny policy (each
    # must reach the ledger as the group's drop reason); none by default.
    allowed_dead_letters: tuple[str, ...] = ()


RUNS: dict[str, CpuRun] = {
    "quickstart.yaml": CpuRun(QUICKSTART, "arithmetic", tuple(SMALL_RUN)),  # CPU-sized as is
    "grpo_hle.yaml": CpuRun(PRESETS / "grpo_hle.yaml", "hle"),
    "gpqa.yaml": CpuRun(PRESETS / "gpqa.yaml", "gpqa"),
    "grpo_program_bench.yaml": CpuRun(
        PRESETS / "grpo_program_bench.yaml",
        "program_bench",
        # validation at the start and the end runs the Evaluator on the record's tests too
        ("grpo.val_at_start=true", "grpo.val_at_end=true"),
    ),
    "grpo_terminal_bench.yaml": CpuRun(PRESETS / "grpo_terminal_bench.yaml", "terminal_bench"),
    "grpo_swe.yaml": CpuRun(PRESETS / "grpo_swe.yaml", "swe", sandbox_service=True),
    "grpo_swe_pro.yaml": CpuRun(PRESETS / "grpo_swe_pro.yaml", "swe", sandbox_service=True),
    # The JAX trainer backend (issue #28) on one CPU device.
    "grpo_swe_jax.yaml": CpuRun(PRESETS / "grpo_swe_jax.yaml", "swe", sandbox_service=True),
    # The judge is a tiny random model: it may never give a score, which is dead-lettered
    # `judge_refused` by design (issue #22), never scored 0.
    "grpo_gdpval.yaml": CpuRun(
        PRESETS / "grpo_gdpval.yaml", "gdpval", judge=True, allowed_dead_letters=("judge_refused",)
    ),
    # Computer use (issue #22): episodes drive simulated desktops (a stand-in for OSWorld VMs).
    "grpo_osworld.yaml": CpuRun(PRESETS / "grpo_osworld.yaml", "osworld", desktops=True),
    # Multi-turn gdpval (issue #23): episodes with the gdpval file tools in the sandbox; the
    # scorer replays their file-changing calls, then the same tiny judge grades.
    "grpo_gdpval_agentic.yaml": CpuRun(
        PRESETS / "grpo_gdpval_agentic.yaml",
        "gdpval",
        judge=True,
        allowed_dead_letters=("judge_refused",),
    ),
    # Multi-turn tool use (issue #23): episodes with the calculator toolbox, CPU-sized as is,
    # its warm start on the data's calculator demonstrations kept (checked below).
    "multiturn_tools.yaml": CpuRun(
        CONFIGS / "multiturn_tools.yaml",
        "arithmetic",
        (*(o for o in SMALL_RUN if o != "sft.enabled=false"), "grpo.max_val_samples=50"),
    ),
    # OPD is refused over a broker (the spec): the in-memory plane, as the full-size file.
    "v4_consolidation.yaml": CpuRun(PRESETS / "v4_consolidation.yaml", "teacher", broker=False),
}
SFT = {"sft.yaml": PRESETS / "sft.yaml"}  # `dockyard sft`, then a GRPO run from its model
# Recipe files (`dockyard recipe v4`), not run configs: each of their stages is a run config,
# validated here; the chain itself runs in test_recipe_chain.py and benchmarks/bench_v4_recipe.py.
RECIPES = {"v4_recipe.yaml"}


@dataclass(frozen=True)
class Exclusion:
    reason: str
    still_holds: Callable[[], bool]


EXCLUDED: dict[str, Exclusion] = {
    "grpo_swe_sglang.yaml": Exclusion(
        "SGLang servers do not run on this machine (no sglang installed; GPU servers)",
        lambda: importlib.util.find_spec("sglang") is None and shutil.which("sglang") is None,
    ),
}


def test_every_family_file_runs_here_or_is_excluded_with_a_reason_that_holds():
    family = {path.name for path in CONFIGS.glob("*.yaml")}
    covered = set(RUNS) | set(SFT) | RECIPES
    assert not covered & set(EXCLUDED)
    assert family - covered - set(EXCLUDED) == set(), "a family file with no CPU run"
    assert covered | set(EXCLUDED) == family, "the tables name a file that is not in configs/"
    for name, exclusion in EXCLUDED.items():
        assert exclusion.still_holds(), f"{name}: no longer excluded ({exclusion.reason})"
        assert not (PRESETS / name).exists(), f"{name} has a preset: run it instead"
    for name in RECIPES:
        assert plan_recipe(CONFIGS / name), f"{name}: a recipe without stages"
    for name, run in RUNS.items():
        preset_of = run.preset.resolve()
        assert preset_of.is_file()
        if preset_of != (CONFIGS / name).resolve():  # its preset builds on the file itself
            assert f"../{name}" in run.preset.read_text()


def _check_run(run_dir: Path, result: subprocess.CompletedProcess[str], run: CpuRun) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    assert metric_steps(run_dir) == list(range(1, STEPS + 1))
    trained = assert_exactly_once(run_dir)
    assert trained
    assert_every_group_accounted(run_dir)
    assert (run_dir / "nats").is_dir() == run.broker
    scorers = [s for s in read_statuses(run_dir / "status") if s.role == "scorer"]
    if run.broker:  # with the in-memory plane the scorer runs in the trainer's process
        counters = scorers[0].counters
        assert counters[f"{run.env}/groups"] >= len(trained), counters
        assert counters["failures"] == 0, counters
        if not run.allowed_dead_letters:
            assert counters["dead_lettered"] == 0, counters
    drops = [e["reason"] for e in read_trail(run_dir / "ledger.jsonl") if e["event"] == "dropped"]
    dead = [reason for reason in drops if reason.startswith("dead letter from ")]
    allowed = run.allowed_dead_letters
    assert all(reason.rsplit(": ", 1)[-1] in allowed for reason in dead), dead


def _preset_params() -> list[object]:
    """One case per preset; those judged by the session's vLLM judge share its xdist group."""
    return [
        pytest.param(name, marks=[pytest.mark.xdist_group(JUDGE_GROUP)] if run.judge else [])
        for name, run in sorted(RUNS.items())
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", _preset_params())
def test_the_cpu_preset_runs_a_few_steps_end_to_end(name, tmp_path, request):
    run = RUNS[name]
    overrides = list(run.overrides)
    if run.sandbox_service:
        overrides.append(f"env.swe.sandbox_urls=[{request.getfixturevalue('sandbox_url')}]")
    if run.judge:
        overrides.append(f"env.gdpval.judge.base_url={request.getfixturevalue('judge_url')}")
    if run.desktops:
        overrides.append(f"env.osworld.simulator_url={request.getfixturevalue('simulator_url')}")
    run_dir = tmp_path / "run"
    result = run_dockyard(
        "run",
        "--config",
        str(run.preset),
        *overrides,
        f"grpo.max_num_steps={STEPS}",
        "--run-dir",
        str(run_dir),
        timeout=280,
    )
    _check_run(run_dir, result, run)
    if name == "multiturn_tools.yaml":
        # The warm start imitated the demonstrated episodes until greedy held-out episodes
        # reached sft.stop_at_val_accuracy (0.3; the model cannot multiply without the tool),
        # and the GRPO steps' episodes, judged by their last turn, earned reward.
        records = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]
        warm = next(r["metrics"] for r in records if "sft/val_accuracy" in r["metrics"])
        assert warm["sft/val_accuracy"] >= 0.3, warm
        rewards = [
            r["metrics"]["train/reward_mean"]
            for r in records
            if "train/reward_mean" in r["metrics"]
        ]
        assert len(rewards) == STEPS and max(rewards) > 0, rewards
    if name == "grpo_program_bench.yaml":
        validations = [
            line
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"val/accuracy"' in line
        ]
        assert len(validations) >= 2  # at the start and at the end, scored on the tests


@pytest.mark.slow
def test_sft_writes_a_model_a_grpo_preset_starts_from(tmp_path):
    sft_dir = tmp_path / "sft"
    result = run_dockyard(
        "sft",
        "--config",
        str(SFT["sft.yaml"]),
        "sft.max_num_steps=4",
        "sft.val_period=2",
        "--run-dir",
        str(sft_dir),
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    model = sft_dir / "model"
    assert "trained 4 SFT steps" in result.stdout
    assert (model / "config.json").is_file() and (model / "tokenizer.json").is_file()

    run = RUNS["grpo_hle.yaml"]
    run_dir = tmp_path / "grpo"
    result = run_dockyard(
        "run",
        "--config",
        str(run.preset),
        f"policy.model_name={model}",
        f"grpo.max_num_steps={STEPS}",
        "--run-dir",
        str(run_dir),
        timeout=280,
    )
    _check_run(run_dir, result, run)
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    assert f'"model_name": "{model}"' in trainer_log


def test_sft_without_a_dev_check_is_refused_at_launch(tmp_path, capsys):
    from dockyard.cli import main

    argv = ["sft", "--config", str(SFT["sft.yaml"]), "~data.validation"]
    assert main([*argv, "--run-dir", str(tmp_path / "sft")]) == 2
    assert (
        "sft.dev_dataset: sft needs sft.dev_dataset or data.validation" in capsys.readouterr().err
    )
    assert not (tmp_path / "sft").exists()  # refused before anything was written


def test_sft_with_extra_dataloaders_is_refused_at_launch(tmp_path, capsys):
    # SFT trains on data.train alone: extra loaders would be read by nothing.
    from dockyard.cli import main

    sync = [  # async GRPO refuses several loaders already (the spec); sync accepts them
        "grpo.async_grpo.enabled=false",
        "loss_fn.use_importance_sampling_correction=false",
        "~loss_fn.truncated_importance_sampling_type",
        "~loss_fn.truncated_importance_sampling_ratio",
        "~loss_fn.truncated_importance_sampling_ratio_min",
    ]
    extra = "data.extra_train_dataloaders=[{name: arithmetic}]"
    argv = ["sft", "--config", str(SFT["sft.yaml"]), *sync, extra]
    argv += ["--run-dir", str(tmp_path / "sft")]
    assert main(argv) == 2
    assert "data.extra_train_dataloaders: dockyard sft trains on data.train only" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "sft").exists()
