"""``dockyard oracle --config PATH [overrides]``: score the data's reference answers through the
run's own environments, to prove the reward path where a tiny policy earns nothing.

Each held-out record (``data.validation``, else ``data.train``; at most ``--limit``) is scored
once, its answer written by :mod:`dockyard.environments.oracle`, by the environment and the
settings (sandboxes, services) the run's scorer would use. Exit 0 when every environment gave
some reward, 1 when one gave none (its reward path is broken), 2 when it cannot be asked.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dockyard.commands._cli import CliError, CommandRegistrar, add_config_arguments
from dockyard.commands._common import EXIT_INVALID_CONFIG, load_role_config

if TYPE_CHECKING:
    from dockyard.algorithms.grpo import MasterConfig
    from dockyard.data.base import Dataset

DEFAULT_LIMIT = 20


@dataclass
class EnvironmentTally:
    rewards: list[float] = field(default_factory=list)
    first_miss: str | None = None

    def line(self, name: str) -> str:
        mean = sum(self.rewards) / len(self.rewards)
        miss = f"; first miss: {self.first_miss}" if self.first_miss else ""
        return f"{name}: {len(self.rewards)} reference answers, mean reward {mean:.3f}{miss}"


def _records(config: MasterConfig) -> tuple[str, Dataset]:
    from dockyard.commands._roles import build_datasets

    built = build_datasets(config)
    key = "data.validation" if "data.validation" in built else "data.train"
    return key, built[key]


async def _score(config: MasterConfig, dataset: Dataset, limit: int) -> dict[str, EnvironmentTally]:
    from dockyard.environments.base import EnvironmentContext, ScoringGroup
    from dockyard.environments.oracle import NoReference, reference_sample
    from dockyard.environments.registry import build_environment

    context = EnvironmentContext(env=config.env, distillation=config.on_policy_distillation)
    environments = {}
    tallies: dict[str, EnvironmentTally] = defaultdict(EnvironmentTally)
    try:
        for index in range(min(limit, len(dataset))):
            record = dataset[index]
            group = ScoringGroup(
                group_id=f"oracle-{record.index}",
                env_name=record.env,
                prompt_text=record.prompt,
                samples=[],
                ground_truth=record.ground_truth,
                extra=record.extra,
                agent_name=record.agent_name,
            )
            try:
                group = dataclasses.replace(group, samples=[reference_sample(group)])
            except NoReference as error:
                raise CliError(str(error), exit_code=EXIT_INVALID_CONFIG) from None
            if record.env not in environments:
                environments[record.env] = build_environment(record.env, context)
            score = (await environments[record.env].score(group)).samples[0]
            tally = tallies[record.env]
            tally.rewards.append(score.reward)
            if score.reward <= 0 and tally.first_miss is None:
                tally.first_miss = f"record {record.index}: {score.detail or 'reward 0'}"
    finally:
        for environment in environments.values():
            await environment.aclose()
    return tallies


def _run(args: argparse.Namespace) -> int:
    from dockyard.commands._services import refuse_unanswered_services

    config = load_role_config(args)
    refuse_unanswered_services(config)
    key, dataset = _records(config)
    tallies = asyncio.run(_score(config, dataset, args.limit))
    print(f"oracle: the reference answers of {key} through the run's environments")
    for name, tally in sorted(tallies.items()):
        print(f"  {tally.line(name)}")
    return 0 if all(any(r > 0 for r in t.rewards) for t in tallies.values()) else 1


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "oracle",
        help="Score the data's reference answers through the run's environments (proves the "
        "reward path where a tiny policy earns nothing)",
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"score at most this many records (default {DEFAULT_LIMIT})",
    )
    parser.set_defaults(handler=_run)
