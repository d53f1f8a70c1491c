"""``dockyard status`` and the dashboard's roles (issue #42, item 6): a role whose last beat said
it stopped or finished has ended, it is not silent, and it is not shown in the alarm colour; a
running role that stopped beating still is."""

from __future__ import annotations

import io
import re
from typing import cast

from rich.console import Console

from dockyard.broker.heartbeats import HEARTBEAT_SCHEMA, Heartbeat
from dockyard.fleet.overview import FleetOverview, render_overview

NOW = 1000.0
RED = "\x1b[31m"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def beat(role: str, state: str, *, age_s: float) -> Heartbeat:
    return Heartbeat(
        schema=HEARTBEAT_SCHEMA,
        role=role,
        instance="0",
        host="h",
        pid=1,
        state=state,
        detail="",
        weight_version=None,
        received=0,
        published=0,
        refused=0,
        failures=0,
        received_per_s=None,
        interval_s=5.0,
        sent_at_unix_s=NOW - age_s,
        counters={},
    )


def overview() -> FleetOverview:
    # Each beat is 60 s old, twelve intervals: far past the three missed beats of "silent".
    beats = [
        beat("trainer", "finished", age_s=60.0),
        beat("scorer", "stopped", age_s=60.0),
        beat("rollout", "running", age_s=60.0),
    ]
    return FleetOverview("ns", NOW, list(beats), streams=[])


def table_lines() -> dict[str, str]:
    """Each role's row as the terminal gets it, colour codes included."""
    console = Console(
        record=True, width=160, file=io.StringIO(), force_terminal=True, color_system="standard"
    )
    console.print(render_overview(overview()))
    lines = console.export_text(styles=True).splitlines()
    return {
        role: next(line for line in lines if f" {role} " in ANSI.sub("", line)) for role in ROLES
    }


ROLES = ("trainer", "scorer", "rollout")


def test_a_role_that_said_it_ended_is_not_silent() -> None:
    listed = cast(list[dict[str, object]], overview().to_json()["roles"])
    roles = {r["role"]: r for r in listed}
    assert {role: roles[role]["silent"] for role in ROLES} == {
        "trainer": False,
        "scorer": False,
        "rollout": True,
    }


def test_the_table_shows_an_ended_role_as_ended_not_in_the_alarm_colour() -> None:
    lines = table_lines()
    for role, state in (("trainer", "finished"), ("scorer", "stopped")):
        text = ANSI.sub("", lines[role])
        assert state in text and "silent" not in text, text
        assert RED not in lines[role], lines[role]
    assert "silent (running)" in ANSI.sub("", lines["rollout"]) and RED in lines["rollout"]
