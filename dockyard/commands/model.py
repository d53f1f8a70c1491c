"""``dockyard model init-tiny --out DIR [--arch qwen2|llama] [--corpus FILE ...]`` and
``dockyard model serve --model PATH``: a model's log-probs over the OpenAI completions API (a
teacher server of on-policy distillation; :mod:`dockyard.engines.completions_server`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dockyard.commands._cli import CliError, CommandRegistrar, add_subcommands


def _init_tiny(args: argparse.Namespace) -> int:
    import torch

    from dockyard.models.tiny import (
        TINY_RECIPES,
        TinyModelSpec,
        build_tiny_model,
        build_tiny_processor,
        build_tiny_recipe,
        save_policy,
    )
    from dockyard.models.tokenizers import DEFAULT_CORPUS, BpeStyle, train_bpe_tokenizer
    from dockyard.models.vision import VisionProcessor

    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise CliError(f"{out} exists and is not empty; pass --force to overwrite")
    processor: VisionProcessor | None = None
    if args.recipe is not None:
        if args.recipe not in TINY_RECIPES:
            raise CliError(f"unknown recipe {args.recipe!r}; known: {', '.join(TINY_RECIPES)}")
        model, tokenizer = build_tiny_recipe(args.recipe, torch.float32)
        processor = build_tiny_processor(args.recipe, tokenizer)
    else:
        corpus: list[str] = list(DEFAULT_CORPUS)
        for path in args.corpus or []:
            try:
                corpus.extend(Path(path).read_text(encoding="utf-8").splitlines())
            except (OSError, UnicodeDecodeError) as error:
                raise CliError(f"cannot read corpus file {path}: {error}") from None
        try:
            style: BpeStyle = "qwen2" if args.arch == "qwen2" else "gpt2"
            tokenizer = train_bpe_tokenizer(corpus, vocab_size=args.vocab_size, style=style)
            spec = TinyModelSpec(
                arch=args.arch,
                hidden_size=args.hidden_size,
                num_attention_heads=args.heads,
                num_key_value_heads=args.heads,
                num_hidden_layers=args.layers,
                intermediate_size=4 * args.hidden_size,
                seed=args.seed,
            )
        except ValueError as error:
            raise CliError(str(error)) from None
        model = build_tiny_model(spec, tokenizer)
    save_policy(model, tokenizer, out, processor=processor)
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"wrote {type(model).__name__} ({parameters:,} parameters, "
        f"vocabulary {len(tokenizer)}) to {out}"
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    from dockyard.engines.completions_server import ServedModel, serve
    from dockyard.models import load_policy

    if args.batch_size < 1:
        raise CliError(f"--batch-size must be at least 1, not {args.batch_size}")
    try:
        model, tokenizer = load_policy(args.model, args.precision)
    except (OSError, ValueError) as error:
        raise CliError(f"cannot load {args.model}: {error}") from None
    served = ServedModel(
        name=args.served_model_name or args.model,
        model=model.to(args.device).eval(),
        tokenizer=tokenizer,
        batch_size=args.batch_size,
        device=args.device,
    )

    def ready(url: str) -> None:
        # The one line on stdout: whoever started the server reads its URL from it.
        print(url, flush=True)

    serve(served, host=args.host, port=args.port, on_ready=ready)
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add("model", help="Build or inspect policy models")
    commands = add_subcommands(parser, dest="model_command")
    init = commands.add(
        "init-tiny",
        help="Build a tiny random model and a BPE tokenizer trained in code (no download)",
    )
    init.add_argument("--out", required=True, metavar="DIR", help="output HF directory")
    init.add_argument("--arch", choices=["qwen2", "llama"], default="qwen2")
    init.add_argument(
        "--corpus",
        nargs="+",
        metavar="FILE",
        help="text files to train the tokenizer on (added to a small built-in corpus)",
    )
    init.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary bound")
    init.add_argument("--hidden-size", type=int, default=128)
    init.add_argument("--heads", type=int, default=4, help="head_dim must suit vLLM's CPU build")
    init.add_argument("--layers", type=int, default=2)
    init.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    init.add_argument(
        "--recipe",
        metavar="NAME",
        help="write a built-in tiny:// recipe instead (e.g. qwen2-arithmetic)",
    )
    init.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    init.set_defaults(handler=_init_tiny)
    serve = commands.add(
        "serve",
        help="Serve a model's log-probs over the OpenAI completions API (prompt_logprobs): an "
        "on-policy distillation teacher; prints its URL on stdout once listening",
    )
    serve.add_argument("--model", required=True, help="an HF directory or tiny://NAME")
    serve.add_argument(
        "--served-model-name", default=None, help="the name requests use (default: --model)"
    )
    serve.add_argument("--precision", default="float32", help="float32, bfloat16 or float16")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0: any free port (see the URL)")
    serve.add_argument("--batch-size", type=int, default=8, help="sequences per forward")
    serve.add_argument("--device", default="cpu")
    serve.set_defaults(handler=_serve)
