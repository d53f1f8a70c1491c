"""The V4 recipe demo's acceptance numbers (issue #27): held-out accuracy of the two specialists
and of the consolidated student, each on both domains.

Runs ``dockyard recipe v4 --config configs/v4_recipe.yaml`` (or reads an existing recipe
directory with ``--recipe-dir``), then evaluates every stage's exported model greedily on the
two held-out sets (``digit_tasks`` validation split: 200 distinct held-out sums, and all 85
held-out three-digit reversals; standard errors ≈3.5 and ≈5 points) with the ``arithmetic``
scorer, through the evaluator the trainer validates with. The baseline, measured in the same
run, is each domain's specialist: the student's ratio to it says how much of it was kept.

    python benchmarks/bench_v4_recipe.py [--recipe-dir DIR] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from report import replace_section

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "v4_recipe.yaml"
MODELS = ("adder", "reverser", "student")
DOMAINS = {"add": "adder", "reverse": "reverser"}
# Every held-out reversal problem (85 three-digit numbers); 200 of the 810 held-out sums.
SAMPLES = {"add": 200, "reverse": 85}


def evaluate(model_dir: Path, task: str) -> float:
    from dockyard.config.sections.data import DatasetConfig
    from dockyard.consumers.trainer.evaluation import Evaluator
    from dockyard.data.catalog import build_dataset
    from dockyard.environments.registry import build_environment
    from dockyard.models import load_policy

    model, tokenizer = load_policy(str(model_dir))
    held_out = build_dataset(
        DatasetConfig(
            name="digit_tasks",
            split="validation",
            params={"tasks": task, "num_samples": SAMPLES[task], "seed": 2},
        ),
        "arithmetic",
    )
    evaluator = Evaluator(
        model, tokenizer, held_out, build_environment("arithmetic"), max_new_tokens=4
    )
    return asyncio.run(evaluator.evaluate()).accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe-dir", type=Path, default=None)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    recipe_dir = args.recipe_dir
    seconds = None
    if recipe_dir is None:
        recipe_dir = Path(tempfile.mkdtemp(prefix="v4-recipe-"))
        started = time.perf_counter()
        command = [sys.executable, "-m", "dockyard", "recipe", "v4", "--config", str(RECIPE)]
        subprocess.run([*command, "--dir", str(recipe_dir)], check=True, cwd=ROOT)
        seconds = time.perf_counter() - started
    accuracy = {
        (name, task): evaluate(
            Path(json.loads((recipe_dir / name / "stage_done.json").read_text())["model"]), task
        )
        for name in MODELS
        for task in DOMAINS
    }
    lines = [
        "| model | add (held-out) | reverse (held-out) |",
        "| --- | --- | --- |",
        *(
            f"| {name} | {accuracy[name, 'add']:.3f} | {accuracy[name, 'reverse']:.3f} |"
            for name in MODELS
        ),
        "",
        "Student / specialist on its domain: "
        + ", ".join(
            f"{task} {accuracy['student', task] / max(accuracy[expert, task], 1e-9):.2f}"
            for task, expert in DOMAINS.items()
        ),
    ]
    if seconds is not None:
        lines.append(f"Whole recipe (3 stages): {seconds:.0f} s wall clock.")
    print("\n".join(lines))
    if args.write_docs:
        replace_section(
            "v4-recipe",
            [
                "## V4 recipe demo: specialists and the consolidated student",
                "",
                f"`python benchmarks/bench_v4_recipe.py` ({date.today()}, 2 shared CPU cores; "
                "200 held-out sums and all 85 held-out reversals, greedy decoding; standard "
                "errors ≈3.5 and ≈5 points). `configs/v4_recipe.yaml`: an addition "
                "specialist and a digit-reversal specialist (SFT warm start + GRPO on their "
                "own domain), then a student consolidated from both by multi-teacher "
                "on-policy distillation, each sample scored by the specialist its agent "
                "name selects.",
                "",
                *lines,
            ],
        )


if __name__ == "__main__":
    main()
