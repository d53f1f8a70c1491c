"""The HTTP services a run's config names, and whether each answers from this machine.

A run whose scorer or rollout workers depend on a service that is not there cannot make
progress: the osworld desktops, the SWE sandboxes, the gdpval judge, a teacher's server, the
generation servers. ``dockyard run`` asks each before any role starts and refuses with the key
path of every one that does not answer; ``dockyard config validate`` says the same as a warning
(the services of a config validated on a laptop may live on the cluster). A service answers when
its host accepts a connection on its port: what it then says (a 401, a TLS handshake that needs
the scorer's client certificate) is the roles' business.
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from dockyard.algorithms.grpo import MasterConfig

#: How long a service may take to answer at launch (a local one answers in milliseconds).
ANSWER_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class NamedService:
    key: str
    url: str


@dataclass(frozen=True)
class Unanswered:
    service: NamedService
    reason: str

    def describe(self) -> str:
        return f"{self.service.key}: {self.service.url} does not answer ({self.reason})"


def named_services(config: MasterConfig) -> list[NamedService]:
    """Every service URL this run's roles use (an environment's only when a dataset of the run
    is scored by it)."""
    from dockyard.commands._roles import _data_environments

    environments = set(_data_environments(config).values())
    env = config.env
    services: list[NamedService] = []
    if "osworld" in environments and env.osworld.simulator_url:
        services.append(NamedService("env.osworld.simulator_url", env.osworld.simulator_url))
    if "swe" in environments:
        services += [
            NamedService(f"env.swe.sandbox_urls.{index}", url)
            for index, url in enumerate(env.swe.sandbox_urls)
        ]
    if "gdpval" in environments and env.gdpval.judge.base_url:
        services.append(NamedService("env.gdpval.judge.base_url", env.gdpval.judge.base_url))
    distillation = config.on_policy_distillation
    if distillation.enabled:
        services += [
            NamedService(f"on_policy_distillation.teachers.{alias}.base_url", teacher.base_url)
            for alias, teacher in distillation.teachers.items()
            if teacher.base_url
        ]
    generation = config.policy.generation
    if generation.backend == "vllm" and generation.vllm_cfg.mode == "server":
        services += [
            NamedService(f"policy.generation.vllm_cfg.server_urls.{index}", url)
            for index, url in enumerate(generation.vllm_cfg.server_urls)
        ]
    if generation.backend == "sglang":
        services += [
            NamedService(f"policy.generation.sglang_cfg.server_urls.{index}", url)
            for index, url in enumerate(generation.sglang_cfg.server_urls)
        ]
    return services


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


async def _ask(service: NamedService, timeout_s: float) -> Unanswered | None:
    host, port = _address(service.url)
    if not host:
        return Unanswered(service, "the URL names no host")
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return Unanswered(service, f"no connection within {timeout_s:g} s")
    except socket.gaierror as error:
        return Unanswered(service, f"cannot resolve {host}: {error.strerror}")
    except OSError as error:
        # asyncio's own text names the address again; the errno's says what happened.
        reason = os.strerror(error.errno) if error.errno else str(error) or type(error).__name__
        return Unanswered(service, reason)
    writer.close()
    await writer.wait_closed()
    return None


async def _unanswered(services: list[NamedService], timeout_s: float) -> list[Unanswered]:
    answers = await asyncio.gather(*(_ask(service, timeout_s) for service in services))
    return [answer for answer in answers if answer is not None]


def unanswered_services(
    config: MasterConfig, timeout_s: float = ANSWER_TIMEOUT_S
) -> list[Unanswered]:
    """The services of ``config`` that do not answer from here, all asked at once."""
    services = named_services(config)
    return asyncio.run(_unanswered(services, timeout_s)) if services else []


def refuse_unanswered_services(config: MasterConfig) -> None:
    """``dockyard run``: every service the run needs answers, or none of its roles starts."""
    from dockyard.commands._cli import CliError
    from dockyard.commands._common import EXIT_INVALID_CONFIG

    missing = unanswered_services(config)
    if missing:
        lines = "\n".join(f"  {m.describe()}" for m in missing)
        raise CliError(
            f"the run needs services that do not answer from this machine; start them (or fix "
            f"the URLs) and run again:\n{lines}",
            exit_code=EXIT_INVALID_CONFIG,
        )
