"""``calculator``: the demo's toolbox — one tool, ``calculator(expression)``, exact integer
arithmetic (``+ - * // %``, parentheses, unary minus) evaluated from the parsed syntax tree,
never with ``eval``."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

from dockyard.environments.tools.toolbox import (
    NO_TASK,
    ToolArgumentError,
    Toolbox,
    ToolSession,
    register_toolbox,
)

_BINARY: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
#: Bounds the work one call can ask for (``9**9**9`` is not even expressible: no ``**``).
MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 10**30


def evaluate(expression: str) -> int:
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolArgumentError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolArgumentError(f"not an expression: {expression[:40]!r}") from None
    return _value(tree.body)


def _value(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        result = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        result = -_value(node.operand)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if right == 0 and isinstance(node.op, ast.FloorDiv | ast.Mod):
            raise ToolArgumentError("division by zero")
        result = _BINARY[type(node.op)](left, right)
    else:
        raise ToolArgumentError(f"unsupported syntax: {type(node).__name__}")
    if abs(result) > MAX_MAGNITUDE:
        raise ToolArgumentError("result too large")
    return result


CALCULATOR_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate integer arithmetic exactly: + - * // %, parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}


class CalculatorSession(ToolSession):
    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset({"calculator"})

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise ToolArgumentError('needs {"expression": "<integer arithmetic>"}')
        return str(evaluate(expression))


@register_toolbox
class CalculatorToolbox(Toolbox):
    name = "calculator"

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        return [CALCULATOR_SCHEMA]

    async def open_session(self, episode_id: str, task: Mapping[str, Any] = NO_TASK) -> ToolSession:
        return CalculatorSession()  # stateless: nothing of one episode can reach another


@register_toolbox
class ArithmeticToolbox(CalculatorToolbox):
    """The arithmetic environment's episodes call the calculator (configs/multiturn_tools.yaml)."""

    name = "arithmetic"
