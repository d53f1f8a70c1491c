"""``run.tracing``: off by default; an exporter without what it needs, or a setting for another
exporter, is refused at launch with its key path (docs/operations.md, "Traces")."""

from __future__ import annotations

from pathlib import Path

import pytest

from dockyard.config.errors import ConfigError
from dockyard.config.loader import load_config

QUICKSTART = Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml"


def test_tracing_is_off_by_default() -> None:
    assert load_config(QUICKSTART, []).run.tracing.exporter == "off"


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["run.tracing.exporter=file"], r"run\.tracing\.directory"),
        (["run.tracing.directory=/tmp/spans"], r"run\.tracing\.directory"),
        (["run.tracing.exporter=file", "run.tracing.directory=d", "run.tracing.endpoint=x"],
         r"run\.tracing\.endpoint"),
        (["run.tracing.exporter=jaeger"], r"run\.tracing\.exporter"),
    ],
)  # fmt: skip
def test_a_tracing_setting_that_cannot_take_effect_is_refused(
    overrides: list[str], key: str
) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(QUICKSTART, overrides)


def test_each_exporter_takes_its_own_setting() -> None:
    to_file = ["run.tracing.exporter=file", "run.tracing.directory=spans"]
    assert load_config(QUICKSTART, to_file).run.tracing.directory == "spans"
    otlp = ["run.tracing.exporter=otlp", "run.tracing.endpoint=http://collector:4318/v1/traces"]
    assert load_config(QUICKSTART, otlp).run.tracing.endpoint.startswith("http://collector")
