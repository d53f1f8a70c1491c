"""Loading a run's config: ``YAML ─▶ OmegaConf ─▶ overrides ─▶ resolve ${...} ─▶ MasterConfig``.

Every failure on the way (missing file, YAML syntax, a bad override, a failed interpolation, a
schema or rule violation) becomes one :class:`ConfigError` that lists each problem with its key
path, so a launch fails before any model or server starts.

YAML inheritance: a file may name parent files under ``defaults:`` (paths relative to the file,
a string or a list). Parents merge first, in order; the child wins; lists are replaced, not
concatenated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import TypeAdapter, ValidationError

from dockyard.config.base import RULES_ERROR_TYPE
from dockyard.config.errors import ConfigError, ConfigIssue
from dockyard.config.master import MasterConfig, RegisteredNames
from dockyard.config.overrides import apply_overrides
from dockyard.config.resolvers import register_omegaconf_resolvers
from dockyard.config.schema import UnknownKey, find_unknown_keys
from dockyard.utils.logging import get_logger

DEFAULTS_KEY = "defaults"
TOP_LEVEL_SCHEMA = MasterConfig
#: Stricter than inside a section, where every key is the schema's: a top-level extra may be a
#: real section of its own that shares letters with one of ours (``repos`` and ``grpo`` score
#: 0.67), while one-letter slips of a section's name (``grpoo``, ``gpro``) score 0.75 or more.
SECTION_NEAR_MISS_CUTOFF = 0.75

log = get_logger(__name__)


@dataclass
class ConfigReport:
    """A loaded config plus what the loader noticed on the way."""

    config: MasterConfig
    warnings: list[UnknownKey] = field(default_factory=list)


def _load_yaml(path: Path, chain: tuple[Path, ...]) -> DictConfig:
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise ConfigError(f"defaults form a cycle: {cycle}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        node = OmegaConf.load(path)
    except yaml.YAMLError as error:
        reason = " ".join(str(error).split())
        raise ConfigError(f"YAML syntax error in {path}: {reason}") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    parents = node.pop(DEFAULTS_KEY, None)
    if parents is None:
        return node
    if isinstance(parents, str):
        parents = [parents]
    if not all(isinstance(parent, str) for parent in parents):
        raise ConfigError(
            [ConfigIssue(DEFAULTS_KEY, f"{path}: must be a file path or a list of file paths")]
        )
    merged = [_load_yaml((path.parent / parent).resolve(), (*chain, path)) for parent in parents]
    result = OmegaConf.merge(*merged, node)
    assert isinstance(result, DictConfig)
    return result


def load_yaml_tree(path: str | Path) -> DictConfig:
    """The merged (but not yet overridden or resolved) tree of a config file and its parents."""
    return _load_yaml(Path(path).resolve(), ())


def resolve_tree(cfg: DictConfig) -> dict[str, object]:
    register_omegaconf_resolvers()
    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", "") or ""
        reason = str(error).splitlines()[0]
        raise ConfigError([ConfigIssue(str(key), f"cannot resolve: {reason}")]) from None
    assert isinstance(container, dict)
    return {str(k): v for k, v in container.items()}


def _describe_input(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validation_issues(error: ValidationError) -> list[ConfigIssue]:
    """Flatten a pydantic error into key-path issues (section rules included)."""
    issues: list[ConfigIssue] = []
    for detail in error.errors():
        location = ".".join(str(part) for part in detail["loc"])
        if detail["type"] == RULES_ERROR_TYPE:
            for issue in detail["ctx"]["issues"]:
                path = (
                    f"{location}.{issue.path}"
                    if location and issue.path
                    else location or issue.path
                )
                issues.append(ConfigIssue(path, issue.message))
        elif detail["type"] == "missing":
            issues.append(ConfigIssue(location, "required key is missing"))
        else:
            got = _describe_input(detail.get("input"))
            issues.append(ConfigIssue(location, f"{detail['msg']} (got {got})"))
    return issues


def validate_container(
    container: dict[str, object], *, registered: RegisteredNames | None = None
) -> ConfigReport:
    """``registered``: the names other packages register for keys that select an implementation
    (``dockyard.algorithms.grpo.registered_names()``); a name outside them is refused. Without
    it that check is left to the code that builds the implementation, which refuses the same
    name with the same message (``dockyard.algorithms.advantages.estimator_class``)."""
    # Extra top-level keys are allowed (the spec), and silent unless one is a near miss of a
    # section's name (``grpoo``): that is a typo, warned about as one inside a section is.
    warnings = [
        unknown
        for unknown in find_unknown_keys(
            TOP_LEVEL_SCHEMA, container, cutoff=SECTION_NEAR_MISS_CUTOFF
        )
        if "." in unknown.path or unknown.suggestion is not None
    ]
    try:
        config = MasterConfig.model_validate(container)
    except ValidationError as error:
        issues = validation_issues(error)
        failed_sections = {str(detail["loc"][0]) for detail in error.errors() if detail["loc"]}
        issues += _cross_section_issues_of_valid_sections(container, failed_sections, registered)
        raise ConfigError(issues) from None
    if registered is not None and (issues := config.registered_name_issues(registered)):
        raise ConfigError(issues)
    return ConfigReport(config=config, warnings=warnings)


def _cross_section_issues_of_valid_sections(
    container: dict[str, object],
    failed_sections: set[str],
    registered: RegisteredNames | None,
) -> list[ConfigIssue]:
    """Run the cross-section rules that touch only valid sections, so one launch reports every
    problem instead of revealing them one run at a time."""
    if not failed_sections:
        return []  # the failure came from the cross-section rules themselves
    valid: dict[str, Any] = {}  # each section's own model, by name
    for name, field_info in MasterConfig.model_fields.items():
        if name in failed_sections or (name not in container and field_info.is_required()):
            continue
        value = container.get(name, field_info.get_default(call_default_factory=True))
        valid[name] = TypeAdapter(field_info.annotation).validate_python(value)
    partial = MasterConfig.model_construct(**valid)
    issues: list[ConfigIssue] = []
    rules = partial.cross_section_rules()
    if registered is not None:
        rules.append(lambda: partial.registered_name_issues(registered))
    for rule in rules:
        try:
            issues += rule()
        except AttributeError:
            continue  # the rule reads a section that failed validation
    return issues


def load_config_report(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    registered: RegisteredNames | None = None,
) -> ConfigReport:
    """See :func:`validate_container` for ``registered``."""
    try:
        cfg = load_yaml_tree(path)
        apply_overrides(cfg, overrides, TOP_LEVEL_SCHEMA)
        container = resolve_tree(cfg)
        return validate_container(container, registered=registered)
    except ConfigError as error:
        raise ConfigError(error.issues, source=str(path)) from None


def load_config(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    registered: RegisteredNames | None = None,
) -> MasterConfig:
    """Load, override, resolve and validate a config; unknown typed keys are logged as warnings."""
    report = load_config_report(path, overrides, registered=registered)
    for unknown in report.warnings:
        log.warning("config.unknown_key", key=unknown.path, detail=str(unknown))
    return report.config
