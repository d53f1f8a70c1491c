"""Reading an accessibility tree (OSWorld's ``/accessibility`` ``AT`` XML): the evaluator's
getter, its ``check_accessibility_tree`` metric, and the text observation an agent reads.

The tree comes from a controller, which this side does not trust: it is size-capped, and a
document declaring a DTD or entities is refused before parsing (no entity expansion), so a
hostile controller gets an error, not memory.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass

from dockyard.environments.osworld.desktop import COMPONENT_NS, STATE_NS
from dockyard.environments.osworld.tasks import WidgetRule

MAX_TREE_CHARS = 1_000_000


class TreeError(ValueError):
    """The controller's tree cannot be read."""


@dataclass(frozen=True)
class Node:
    role: str
    name: str
    text: str
    states: dict[str, str]
    position: str
    size: str


def parse_tree(xml: str) -> list[Node]:
    """Every named node of the tree, in document order."""
    if len(xml) > MAX_TREE_CHARS:
        raise TreeError(f"accessibility tree of {len(xml)} characters is over {MAX_TREE_CHARS}")
    if "<!DOCTYPE" in xml or "<!ENTITY" in xml:
        raise TreeError("accessibility tree declares a DTD or entities; refused")
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as error:
        raise TreeError(f"accessibility tree is not XML: {error}") from None
    return list(_nodes(root))


def _nodes(root: ET.Element) -> Iterator[Node]:
    state_prefix = f"{{{STATE_NS}}}"
    for element in root.iter():
        name = element.get("name")
        if not name:
            continue
        states = {
            key[len(state_prefix) :]: value
            for key, value in element.attrib.items()
            if key.startswith(state_prefix)
        }
        yield Node(
            role=element.tag,
            name=name,
            text=(element.text or "").strip(),
            states=states,
            position=element.get(f"{{{COMPONENT_NS}}}screencoord", ""),
            size=element.get(f"{{{COMPONENT_NS}}}size", ""),
        )


def rule_failures(nodes: list[Node], rules: tuple[WidgetRule, ...]) -> list[str]:
    """What of ``rules`` the final state breaks (empty: every rule holds)."""
    failures = []
    for rule in rules:
        node = next((n for n in nodes if n.name == rule.name and n.role != "menu-item"), None)
        if node is None:
            failures.append(f"{rule.name!r} is not on the screen")
            continue
        if rule.text is not None and node.text != rule.text:
            failures.append(f"{rule.name!r} reads {node.text!r}, expected {rule.text!r}")
        if rule.checked is not None:
            checked = node.states.get("checked") == "true"
            if checked != rule.checked:
                failures.append(f"{rule.name!r} is {'' if checked else 'not '}checked")
    return failures


def linearize(nodes: list[Node]) -> str:
    """The tree as the table OSWorld's agents read (tag, name, text, state, position, size);
    the states shown are those that hold, but for ``enabled``, which holds for nearly all."""
    lines = ["tag\tname\ttext\tstate\tposition\tsize"]
    for node in nodes:
        if node.role in ("desktop-frame", "frame"):
            continue
        states = ",".join(
            key
            for key, value in sorted(node.states.items())
            if value == "true" and key != "enabled"
        )
        lines.append(
            f"{node.role}\t{node.name}\t{node.text}\t{states}\t{node.position}\t{node.size}"
        )
    return "\n".join(lines)
