"""The GPU check's measurements and its report (scripts/gpu_check.sh runs this; see there).

    python benchmarks/gpu_check.py measure --results DIR [--only trainer,patches,...] [--dry-run]
    python benchmarks/gpu_check.py report --results DIR --out FILE [--dry-run]

``measure`` runs the named measurements in this one process (the dry run pays the imports
once); a measurement that fails is recorded as a ``failed`` row with its error and the next one
still runs, so that a few minutes on a GPU machine give every figure they can. The exit status
is 1 if any failed.
"""

from __future__ import annotations

import argparse
import traceback
from pathlib import Path

MEASUREMENTS = ("trainer", "patches", "quickstart", "tests")


def measure(results: Path, only: list[str], dry_run: bool) -> int:
    import importlib

    from gpu_check_common import write_row

    failed = 0
    for name in only:
        try:
            # Imported when run: the tests step alone needs neither torch nor transformers here.
            module = importlib.import_module(f"gpu_check_{name}")
            if name in ("trainer", "patches"):
                from gpu_check_common import device

                module.run(results, device(dry_run), dry_run)
            else:
                module.run(results, dry_run)
        except Exception as error:  # one measurement's failure must not cost the others
            traceback.print_exc()
            write_row(results, "failed", step=name, error=f"{type(error).__name__}: {error}")
            failed += 1
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("measure")
    run.add_argument("--results", type=Path, required=True)
    run.add_argument("--only", default=",".join(MEASUREMENTS))
    run.add_argument("--dry-run", action="store_true")
    report = sub.add_parser("report")
    report.add_argument("--results", type=Path, required=True)
    report.add_argument("--out", type=Path, required=True)
    report.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if args.command == "measure":
        only = [name for name in args.only.split(",") if name]
        unknown = set(only) - set(MEASUREMENTS)
        if unknown:
            parser.error(f"unknown measurements: {sorted(unknown)} (known: {MEASUREMENTS})")
        return measure(args.results, only, args.dry_run)
    from gpu_check_report import write_report

    return write_report(args.results, args.out, args.dry_run)


if __name__ == "__main__":
    raise SystemExit(main())
