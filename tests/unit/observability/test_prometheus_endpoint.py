"""Where each role serves ``/metrics`` (``run.metrics_port``): ports that cannot collide on one
machine, a port in use refused with its key path, and the endpoint's own answer."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dockyard.cli import CliError, build_parser, main
from dockyard.commands._common import EXIT_INVALID_CONFIG
from dockyard.commands._roles import metrics_endpoint
from dockyard.config.loader import load_config
from dockyard.fleet.supervisor import Supervisor
from dockyard.observability.prometheus import GENERATED_TOKENS

QUICKSTART = Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml"


def port_override(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("run.metrics_port=")]


def test_dockyard_run_gives_each_role_process_its_own_port(tmp_path):
    supervisor = Supervisor(
        QUICKSTART, [], tmp_path, num_rollout_workers=2, num_scorers=3, metrics_port=9100
    )
    ports = {role.name: port_override(role.argv) for role in supervisor.roles}
    # trainer N, rollout worker i N+1+i, scorer j N+1+workers+j (docs/operations.md)
    assert ports == {
        "trainer-0": ["run.metrics_port=9100"],
        "rollout-0": ["run.metrics_port=9101"],
        "rollout-1": ["run.metrics_port=9102"],
        "scorer-0": ["run.metrics_port=9103"],
        "scorer-1": ["run.metrics_port=9104"],
        "scorer-2": ["run.metrics_port=9105"],
    }


def test_each_role_command_line_parses_with_its_port_among_the_overrides(tmp_path):
    """The port comes before the options: argparse takes overrides only before them (issue
    #42: ``run.metrics_port=N`` used to be refused as an unrecognized argument)."""
    supervisor = Supervisor(
        QUICKSTART,
        ["grpo.max_num_steps=3"],
        tmp_path,
        num_rollout_workers=1,
        num_scorers=1,
        metrics_port=9100,
    )
    parser = build_parser()
    for offset, role in enumerate(supervisor.roles):
        dockyard_at = role.argv.index("dockyard")
        args = parser.parse_args(role.argv[dockyard_at + 1 :])
        assert args.overrides == ["grpo.max_num_steps=3", f"run.metrics_port={9100 + offset}"]
        assert args.status_dir == str(tmp_path / "status")


@pytest.mark.parametrize("port", [None, 0])
def test_off_or_a_free_port_is_passed_on_as_configured(tmp_path, port):
    supervisor = Supervisor(
        QUICKSTART, [], tmp_path, num_rollout_workers=1, num_scorers=1, metrics_port=port
    )
    assert all(port_override(role.argv) == [] for role in supervisor.roles)


def test_a_base_port_whose_last_role_is_out_of_range_is_refused_at_launch(tmp_path, capsys):
    # 65534 + 1 worker + 1 scorer: the scorer would need port 65536
    run_dir = tmp_path / "run"
    argv = ["run", "--config", str(QUICKSTART), "run.metrics_port=65534", "--run-dir", str(run_dir)]
    assert main(argv) == EXIT_INVALID_CONFIG
    assert "run.metrics_port" in capsys.readouterr().err
    assert not run_dir.exists()  # refused before anything was written or started


def test_one_process_of_dockyard_run_may_use_the_last_port():
    config = load_config(QUICKSTART, ["data_plane=null", "run.metrics_port=65535"])
    assert config.run.metrics_port == 65535


def test_a_port_in_use_is_refused_with_its_key_path():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        config = load_config(QUICKSTART, [f"run.metrics_port={port}"])
        with (
            pytest.raises(CliError, match=r"run\.metrics_port") as refused,
            metrics_endpoint(config),
        ):
            pass
        assert refused.value.exit_code == EXIT_INVALID_CONFIG
    finally:
        taken.close()


def test_the_endpoint_serves_the_counters_in_the_exposition_format():
    config = load_config(QUICKSTART, ["run.metrics_port=0"])
    with metrics_endpoint(config) as server:
        assert server is not None and server.port > 0
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as reply:
            before = read_counter(reply.read().decode(), "dockyard_generated_tokens")
        GENERATED_TOKENS.inc(7)
        with urllib.request.urlopen(url, timeout=30) as reply:
            after = read_counter(reply.read().decode(), "dockyard_generated_tokens")
    assert after - before == 7
    with pytest.raises(OSError):  # closed with the block
        urllib.request.urlopen(url, timeout=5)


def read_counter(text: str, family_name: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == family_name:
            return next(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError(f"{family_name} not exposed")
