"""Every role's ``/metrics`` scraped over HTTP while a real in-process run goes on (issue #26):
the counters moved by what the run did, read with prometheus-client's own parser."""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import subprocess
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dockyard.commands._inprocess import run_in_process
from dockyard.config.loader import load_config
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.observability.status_files import read_statuses
from tests.integration.e2e.conftest import QUICKSTART, ROOT, trainer_step, wait_until

STEPS = 3
PROMPTS_PER_STEP = 4  # SMALL_RUN's grpo.num_prompts_per_step
GENERATIONS = 4  # SMALL_RUN's grpo.num_generations_per_prompt
WORKERS = 2

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    samples: Samples = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


class ScrapingDisplay:
    """In place of the progress display: scrapes ``/metrics`` at each of the fleet's ticks, from
    the event loop's thread, so no role moves a counter while the scrape reads them. The last
    tick comes after the trainer returned, before the endpoint closes."""

    def __init__(self, status_dir: Path) -> None:
        self.status_dir = status_dir
        self.scrapes: list[tuple[int, Samples]] = []

    def __enter__(self) -> ScrapingDisplay:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def refresh(self) -> None:
        ports = {s.counters.get("metrics_port") for s in read_statuses(self.status_dir)}
        ports.discard(None)
        if not ports:
            return
        assert len(ports) == 1, ports  # one process: one endpoint in every role's heartbeat
        port = int(ports.pop())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
            self.scrapes.append((port, parse(reply.read().decode())))


@pytest.mark.slow
def test_metrics_scraped_during_a_run_follow_what_the_run_did(tmp_path, small_run):
    config = load_config(
        QUICKSTART,
        [
            *small_run,
            "data_plane=null",
            f"grpo.max_num_steps={STEPS}",
            f"run.num_rollout_workers={WORKERS}",
            "run.num_scorers=2",
            "run.metrics_port=0",
        ],
    )
    run_dir = tmp_path / "run"
    display = ScrapingDisplay(run_dir / "status")
    # Other tests of this process may have moved the same counters: compare against now.
    before = parse(generate_latest(REGISTRY).decode())

    assert asyncio.run(run_in_process(config, run_dir, display)) == 0  # type: ignore[arg-type]

    # At least the tick that saw the trainer return: the workers and scorers still run then.
    assert display.scrapes, "the run was never scraped"
    _, after = display.scrapes[-1]

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    # The histogram counts every optimizer step; the run trained exactly STEPS.
    assert moved("dockyard_train_step_duration_seconds_count") == STEPS
    assert moved("dockyard_train_step_duration_seconds_sum") > 0
    # Down the pipeline each stage can only pass on what it received (one message a group).
    trained = moved("dockyard_messages_received_total", stage="trainer", type="ScoredRollout")
    scored = moved("dockyard_messages_published_total", stage="scorer", type="ScoredRollout")
    to_score = moved("dockyard_messages_received_total", stage="scorer", type="Rollout")
    rollouts = moved("dockyard_messages_published_total", stage="rollout", type="Rollout")
    prompts_in = moved("dockyard_messages_received_total", stage="rollout", type="PromptGroup")
    assert trained >= STEPS * PROMPTS_PER_STEP
    assert prompts_in >= rollouts >= to_score >= scored >= trained
    # Each rollout carries GENERATIONS samples of 1..max_new_tokens tokens.
    tokens = moved("dockyard_generated_tokens_total")
    max_new = config.policy.generation.max_new_tokens
    assert rollouts * GENERATIONS <= tokens <= rollouts * GENERATIONS * max_new
    # Every worker loaded the first weights before it generated.
    assert moved("dockyard_refit_duration_seconds_count") >= WORKERS
    # Nothing was refused in a clean run.
    for family in ("dockyard_dead_letters_total", "dockyard_decode_failures_total"):
        refused = {k: after[k] - before.get(k, 0.0) for k in after if k[0] == family}
        assert not {k: v for k, v in refused.items() if v}, family
    # The trainer measured each consumer's backlog after its steps (the in-memory plane's
    # namespace is the default one; other tests of this process leave gauges of their own).
    namespace = DataPlaneConfig().namespace
    backlogs = {
        dict(k[1])["consumer"]
        for k in after
        if k[0] == "dockyard_consumer_backlog_messages"
        and dict(k[1])["consumer"].startswith(f"{namespace}_")
    }
    assert backlogs == {f"{namespace}_{name}" for name in ("prompts", "rollouts", "scored")}


def free_port_block(size: int) -> int:
    """A base port whose ``size`` consecutive ports are free now (bound and released)."""
    for _ in range(100):
        base = random.randrange(20000, 60000)
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + size):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {size} consecutive free ports found")


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        return parse(reply.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.slow
def test_each_role_process_of_a_fleet_serves_its_own_metrics(tmp_path, small_run):
    run_dir = tmp_path / "run"
    status_dir = run_dir / "status"
    # A base port N, as a user sets it: the roles get N, N+1, ... (docs/operations.md).
    base = free_port_block(4)
    overrides = [
        *small_run,
        "grpo.max_num_steps=1000",
        "run.num_scorers=2",
        f"run.metrics_port={base}",
    ]
    command = [sys.executable, "-m", "dockyard", "--log-format", "json", "run"]
    process = subprocess.Popen(
        [*command, "--config", str(QUICKSTART), *overrides, "--run-dir", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        names = {"trainer-0", "rollout-w0", "scorer-s0", "scorer-s1"}

        def ports() -> dict[str, int]:
            return {
                f"{s.role}-{s.instance}": int(s.counters["metrics_port"])
                for s in read_statuses(status_dir)
                if "metrics_port" in s.counters
            }

        wait_until(lambda: set(ports()) == names, 180, "every role's metrics port")
        wait_until(lambda: trainer_step(status_dir) >= 2, 180, "step 2")
        where = ports()
        # Downstream first: a counter only grows, so what a stage took in by the time it was
        # scraped was published upstream by the (later) time upstream is scraped.
        trainer = scrape(where["trainer-0"])
        scorers = [scrape(where[f"scorer-s{i}"]) for i in range(2)]
        worker = scrape(where["rollout-w0"])
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    # trainer N, rollout worker N+1, scorers N+2 and N+3: one endpoint per process
    assert where == {
        "trainer-0": base,
        "rollout-w0": base + 1,
        "scorer-s0": base + 2,
        "scorer-s1": base + 3,
    }
    steps = value(trainer, "dockyard_train_step_duration_seconds_count")
    trained = value(
        trainer, "dockyard_messages_received_total", stage="trainer", type="ScoredRollout"
    )
    assert steps >= 2 and trained >= steps * PROMPTS_PER_STEP
    scored = sum(
        value(s, "dockyard_messages_published_total", stage="scorer", type="ScoredRollout")
        for s in scorers
    )
    to_score = sum(
        value(s, "dockyard_messages_received_total", stage="scorer", type="Rollout")
        for s in scorers
    )
    rollouts = value(worker, "dockyard_messages_published_total", stage="rollout", type="Rollout")
    assert rollouts >= to_score >= scored >= trained
    assert value(worker, "dockyard_generated_tokens_total") >= rollouts * GENERATIONS
    assert value(worker, "dockyard_refit_duration_seconds_count") >= 1
    # Each process counts only what its own role did.
    assert value(trainer, "dockyard_generated_tokens_total") == 0
    assert value(worker, "dockyard_train_step_duration_seconds_count") == 0
    assert all(value(s, "dockyard_generated_tokens_total") == 0 for s in scorers)
