"""The live display of ``dockyard run`` (issue #26): a rich table from the roles' real status
files, rendered to a recording ``rich`` console; plain summary lines without a terminal."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from rich.console import Console

from dockyard.fleet.progress import ProgressDisplay, RunFiles, render
from dockyard.observability.status_files import StatusFile


def text_of(renderable: object, *, width: int = 160) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def row(text: str, role: str) -> str:
    [line] = [line for line in text.splitlines() if f" {role} " in line]
    return line


def heartbeats(status_dir: Path) -> dict[str, StatusFile]:
    trainer = StatusFile(status_dir, "trainer", "0")
    trainer.update(
        "running", step=3, weight_version=3, reward=0.25, val_accuracy=0.5, staleness=1.5
    )
    trainer.update(tokens_per_s=1234.0)
    rollout = StatusFile(status_dir, "rollout", "w0")
    rollout.update("starting", detail="waiting for the first weights")
    rollout.update("running", groups=7, weight_version=3)
    scorer = StatusFile(status_dir, "scorer", "s0")
    scorer.update("running", groups=6, failures=1)
    return {"trainer": trainer, "rollout": rollout, "scorer": scorer}


def test_the_table_shows_step_reward_accuracy_staleness_and_each_role(tmp_path: Path) -> None:
    status_dir = tmp_path / "status"
    heartbeats(status_dir)
    # The scorer's last heartbeat is 100 s old: still "running" in its file, silent in fact.
    scorer_file = status_dir / "scorer-s0.json"
    stale = json.loads(scorer_file.read_text())
    stale["updated_at_unix_s"] = time.time() - 100
    scorer_file.write_text(json.dumps(stale))

    text = text_of(render(status_dir, started_at=time.time(), max_steps=5))

    title = text.splitlines()[0]
    for part in ("step 3/5", "reward 0.25", "val acc 0.5", "staleness 1.5", "1234 tok/s"):
        assert part in title, (part, text)
    assert row(text, "trainer-0").split("│")[2].strip() == "running"
    assert "step=3" in row(text, "trainer-0")
    rollout = row(text, "rollout-w0")
    assert "running" in rollout and "groups=7" in rollout and "weight_version=3" in rollout
    # The detail it was given while starting does not stick to the running state.
    assert "waiting for the first weights" not in text
    scorer = row(text, "scorer-s0")
    assert scorer.split("│")[2].strip() == "silent" and "100s ago" in scorer


def test_the_table_left_on_screen_shows_the_roles_as_they_ended(tmp_path: Path) -> None:
    status_dir = tmp_path / "status"
    roles = heartbeats(status_dir)
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=160, record=True)
    with ProgressDisplay(status_dir, max_steps=5, console=console) as display:
        display.refresh()
        roles["trainer"].update("finished", step=5)
        roles["rollout"].update("stopped")
        roles["scorer"].update("stopped")
    final_frame = console.export_text().split("dockyard run —")[-1]
    assert "step 5/5" in final_frame
    assert row(final_frame, "trainer-0").split("│")[2].strip() == "finished"
    assert row(final_frame, "rollout-w0").split("│")[2].strip() == "stopped"


def test_without_a_terminal_plain_summary_lines(tmp_path: Path) -> None:
    status_dir = tmp_path / "status"
    heartbeats(status_dir)
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=80)
    with ProgressDisplay(status_dir, max_steps=5, console=console) as display:
        display.refresh()
    [line] = out.getvalue().splitlines()
    assert "step 3/5 reward 0.25 val_acc 0.5 staleness 1.5" in line
    assert "rollout-w0:running scorer-s0:running trainer-0:running" in line
    assert "┃" not in out.getvalue()  # no table drawn


def test_the_end_of_run_summary_says_how_validation_accuracy_moved(tmp_path: Path) -> None:
    """Issue #42, item 6: the trainer's "validation accuracy A -> B" reached only its log."""
    status_dir = tmp_path / "status"
    roles = heartbeats(status_dir)
    display = ProgressDisplay(status_dir, max_steps=5)
    # Validated, but no first accuracy reported (the trainer sets both): nothing to compare.
    assert "validation accuracy" not in display.final_summary()
    roles["trainer"].update("finished", step=5, val_accuracy_start=0.475, val_accuracy=0.795)
    summary_line, validation = display.final_summary().splitlines()
    assert summary_line == display.summary()
    assert validation == "validation accuracy 0.475 → 0.795"


def test_a_run_without_validation_has_no_accuracy_in_its_summary(tmp_path: Path) -> None:
    StatusFile(tmp_path, "trainer", "0").update("finished", step=5)
    display = ProgressDisplay(tmp_path, max_steps=5)
    assert display.final_summary() == display.summary()


def test_a_role_s_problem_is_on_the_plain_line_and_in_the_starving_diagnosis(tmp_path: Path):
    # Issue #42, item 3: a run starving on a service that is down said only "starving: rollout
    # workers"; the worker's own word on why is shown beside its state.
    from dockyard.consumers.trainer.health import fleet_readiness
    from dockyard.fleet.progress import summary_line

    status_dir = tmp_path / "status"
    roles = heartbeats(status_dir)
    problem = "tool service unavailable: POST /desktops: ConnectError"
    roles["rollout"].update(detail=problem)
    line = summary_line(status_dir, started_at=time.time(), max_steps=5)
    assert f"rollout-w0:running ({problem})" in line
    assert "scorer-s0:running trainer-0:running" in line  # no detail, nothing added
    assert (
        f"ready but silent: rollout-w0 ({problem}), scorer-s0"
        in fleet_readiness(status_dir).describe()
    )


def _metrics(run_dir: Path, rewards: list[float]) -> None:
    lines = [
        json.dumps({"step": step, "metrics": {"train/reward_mean": reward}})
        for step, reward in enumerate(rewards, start=1)
    ]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_a_run_with_no_reward_at_any_step_is_pointed_at_the_oracle(tmp_path: Path) -> None:
    # Issue #42, item 7: "reward 0 at every step" could not tell a broken reward path from a
    # policy that has not learnt; the end of the run says how to tell.
    status_dir = tmp_path / "status"
    heartbeats(status_dir)
    files = RunFiles(tmp_path / "metrics.jsonl", tmp_path / "config.yaml")
    display = ProgressDisplay(status_dir, max_steps=3, run_files=files)
    _metrics(tmp_path, [0.0, 0.0, 0.0])
    last = display.final_summary().splitlines()[-1]
    assert last.startswith("reward 0 at every one of the 3 steps")
    assert f"dockyard oracle --config {tmp_path / 'config.yaml'}" in last
    _metrics(tmp_path, [0.0, 0.125, 0.0])  # one step earned something: nothing to say
    assert "dockyard oracle" not in display.final_summary()
