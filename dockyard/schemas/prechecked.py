"""Decode-time validators that take the codec's prechecked arrays as they are.

When the codec's pre-pass (``precheck``) has resolved and checked every array of a message, the
array fields' Python validators have nothing left to do but return their input — yet pydantic
would still call them, five times per sample. The validator built here is the message's own
pydantic-core schema with each array validator replaced by an ``isinstance(np.ndarray)`` check
that runs inside pydantic-core: the same models, defaults, constraints and model validators,
and no Python call for the arrays of the models that have model validators (the samples).
Only the codec uses it, and only after a complete pre-pass (the pre-pass is the only thing that
puts ndarrays into decoded metadata; msgpack never does).

pydantic-core builds a nested model node that has no wrapper (no model validator) from the
class's own prebuilt validator, not from the copy edited here; so the arrays of such models
(a group's prompt ids, a score's teacher log-probs) still reach their Python validators. Those
return at once on prechecked input (``arrays._prechecked``): a call per message, or per scored
sample with teacher log-probs, not a second check.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import numpy as np
from pydantic_core import SchemaValidator

from dockyard.schemas.arrays import (
    validate_logprobs,
    validate_mask,
    validate_token_ids,
    validate_versions,
)
from dockyard.schemas.base import Message

_ARRAY_VALIDATORS = frozenset(
    {validate_token_ids, validate_logprobs, validate_versions, validate_mask}
)
_IS_ARRAY: dict[str, Any] = {"type": "is-instance", "cls": np.ndarray}


@cache
def prechecked_validator(cls: type[Message]) -> SchemaValidator:
    schema = copy.deepcopy(cls.__pydantic_core_schema__)
    if not _replace_array_validators(schema):
        return cls.__pydantic_validator__  # type: ignore[return-value]  # no arrays: the same
    return SchemaValidator(schema)  # type: ignore[arg-type]


def _replace_array_validators(node: Any) -> int:
    """Swap, in place, every array field validator under ``node``; how many were swapped."""
    count = 0
    if isinstance(node, dict):
        for key, value in node.items():
            if _is_array_validator(value):
                node[key] = dict(_IS_ARRAY)
                count += 1
            else:
                count += _replace_array_validators(value)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            if _is_array_validator(value):
                node[index] = dict(_IS_ARRAY)
                count += 1
            else:
                count += _replace_array_validators(value)
    return count


def _is_array_validator(node: Any) -> bool:
    if not isinstance(node, dict) or node.get("type") != "function-plain":
        return False
    function = node.get("function")
    return isinstance(function, dict) and function.get("function") in _ARRAY_VALIDATORS
