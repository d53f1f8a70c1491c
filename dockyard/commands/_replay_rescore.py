"""``dockyard replay rescore`` and ``replay diff``: "what would the reward have been with the
fixed verifier", asked of the stored experience.

    dockyard replay rescore --subject rollouts --env NAME [--from-seq N | --since TIME]
                            [--limit K] --to-subject NAME --config PATH [overrides]
    dockyard replay diff    --subject A --against B [--all-groups] [--json] (...)

``rescore`` builds ``--env`` from the config's ``env.<NAME>`` settings (overrides included:
``env.math.symbolic_equivalence=false``) and the tokenizer from ``policy``, and writes the new
scored rollouts to ``NS.rescored.<NAME>`` in the experience stream, which no role reads.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from dockyard.commands._cli import CliError, CommandRegistrar
from dockyard.commands._plane_args import EXIT_INVALID_CONFIG, add_plane_arguments, master_config

if TYPE_CHECKING:  # imported lazily at run time
    from dockyard.broker.admin import AdminPlane
    from dockyard.broker.names import PlaneNames
    from dockyard.broker.reward_diff import RewardDiff
    from dockyard.config.sections.data_plane import DataPlaneConfig

OpenPlane = Callable[[argparse.Namespace], Any]
RunSync = Callable[[Coroutine[Any, Any, Any]], Any]
Selection = Callable[[argparse.Namespace, Any], Any]

#: Re-scored messages are published in windows of this many (pipelined by the plane).
PUBLISH_BATCH = 64


def _rescore(
    args: argparse.Namespace, open_plane: OpenPlane, run_sync: RunSync, selection: Selection
) -> int:
    from dockyard.broker.names import PlaneNames
    from dockyard.consumers.rescore import (
        RescoreRefusal,
        RescoreTargetError,
        rescore_each,
        rescore_target,
        rescored_outgoing,
    )
    from dockyard.environments.base import EnvironmentContext
    from dockyard.environments.registry import UnknownEnvironmentError, build_environment
    from dockyard.models import load_tokenizer

    if not args.config:
        raise CliError(
            "replay rescore needs --config: the environment's settings (env.<NAME>) and the "
            "tokenizer (policy) come from it",
            EXIT_INVALID_CONFIG,
        )
    config = master_config(args)
    names = PlaneNames((config.data_plane or _default_plane()).namespace)
    try:
        target = rescore_target(names, args.to_subject)
        environment = build_environment(
            args.env,
            EnvironmentContext(env=config.env, distillation=config.on_policy_distillation),
        )
    except (RescoreTargetError, UnknownEnvironmentError) as error:
        raise CliError(str(error), EXIT_INVALID_CONFIG) from None
    tokenizer = load_tokenizer(config.policy.model_name, config.policy.tokenizer.name)
    refused: list[RescoreRefusal] = []

    async def run() -> int:
        written = 0
        async with open_plane(args) as plane:
            await _check_stream_holds(plane, target)
            if await plane.latest(target) is not None:
                raise CliError(
                    f"--to-subject {target} already holds messages: give a new name, so that "
                    "one subject holds one re-score",
                    EXIT_INVALID_CONFIG,
                )
            subject, chosen = selection(args, plane.names)
            if subject == target:
                raise CliError(f"--subject and --to-subject are both {target}")
            pending = []
            scorer_id = f"rescore:{args.env}"
            try:
                async for _, result in rescore_each(
                    plane.replay(subject, **chosen), environment, tokenizer, scorer_id=scorer_id
                ):
                    if isinstance(result, RescoreRefusal):
                        refused.append(result)
                        continue
                    pending.append(rescored_outgoing(result, target))
                    if len(pending) >= PUBLISH_BATCH:
                        written += len(await plane.publish_many(pending))
                        pending = []
                if pending:
                    written += len(await plane.publish_many(pending))
            finally:
                await environment.aclose()
        return written

    written = run_sync(run())
    print(f"re-scored {written} groups with {args.env} into {target}")
    for item in refused:
        print(f"not re-scored: seq {item.seq}: {item.reason}: {item.detail}", file=sys.stderr)
    if refused:
        print(f"{len(refused)} messages not re-scored", file=sys.stderr)
        return 1
    return 0


async def _check_stream_holds(plane: AdminPlane, target: str) -> None:
    """Refuse a plane provisioned before re-scores had a subject: publishing there would fail
    with the server's bare "no responders"."""
    names = plane.names
    experience = names.experience_stream.name
    for state in await plane.streams():
        if state.name == experience and names.rescored_wildcard in state.subjects:
            return
    raise CliError(
        f"stream {experience} has no subject {names.rescored_wildcard} for {target}: it was "
        "provisioned by an older dockyard; provision it again as the admin (e.g. start any "
        "role, or `dockyard broker up`, with this version) to add the subject in place",
        EXIT_INVALID_CONFIG,
    )


def _default_plane() -> DataPlaneConfig:
    from dockyard.config.sections.data_plane import DataPlaneConfig

    return DataPlaneConfig()


def _diff_subject(names: PlaneNames, name: str) -> str:
    """A short name, a bare re-score name (``NS.rescored.NAME``) or a full subject."""
    from dockyard.broker.inspect import resolve_subject

    subject = resolve_subject(names, name)
    return subject if "." in subject else names.rescored(subject)


def _diff(
    args: argparse.Namespace, open_plane: OpenPlane, run_sync: RunSync, selection: Selection
) -> int:
    from dockyard.broker.reward_diff import render, reward_diff

    async def run() -> RewardDiff:
        async with open_plane(args) as plane:
            subject, against = (
                _diff_subject(plane.names, name) for name in (args.subject, args.against)
            )
            new = [m async for m in plane.replay(subject)]
            old = [m async for m in plane.replay(against)]
            return reward_diff(subject, new, against, old)

    diff = run_sync(run())
    if args.json:
        print(json.dumps(diff.to_json(), indent=2))
    else:
        print(render(diff, all_groups=args.all_groups))
    # Something not compared is an incomplete answer: say so in the exit status too.
    return 1 if diff.unusable or diff.mismatched else 0


def register(
    commands: CommandRegistrar,
    *,
    open_plane: OpenPlane,
    run: RunSync,
    selection: Selection,
    add_selection: Callable[..., None],
) -> None:
    rescore = commands.add(
        "rescore", help="Score stored rollouts again with an environment, into NS.rescored.NAME"
    )
    add_selection(rescore, default_limit=None)
    rescore.add_argument("--env", required=True, help="environment name (its env.<NAME> config)")
    rescore.add_argument(
        "--to-subject",
        required=True,
        help="NAME (for NS.rescored.NAME) or a full subject under NS.rescored.>",
    )
    add_plane_arguments(rescore)
    rescore.set_defaults(
        handler=functools.partial(
            _rescore, open_plane=open_plane, run_sync=run, selection=selection
        )
    )

    diff = commands.add("diff", help="Reward changes of --subject against --against")
    diff.add_argument("--subject", required=True, help="subject or short name (the new rewards)")
    diff.add_argument("--against", required=True, help="subject or short name (the baseline)")
    diff.add_argument("--all-groups", action="store_true", help="list unchanged groups too")
    diff.add_argument("--json", action="store_true", help="the diff as one JSON document")
    add_plane_arguments(diff)
    diff.set_defaults(
        handler=functools.partial(_diff, open_plane=open_plane, run_sync=run, selection=selection)
    )
