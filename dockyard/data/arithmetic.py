"""The quickstart's verifiable task: ``a+b=`` → the decimal sum (``params.op: "*"``: ``a*b=`` →
the product, the multi-turn demo's task, which a tiny model answers with a calculator).

``params.demonstrate_tool: calculator``: each record demonstrates the episode that answers it
with the calculator toolbox (:mod:`dockyard.data.demonstrations`), for the warm start.

Operands are drawn from ``[low, high]``. The space of pairs is partitioned deterministically
(a hash of the pair) into a validation part and a training part, so held-out problems are never
trained on, whatever the seeds and sizes.
"""

from __future__ import annotations

import hashlib
import operator
import random
from dataclasses import dataclass

from dockyard.config.sections.data import DatasetConfig
from dockyard.data.base import DatasetError, PromptRecord, refuse_unknown_params, register_dataset
from dockyard.data.demonstrations import DemonstratedCall, demonstration_extra

VALIDATION_SPLITS = ("validation", "val", "test", "dev")
_OPERATIONS = {"+": operator.add, "*": operator.mul}
PARAMS = ("low", "high", "num_samples", "seed", "op", "demonstrate_tool")
#: The toolboxes whose calls a record can demonstrate.
DEMONSTRATED_TOOLS = ("calculator",)
HELD_OUT_PERCENT = 10


def is_held_out(a: int, b: int) -> bool:
    digest = hashlib.blake2b(f"{a}+{b}".encode(), digest_size=2).digest()
    return int.from_bytes(digest, "little") % 100 < HELD_OUT_PERCENT


@dataclass(frozen=True)
class ArithmeticDataset:
    name: str
    pairs: tuple[tuple[int, int], ...]
    env: str
    op: str = "+"
    demonstrate_tool: str | None = None

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> PromptRecord:
        a, b = self.pairs[index]
        expression, answer = f"{a}{self.op}{b}", str(_OPERATIONS[self.op](a, b))
        extra = {}
        if self.demonstrate_tool is not None:
            call = DemonstratedCall(self.demonstrate_tool, {"expression": expression}, answer)
            extra = demonstration_extra([call])
        return PromptRecord(
            index=index,
            prompt=f"{expression}=",
            ground_truth=answer,
            env=self.env,
            agent_name="arithmetic",
            extra=extra,
        )


def make_pairs(low: int, high: int, count: int, seed: int, held_out: bool) -> list[tuple[int, int]]:
    candidates = [
        (a, b)
        for a in range(low, high + 1)
        for b in range(low, high + 1)
        if is_held_out(a, b) == held_out
    ]
    if not candidates:
        raise ValueError(f"no {'held-out' if held_out else 'training'} pairs in [{low}, {high}]")
    rng = random.Random(seed)
    if held_out and count <= len(candidates):
        return rng.sample(candidates, count)  # distinct problems for evaluation
    return [rng.choice(candidates) for _ in range(count)]


@register_dataset("arithmetic")
def build_arithmetic(config: DatasetConfig, env: str) -> ArithmeticDataset:
    params = config.params
    refuse_unknown_params(config, PARAMS)
    low, high = int(params.get("low", 10)), int(params.get("high", 99))
    count = int(config.max_samples or params.get("num_samples", 10_000))
    op = str(params.get("op", "+"))
    if op not in _OPERATIONS:
        raise DatasetError(
            "params.op", f"arithmetic op must be one of {', '.join(_OPERATIONS)}, got {op!r}"
        )
    tool = params.get("demonstrate_tool")
    if tool is not None and tool not in DEMONSTRATED_TOOLS:
        raise DatasetError(
            "params.demonstrate_tool",
            f"arithmetic demonstrates {', '.join(DEMONSTRATED_TOOLS)}, not {tool!r}",
        )
    held_out = config.split in VALIDATION_SPLITS
    pairs = make_pairs(low, high, count, int(params.get("seed", 0)), held_out)
    return ArithmeticDataset(
        name=f"arithmetic/{config.split}",
        pairs=tuple(pairs),
        env=env,
        op=op,
        demonstrate_tool=None if tool is None else str(tool),
    )
