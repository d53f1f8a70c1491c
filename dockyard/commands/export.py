"""``dockyard export hf|gguf|check-gguf``: release a trained model in the ecosystem's formats."""

from __future__ import annotations

import argparse
from pathlib import Path

from dockyard.commands._cli import CliError, CommandRegistrar, add_subcommands

EXIT_EXPORT_FAILED = 3
_SIZE_UNITS = {"K": 1000, "M": 1000**2, "G": 1000**3}


def _parse_size(text: str) -> int:
    unit = _SIZE_UNITS.get(text[-1:].upper())
    try:
        return int(float(text[:-1]) * unit) if unit else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 500M or 2G, got {text!r}") from None


def _export_hf(args: argparse.Namespace) -> int:
    import torch

    from dockyard.checkpoints.model_files import CheckpointError, convert_dcp_to_hf

    dtype = getattr(torch, args.dtype) if args.dtype else None
    try:
        out = convert_dcp_to_hf(
            args.checkpoint, args.out, dtype=dtype, max_shard_bytes=args.max_shard_size
        )
    except (CheckpointError, FileNotFoundError) as error:
        raise CliError(f"export hf: {error}", exit_code=EXIT_EXPORT_FAILED) from None
    print(out)
    return 0


def _export_gguf(args: argparse.Namespace) -> int:
    from dockyard.export.gguf_build import (
        GgufExportError,
        convert_hf_to_gguf,
        export_gguf_variants,
    )

    out = Path(args.out)
    types = args.type or ["F16"]
    try:
        if out.suffix == ".gguf":
            if len(types) != 1:
                raise CliError("--out NAME.gguf takes one --type; give a directory for several")
            paths = [
                convert_hf_to_gguf(args.model, out, types[0], llama_cpp_dir=args.llama_cpp_dir)
            ]
        else:
            variants = export_gguf_variants(
                args.model, out, types, basename=args.basename, llama_cpp_dir=args.llama_cpp_dir
            )
            paths = list(variants.values())
    except GgufExportError as error:
        raise CliError(f"export gguf: {error}", exit_code=EXIT_EXPORT_FAILED) from None
    for path in paths:
        print(path)
    return 0


def _check_gguf(args: argparse.Namespace) -> int:
    from dockyard.export.gguf_build import GgufExportError, validate_gguf

    try:
        report = validate_gguf(args.path)
    except GgufExportError as error:
        raise CliError(f"check-gguf: {error}", exit_code=EXIT_EXPORT_FAILED) from None
    types = sorted(set(report.tensor_types.values()))
    print(
        f"ok: {report.path} architecture={report.architecture} blocks={report.block_count} "
        f"tensors={len(report.tensor_types)} types={','.join(types)}"
    )
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add("export", help="Export a checkpoint as a Hugging Face dir or GGUF")
    commands = add_subcommands(parser, dest="export_command")

    hf = commands.add("hf", help="Convert a trainer checkpoint (DCP or safetensors) to an HF dir")
    hf.add_argument("--checkpoint", required=True, help="checkpoint directory")
    hf.add_argument("--out", required=True, help="output Hugging Face directory")
    hf.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="cast weights")
    hf.add_argument("--max-shard-size", type=_parse_size, help="shard above this size (e.g. 5G)")
    hf.set_defaults(handler=_export_hf)

    gguf = commands.add("gguf", help="Write GGUF build(s) of a Hugging Face model directory")
    gguf.add_argument("--model", required=True, help="Hugging Face model directory")
    gguf.add_argument("--out", required=True, help="a .gguf file (one type) or a directory")
    gguf.add_argument(
        "--type",
        action="append",
        default=None,
        help="F32, F16, BF16, Q8_0, Q4_0, Q4_K_M, ... (repeatable; default F16)",
    )
    gguf.add_argument(
        "--basename", help="file name prefix in a directory (default: model dir name)"
    )
    gguf.add_argument(
        "--llama-cpp-dir",
        help="llama.cpp checkout to shell out to (default: DOCKYARD_LLAMA_CPP_DIR)",
    )
    gguf.set_defaults(handler=_export_gguf)

    check = commands.add("check-gguf", help="Validate a GGUF file (architecture, tensors, finite)")
    check.add_argument("path", help="GGUF file")
    check.set_defaults(handler=_check_gguf)
