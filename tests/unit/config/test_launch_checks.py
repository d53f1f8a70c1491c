"""Mistakes in a run's inputs are refused at launch, on the terminal, with the key path (issue
#42): by ``dockyard config validate`` and by ``dockyard run`` before any role starts, never by a
trainer that the supervisor then restarts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dockyard.cli import main

QUICKSTART = Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml"
A_FILE_DATASET = ["data.train.name=sums", "~data.train.params"]
RECORDS = [
    '{"prompt": "1+1=", "answer": "2"}',
    '{"prompt": "2+2=", "answer": "4"}',
    '{"prompt": "3+3=", "answer": "6"}',
    '{"prompt": "4+4=" "answer": "8"}',
]


@pytest.fixture
def broken_file(tmp_path: Path) -> Path:
    path = tmp_path / "sums.jsonl"
    path.write_text("\n".join(RECORDS) + "\n")
    return path


def cases(tmp_path: Path, broken_file: Path) -> dict[str, tuple[str, str]]:
    missing = tmp_path / "nosuch.jsonl"
    return {
        "missing": (f"data.train.path={missing}", f"data.train.path: {missing} does not exist"),
        # The fourth record, on the fourth line, lacks a comma.
        "malformed": (
            f"data.train.path={broken_file}",
            f"data.train.path: record 3 (line 4) of {broken_file}: invalid JSON",
        ),
    }


@pytest.mark.parametrize("case", ["missing", "malformed"])
def test_config_validate_refuses_a_dataset_file_that_is_missing_or_malformed(
    case, tmp_path, broken_file, capsys
):
    override, message = cases(tmp_path, broken_file)[case]
    argv = ["config", "validate", "--config", str(QUICKSTART), *A_FILE_DATASET, override]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("case", ["missing", "malformed"])
def test_dockyard_run_refuses_it_before_any_role_starts(case, tmp_path, broken_file, capsys):
    override, message = cases(tmp_path, broken_file)[case]
    run_dir = tmp_path / "run"
    argv = ["run", "--config", str(QUICKSTART), *A_FILE_DATASET, override]
    assert main([*argv, "--run-dir", str(run_dir)]) == 2
    assert message in capsys.readouterr().err
    assert not run_dir.exists()  # no broker, no role, no run directory


def test_a_good_file_dataset_validates(tmp_path, capsys):
    path = tmp_path / "sums.jsonl"
    path.write_text("\n".join(RECORDS[:3]) + "\n")
    argv = ["config", "validate", "--config", str(QUICKSTART), *A_FILE_DATASET]
    assert main([*argv, f"data.train.path={path}"]) == 0
    assert capsys.readouterr().out.strip() == "ok"


OSWORLD = QUICKSTART.parent / "cpu" / "grpo_osworld.yaml"


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on: bound, then let go (the kernel does not hand it out again at
    once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_dockyard_run_refuses_a_service_that_does_not_answer_before_any_role_starts(
    tmp_path, closed_port, capsys
):
    # configs/cpu/grpo_osworld.yaml without `dockyard osworld serve`: the run starved for ten
    # minutes with the cause in a log; it is refused at once, with the key.
    url = f"http://127.0.0.1:{closed_port}"
    run_dir = tmp_path / "run"
    argv = ["run", "--config", str(OSWORLD), f"env.osworld.simulator_url={url}"]
    assert main([*argv, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"env.osworld.simulator_url: {url} does not answer (Connection refused)" in err
    assert not run_dir.exists()


def test_config_validate_says_so_as_a_warning(closed_port, capsys):
    # The services of a config validated here may live on the cluster it is meant for.
    url = f"http://127.0.0.1:{closed_port}"
    argv = ["config", "validate", "--config", str(OSWORLD), f"env.osworld.simulator_url={url}"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "ok"
    assert f"warning: env.osworld.simulator_url: {url} does not answer" in captured.err


def test_a_listening_service_answers_and_only_the_run_s_environments_are_asked():
    from dockyard.commands._services import named_services, unanswered_services
    from dockyard.config.loader import load_config

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        config = load_config(OSWORLD, [f"env.osworld.simulator_url={url}"])
        assert [(s.key, s.url) for s in named_services(config)] == [
            ("env.osworld.simulator_url", url)
        ]
        assert unanswered_services(config) == []
    # The quickstart scores arithmetic: a simulator URL set for it is none of its services.
    quickstart = load_config(QUICKSTART, [f"env.osworld.simulator_url={url}"])
    assert named_services(quickstart) == []
