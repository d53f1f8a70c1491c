"""Guarded symbolic equivalence with sympy.

Model output is untrusted, and sympy is both an ``eval`` (``parse_expr``) and a computer algebra
system that will happily try to build ``10**10**10``. So, in order:

1. a small LaTeX-to-infix rewrite (``\\frac``, ``\\sqrt``, ``^``, ``\\cdot``, ``\\pi``),
2. a token whitelist (numbers, operators, single-letter variables, a few function names), so the
   string handed to ``parse_expr`` cannot name anything but those,
3. parsing with ``evaluate=False`` (nothing is computed while parsing),
4. a structural guard on the tree: size, literal length, and no tower of powers or exponentials
   (an exponent may not itself contain a power/exp, numeric exponents are bounded),
5. comparison by evaluating both sides at a few fixed points with 30-digit floats (``evalf``),
   which is bounded once the tree passed the guard, instead of ``simplify``, which is not.

Anything failing 1-4 is ``REFUSED`` or ``UNPARSED`` and counts as not equivalent.
"""

from __future__ import annotations

import enum
import re
from functools import lru_cache

import sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication_application,
    parse_expr,
    standard_transformations,
)

from dockyard.environments.latex_braces import balanced_group

_MAX_EXPRESSION_CHARS = 300
_MAX_TREE_NODES = 400
_MAX_LITERAL_DIGITS = 200
_MAX_NUMERIC_EXPONENT = 1000
_EVALUATION_DIGITS = 30
_SAMPLE_POINTS = (0.5772156649, 1.4142135623, 2.7182818284)

_FUNCTIONS = {
    "sqrt": sympy.sqrt,
    "log": sympy.log,
    "ln": sympy.log,
    "exp": sympy.exp,
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "abs": sympy.Abs,
}
_CONSTANTS = {"pi": sympy.pi, "oo": sympy.oo}
_SCIENTIFIC_LITERAL = re.compile(r"\d\.?[eE][-+]?\d")
_TRANSFORMATIONS = (*standard_transformations, implicit_multiplication_application, convert_xor)
_ALLOWED_TOKEN = re.compile(r"\s+|\d+(?:\.\d*)?|\.\d+|[A-Za-z]+|\*\*|[-+*/^(),]")


class SymbolicVerdict(enum.Enum):
    EQUAL = "equal"
    NOT_EQUAL = "not_equal"
    REFUSED = "refused"  # parsed, but too costly to evaluate safely
    UNPARSED = "unparsed"  # not an expression this checker understands


def _replace_command_groups(text: str, command: str, arity: int, render) -> str:
    """Rewrite ``\\command{a}{b}`` (balanced braces) with ``render(a, b)``; innermost first."""
    while True:
        start = text.rfind(command)
        if start < 0:
            return text
        cursor = start + len(command)
        arguments: list[str] = []
        for _ in range(arity):
            while cursor < len(text) and text[cursor] == " ":
                cursor += 1
            if cursor >= len(text) or text[cursor] != "{":
                return text  # malformed: leave it, the token whitelist will reject it
            content = balanced_group(text, cursor)
            if content is None:
                return text
            arguments.append(content)
            cursor += len(content) + 2
        text = text[:start] + render(*arguments) + text[cursor:]


def latex_to_infix(text: str) -> str:
    text = re.sub(r"\\sqrt\[([^\]]+)\]\{", r"\\nthroot{\1}{", text)
    text = _replace_command_groups(text, "\\frac", 2, lambda a, b: f"(({a})/({b}))")
    text = _replace_command_groups(text, "\\nthroot", 2, lambda n, a: f"(({a})**(1/({n})))")
    text = _replace_command_groups(text, "\\sqrt", 1, lambda a: f"sqrt({a})")
    replacements = {
        "\\cdot": "*",
        "\\times": "*",
        "\\div": "/",
        "\\pi": "pi",
        "\\infty": "oo",
        "\\ln": "log",
        "\\log": "log",
        "\\exp": "exp",
        "\\sin": "sin",
        "\\cos": "cos",
        "\\tan": "tan",
    }
    for latex, infix in replacements.items():
        text = text.replace(latex, f" {infix} ")
    return text.replace("{", "(").replace("}", ")").replace("[", "(").replace("]", ")")


def _whitelisted(text: str) -> bool:
    position = 0
    for match in _ALLOWED_TOKEN.finditer(text):
        if match.start() != position:
            return False
        token = match.group()
        if token.isalpha() and len(token) > 1 and token not in _FUNCTIONS | _CONSTANTS:
            return False
        position = match.end()
    return position == len(text)


