"""``dockyard config show|validate --config PATH [overrides...]``; ``dockyard config keys``."""

from __future__ import annotations

import argparse
import sys

import yaml

from dockyard.commands._cli import CommandRegistrar, add_config_arguments, add_subcommands
from dockyard.commands._common import load_config_report_or_exit


def _show(args: argparse.Namespace) -> int:
    report = load_config_report_or_exit(args)
    dumped = report.config.model_dump(mode="json", exclude_unset=args.only_set)
    sys.stdout.write(yaml.safe_dump(dumped, sort_keys=False, allow_unicode=True))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from dockyard.commands._roles import build_datasets
    from dockyard.commands._services import unanswered_services

    report = load_config_report_or_exit(args)
    # Every dataset file must exist and parse: found here, not by a trainer after its fleet
    # started. (Tokenizers, models and named datasets may live on another machine.)
    build_datasets(report.config, files_only=True)
    # A service may live where the run will, not here: said, not refused (`dockyard run`
    # refuses it).
    for missing in unanswered_services(report.config):
        print(f"warning: {missing.describe()}", file=sys.stderr)
    print("ok")
    return 0


def _keys(args: argparse.Namespace) -> int:
    from dockyard.algorithms.grpo import MasterConfig
    from dockyard.config.capabilities import key_table

    sys.stdout.write(key_table(MasterConfig))
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add("config", help="Show or validate a resolved config")
    commands = add_subcommands(parser, dest="config_command")

    show = commands.add("show", help="Print the resolved config as YAML (defaults included)")
    add_config_arguments(show)
    show.add_argument(
        "--only-set", action="store_true", help="omit keys left at their schema defaults"
    )
    show.set_defaults(handler=_show)

    validate = commands.add(
        "validate", help="Print 'ok', or every problem with its key path (exit status 2)"
    )
    add_config_arguments(validate)
    validate.set_defaults(handler=_validate)

    keys = commands.add(
        "keys",
        help="List every config key and what this build does with it: takes effect, is "
        "refused when set, or only warns",
    )
    keys.set_defaults(handler=_keys)
