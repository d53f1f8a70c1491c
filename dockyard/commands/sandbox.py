"""``dockyard sandbox serve``: the HTTP sandbox service the ``swe`` environment calls."""

from __future__ import annotations

import argparse
from pathlib import Path

from dockyard.commands._cli import CliError, CommandRegistrar, add_subcommands


def _serve(args: argparse.Namespace) -> int:
    from dockyard.config.sections.env import SandboxLimits
    from dockyard.environments.sandbox import SandboxUnavailableError
    from dockyard.environments.swe.auth import TokenError, read_token
    from dockyard.environments.swe.policy import PolicyError, load_policy
    from dockyard.environments.swe.service import SandboxHTTPServer, SWEJobRunner
    from dockyard.environments.swe.tls import TLSSetupError, server_context
    from dockyard.utils.logging import get_logger

    repos = Path(args.repos)
    if not repos.is_dir():
        raise CliError(f"--repos {repos} is not a directory")
    try:
        limits = SandboxLimits(
            cpu_time_s=args.cpu_time_s,
            wall_time_s=args.wall_time_s,
            memory_mb=args.memory_mb,
            max_output_bytes=args.max_output_bytes,
            max_processes=args.max_processes,
            python_executable=args.python,
        )
        token = read_token(args.token_file)
        if (args.tls_cert is None) != (args.tls_key is None):
            raise CliError("--tls-cert and --tls-key go together")
        if args.tls_client_ca is not None and args.tls_cert is None:
            raise CliError("--tls-client-ca needs --tls-cert and --tls-key")
        tls = (
            server_context(args.tls_cert, args.tls_key, args.tls_client_ca)
            if args.tls_cert is not None
            else None
        )
        policy = load_policy(Path(args.policy) if args.policy else None)
        runner = SWEJobRunner(repos, limits, policy)
        server = SandboxHTTPServer(
            (args.host, args.port),
            runner,
            args.max_jobs,
            token,
            tls=tls,
            allow_plaintext=args.allow_plaintext,
        )
    except (ValueError, TokenError, TLSSetupError, PolicyError, SandboxUnavailableError) as error:
        raise CliError(str(error)) from None
    except OSError as error:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {error}") from None
    # One line on stdout that launchers (and the tests) read to learn the bound port.
    print(f"listening on {server.url}", flush=True)
    get_logger(__name__).info(
        "sandbox service up",
        url=server.url,
        repos=runner.repositories(),
        python=runner.sandbox.python,
        token_required=token is not None,
        tls=tls is not None,
        client_certificates_required=args.tls_client_ca is not None,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add("sandbox", help="The sandbox service for SWE patch scoring")
    commands = add_subcommands(parser, dest="sandbox_command")
    serve = commands.add("serve", help="Serve POST /v1/jobs: apply a patch, run the tests")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8085, help="0 picks a free port")
    serve.add_argument("--repos", required=True, help="directory of repository snapshots")
    serve.add_argument("--max-jobs", type=int, default=2, help="jobs run at the same time")
    serve.add_argument("--cpu-time-s", type=float, default=120.0)
    serve.add_argument("--wall-time-s", type=float, default=600.0)
    serve.add_argument("--memory-mb", type=int, default=2048)
    serve.add_argument("--max-output-bytes", type=int, default=1_000_000)
    serve.add_argument("--max-processes", type=int, default=64)
    serve.add_argument("--python", default=None, help="interpreter the tests run under")
    serve.add_argument(
        "--policy",
        default=None,
        help="YAML scoring policy: framework, test paths, protected paths per repo "
        "(default: pytest, tests/, the built-in protected set)",
    )
    serve.add_argument(
        "--token-file",
        default=None,
        help="file (mode 0600) holding the bearer token clients must send; else "
        "$DOCKYARD_SANDBOX_TOKEN; required unless --host is a loopback address",
    )
    serve.add_argument("--tls-cert", default=None, help="PEM certificate (chain): serve HTTPS")
    serve.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert (mode 0600)")
    serve.add_argument(
        "--tls-client-ca",
        default=None,
        help="PEM CA that clients' certificates must chain to (mutual TLS); with it a token is "
        "optional beyond loopback",
    )
    serve.add_argument(
        "--allow-plaintext",
        action="store_true",
        help="listen beyond loopback over plain HTTP (a private network you trust); without it "
        "a non-loopback --host needs --tls-cert/--tls-key",
    )
    serve.set_defaults(handler=_serve)
