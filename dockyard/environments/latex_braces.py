"""Brace groups in LaTeX answers, shared by answer extraction (``\\boxed{...}``) and the symbolic
checker (``\\frac{a}{b}``), each of which imports it; neither imports the other for it."""

from __future__ import annotations


def balanced_group(text: str, open_index: int, end: int | None = None) -> str | None:
    """The content of the brace group starting at ``text[open_index] == '{'``; None if it is not
    closed before ``end`` (default: the end of the text)."""
    depth = 0
    index = open_index
    stop = len(text) if end is None else end
    while index < stop:
        char = text[index]
        if char == "\\" and text[index + 1 : index + 2] in ("{", "}"):
            index += 2  # an escaped brace (``\\{``) is content, not structure
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : index]
        index += 1
    return None
