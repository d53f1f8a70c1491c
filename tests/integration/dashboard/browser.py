"""A real headless Chromium (Debian's ``chromium``) loading a page, and the DOM it ended with.

``--dump-dom`` prints the document after its scripts ran; ``--virtual-time-budget`` lets the
page's timers and fetches run (virtual time waits while a request is out) before the dump, so no
sleep decides when the page is done. The dump is parsed with the standard library's HTML parser.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

#: Virtual milliseconds the page may run: its first refresh and a few polls.
BUDGET_MS = 5000
_VOID = {"meta", "link", "br", "img", "input", "hr", "col", "source", "wbr", "area", "base"}


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        raise AssertionError("chromium is missing: scripts/ensure_system_packages.sh installs it")
    return found


def _run(*args: str) -> str:
    done = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--virtual-time-budget={BUDGET_MS}", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(self.text_parts) + "".join(child.text() for child in self.children)

    def iter(self):  # type: ignore[no-untyped-def]
        yield self
        for child in self.children:
            yield from child.iter()

    def find_all(self, tag: str, cls: str | None = None) -> list[Node]:
        return [
            n
            for n in self.iter()
            if n.tag == tag and (cls is None or cls in n.attrs.get("class", "").split())
        ]

    def by_id(self, identifier: str) -> Node:
        for node in self.iter():
            if node.attrs.get("id") == identifier:
                return node
        raise AssertionError(f"no element #{identifier}")

    def rows(self) -> list[list[str]]:
        """A table's body rows, as the cells' text."""
        body = self.find_all("tbody")[0]
        return [[cell.text() for cell in row.find_all("td")] for row in body.find_all("tr")]


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].text_parts.append(data)


def load(url: str) -> Node:
    builder = _TreeBuilder()
    builder.feed(_run("--dump-dom", url))
    return builder.root


def screenshot(url: str, path: Path) -> bytes:
    _run(f"--screenshot={path}", "--window-size=1400,2200", url)
    return path.read_bytes()
