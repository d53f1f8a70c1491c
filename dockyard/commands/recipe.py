"""``dockyard recipe v4 --config RECIPE.yaml [--dir DIR]``: run a chain of stages (see
:mod:`dockyard.fleet.recipe`), skipping the stages that already finished."""

from __future__ import annotations

import argparse

from dockyard.commands._cli import CliError, CommandRegistrar, add_subcommands
from dockyard.commands._common import EXIT_INVALID_CONFIG


def _v4(args: argparse.Namespace) -> int:
    from dockyard.fleet.recipe import RecipeError, plan_recipe, run_recipe

    try:
        stages = plan_recipe(args.config, args.dir)
    except RecipeError as error:
        raise CliError(f"recipe: {error}", exit_code=EXIT_INVALID_CONFIG) from None
    try:
        models = run_recipe(stages)
    except RecipeError as error:
        raise CliError(f"recipe: {error}") from None
    for name, model in models.items():
        print(f"{name}: {model}")
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add("recipe", help="Run a multi-stage recipe, one run per stage")
    commands = add_subcommands(parser, dest="recipe_command")
    v4 = commands.add(
        "v4",
        help="Per-domain SFT and GRPO specialists, then multi-teacher on-policy distillation: "
        "the stages a recipe file lists, in order; finished stages are not re-run",
    )
    v4.add_argument("--config", required=True, metavar="PATH", help="recipe YAML file")
    v4.add_argument(
        "--dir", default=None, help="recipe directory (default: <recipe.output_dir>/<name>)"
    )
    v4.set_defaults(handler=_v4)
