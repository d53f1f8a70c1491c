"""Mistakes in a run's inputs are refused at launch, on the terminal, with the key path (issue
#42): by ``dockyard config validate`` and by ``dockyard run`` before any role starts, never by a
trainer that the supervisor then restarts."""

from __future__ import annotations

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
