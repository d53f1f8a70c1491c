"""``digit_tasks``: two tiny domains over the quickstart's vocabulary, for the V4 recipe demo.

``params.tasks`` picks them: ``add`` (``a+b=`` → the sum, agent ``adder``), ``reverse``
(``n=`` → n's digits reversed, agent ``reverser``), or ``add+reverse`` (the two interleaved,
each record with its own agent: the consolidation stage's mixture). Held-out problems are
chosen by a hash of the problem (as in :mod:`dockyard.data.arithmetic`), so a specialist
trained on one split never sees the other split of its task, whatever the seeds and sizes.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from dockyard.config.sections.data import DatasetConfig
from dockyard.data.arithmetic import VALIDATION_SPLITS, is_held_out, make_pairs
from dockyard.data.base import DatasetError, PromptRecord, refuse_unknown_params, register_dataset

AGENTS = {"add": "adder", "reverse": "reverser"}


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    agent: str


@dataclass(frozen=True)
class DigitTasksDataset:
    name: str
    problems: tuple[Problem, ...]
    env: str

    def __len__(self) -> int:
        return len(self.problems)

    def __getitem__(self, index: int) -> PromptRecord:
        problem = self.problems[index]
        return PromptRecord(
            index=index,
            prompt=problem.prompt,
            ground_truth=problem.answer,
            env=self.env,
            agent_name=problem.agent,
        )


def reversal_problems(low: int, high: int, count: int, seed: int, held_out: bool) -> list[Problem]:
    """``n=`` → reversed digits, for n in [low, high] without a trailing zero (its reversal
    would start with 0, which an integer-valued answer cannot show)."""
    # The split reuses arithmetic's hash on (n, 0): a fixed, seed-free partition of the numbers.
    candidates = [n for n in range(low, high + 1) if n % 10 and is_held_out(n, 0) == held_out]
    if not candidates:
        raise DatasetError("params", f"no {'held-out' if held_out else 'training'} numbers")
    rng = random.Random(seed)
    if held_out and count <= len(candidates):
        numbers = rng.sample(candidates, count)
    else:
        numbers = [rng.choice(candidates) for _ in range(count)]
    return [Problem(f"{n}=", str(n)[::-1], AGENTS["reverse"]) for n in numbers]


PARAMS = ("tasks", "num_samples", "seed", "add_low", "add_high", "reverse_low", "reverse_high")


@register_dataset("digit_tasks")
def build_digit_tasks(config: DatasetConfig, env: str) -> DigitTasksDataset:
    params = config.params
    refuse_unknown_params(config, PARAMS)
    # "+" or ",": a comma would start a list in a command-line override.
    tasks = [task.strip() for task in re.split(r"[+,]", str(params.get("tasks", "add+reverse")))]
    unknown = [task for task in tasks if task not in AGENTS]
    if unknown or not tasks:
        raise DatasetError("params.tasks", f"unknown task(s) {unknown}; known: {', '.join(AGENTS)}")
    count = int(config.max_samples or params.get("num_samples", 10_000))
    seed = int(params.get("seed", 0))
    held_out = config.split in VALIDATION_SPLITS
    per_task = -(-count // len(tasks))  # ceil: interleaving then cuts to count
    streams = []
    for offset, task in enumerate(tasks):
        if task == "add":
            low, high = int(params.get("add_low", 10)), int(params.get("add_high", 99))
            pairs = make_pairs(low, high, per_task, seed + offset, held_out)
            streams.append([Problem(f"{a}+{b}=", str(a + b), AGENTS["add"]) for a, b in pairs])
        else:
            low, high = int(params.get("reverse_low", 100)), int(params.get("reverse_high", 999))
            streams.append(reversal_problems(low, high, per_task, seed + offset, held_out))
    problems = [problem for group in zip(*streams, strict=False) for problem in group][:count]
    return DigitTasksDataset(name=f"digit_tasks/{config.split}", problems=tuple(problems), env=env)
