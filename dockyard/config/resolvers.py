"""Custom OmegaConf resolvers usable in any config: ``${mul:a,b}``, ``add``, ``sub``, ``div``,
``floordiv``, ``max``, ``min``.

``register_omegaconf_resolvers()`` is idempotent: calling it again replaces nothing and raises
nothing, so every entry point may call it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from functools import reduce

from omegaconf import OmegaConf

Number = int | float


def _variadic(op: Callable[[Number, Number], Number]) -> Callable[..., Number]:
    def resolver(*values: Number) -> Number:
        if len(values) < 2:
            raise ValueError(f"needs at least two arguments, got {len(values)}")
        return reduce(op, values)

    return resolver


def _div(numerator: Number, denominator: Number) -> Number:
    result = numerator / denominator
    # Keep integers integral so ${div:${a},2} can still feed an int field.
    return int(result) if float(result).is_integer() else result


RESOLVERS: dict[str, Callable[..., Number]] = {
    "mul": _variadic(operator.mul),
    "add": _variadic(operator.add),
    "sub": _variadic(operator.sub),
    "div": _div,
    "floordiv": lambda a, b: math.floor(a / b),
    "max": lambda *values: max(values),
    "min": lambda *values: min(values),
}


def register_omegaconf_resolvers() -> None:
    for name, function in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)
