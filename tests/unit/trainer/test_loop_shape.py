"""The trainer loop's shape (issue #19, "trainer loop in rooms"): each room a module readable in
one sitting, the loop a short orchestration whose collaborators all exist once it is built (no
late ``_build``, no attribute first set by a method), and the dispatcher seen only through what
``PromptSource`` declares."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRAINER = Path(__file__).resolve().parents[3] / "dockyard" / "consumers" / "trainer"
ROOMS = [
    "intake.py",
    "dead_letter_watch.py",
    "starvation.py",
    "step.py",
    "weight_publisher.py",
    "validation.py",
    "checkpointing.py",
    "build.py",
    "progress.py",
    "role.py",
]
#: "Readable in one sitting" (the issue), as a number the brief gave: about 250 lines a room.
ROOM_LINES = 250
LOOP_LINES = 300


def tree(name: str) -> ast.Module:
    return ast.parse((TRAINER / name).read_text())


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_is_short(room: str) -> None:
    lines = len((TRAINER / room).read_text().splitlines())
    assert lines <= ROOM_LINES, f"{room}: {lines} lines"


def test_the_loop_is_a_short_orchestration() -> None:
    lines = len((TRAINER / "loop.py").read_text().splitlines())
    assert lines <= LOOP_LINES, f"loop.py: {lines} lines"


def attributes_set_outside_init(module: ast.Module, class_name: str) -> set[str]:
    """``self.X = ...`` (or ``self.X: T = ...``) in any method but ``__init__``."""
    cls = next(
        node for node in module.body if isinstance(node, ast.ClassDef) and node.name == class_name
    )
    found: set[str] = set()
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if method.name == "__init__":
            continue
        for node in ast.walk(method):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign | ast.AugAssign)
                else []
            )
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    found.add(target.attr)
    return found


def test_the_loop_builds_every_collaborator_in_init() -> None:
    module = tree("loop.py")
    methods = {
        node.name
        for cls in module.body
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert "_build" not in methods
    assert attributes_set_outside_init(module, "TrainerLoop") == set()


def test_the_rooms_read_the_dispatcher_only_through_prompt_source() -> None:
    # What any trainer module calls or reads on the prompt source is declared by the protocol.
    protocol = tree("prompt_source.py")
    source = next(
        node
        for node in protocol.body
        if isinstance(node, ast.ClassDef) and node.name == "PromptSource"
    )
    declared = {
        node.name
        for node in source.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    used: set[str] = set()
    for path in TRAINER.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in {"prompt_source", "dispatcher"}
            ):
                used.add(node.attr)
    assert used and used <= declared, used - declared