@lru_cache(maxsize=1)
def _parser_namespace() -> dict[str, object]:
    """sympy's names (the code parse_expr builds calls Add, Pow, Integer...), no builtins.

    Only whitelisted identifiers reach parse_expr, so the input itself can name none of these
    beyond the functions above; the generated code needs the rest.
    """
    namespace: dict[str, object] = {}
    exec("from sympy import *", namespace)
    namespace["__builtins__"] = {}
    return namespace


@lru_cache(maxsize=4096)
def _parse(text: str) -> sympy.Expr | None:
    infix = latex_to_infix(text)
    if len(infix) > _MAX_EXPRESSION_CHARS or not _whitelisted(infix):
        return None
    if _SCIENTIFIC_LITERAL.search(infix):
        return None  # Python would read 1e999999999 as one float literal; numbers go via Fraction
    letters = {token for token in re.findall(r"[A-Za-z]+", infix) if len(token) == 1}
    local_names = {letter: sympy.Symbol(letter) for letter in letters}
    global_names = {**_parser_namespace(), **_FUNCTIONS, **_CONSTANTS}
    try:
        expression = parse_expr(
            infix,
            local_dict=local_names,
            global_dict=global_names,
            transformations=_TRANSFORMATIONS,
            evaluate=False,
        )
    except Exception:  # parse_expr raises nearly anything on odd input; all mean "unparsed"
        return None
    return expression if isinstance(expression, sympy.Expr) else None


_MAX_POWER_NESTING = 3


def _is_power_like(node: sympy.Basic) -> bool:
    return isinstance(node, sympy.Pow | sympy.exp)


def _safe_to_evaluate(expression: sympy.Basic, power_depth: int = 0) -> bool:
    """Bottom-up: children first, so evaluating a (numeric) exponent is itself already safe.

    ``10**10**10`` is refused at the outer power because its exponent evaluates to 1e10; a
    plain ``2**(1/2)`` (whose exponent contains the ``Pow(2, -1)`` of a division) passes.
    """
    if (
        isinstance(expression, sympy.Integer)
        and len(str(abs(int(expression)))) > _MAX_LITERAL_DIGITS
    ):
        return False
    power_like = _is_power_like(expression)
    depth = power_depth + int(power_like)
    if depth > _MAX_POWER_NESTING:
        return False
    if not all(_safe_to_evaluate(argument, depth) for argument in expression.args):
        return False
    if power_like:
        exponent = expression.args[-1] if isinstance(expression, sympy.Pow) else expression.args[0]
        if exponent.is_number:
            try:
                magnitude = abs(complex(exponent.evalf(15)))
            except (TypeError, ValueError, OverflowError):
                return False
            if not magnitude <= _MAX_NUMERIC_EXPONENT:  # also refuses nan
                return False
    return True


def _only_expressions(expression: sympy.Basic) -> bool:
    """Malformed input can parse to a tree holding non-expressions (``\\frac{}{}`` → ``()/()``,
    empty Tuples), which evalf cannot evaluate: not an answer this comparison can judge."""
    return all(isinstance(node, sympy.Expr) for node in sympy.preorder_traversal(expression))


def _small_enough(expression: sympy.Basic) -> bool:
    return sum(1 for _ in sympy.preorder_traversal(expression)) <= _MAX_TREE_NODES


def _value_at(expression: sympy.Expr, point: dict[sympy.Symbol, float]) -> complex | None:
    try:
        value = complex(expression.evalf(_EVALUATION_DIGITS, subs=point))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    if value != value or abs(value) == float("inf"):
        return None
    return value


def symbolically_equal(answer: str, truth: str, relative_tolerance: float) -> SymbolicVerdict:
    parsed_answer, parsed_truth = _parse(answer), _parse(truth)
    if parsed_answer is None or parsed_truth is None:
        return SymbolicVerdict.UNPARSED
    if not (_only_expressions(parsed_answer) and _only_expressions(parsed_truth)):
        return SymbolicVerdict.UNPARSED
    if not all(
        _small_enough(side) and _safe_to_evaluate(side) for side in (parsed_answer, parsed_truth)
    ):
        return SymbolicVerdict.REFUSED
    symbols = sorted(parsed_answer.free_symbols | parsed_truth.free_symbols, key=str)
    tolerance = max(relative_tolerance, 1e-12)
    compared = 0
    for shift, base in enumerate(_SAMPLE_POINTS):
        point = {
            symbol: base + 0.3183 * index * (shift + 1) for index, symbol in enumerate(symbols)
        }
        left, right = _value_at(parsed_answer, point), _value_at(parsed_truth, point)
        if left is None or right is None:
            continue
        compared += 1
        if abs(left - right) > tolerance * max(1.0, abs(left), abs(right)):
            return SymbolicVerdict.NOT_EQUAL
        if not symbols:
            break  # a constant: one evaluation decides
    return SymbolicVerdict.EQUAL if compared else SymbolicVerdict.NOT_EQUAL
