"""Writing a benchmark's results into its section of ``docs/benchmarks.md``.

A section is the text between ``<!-- section:NAME -->`` and ``<!-- /section:NAME -->``. Its
lead (everything before the first ``### `` heading) and each ``### `` subsection can be replaced
on their own, so two benchmarks can share a section without overwriting each other.
"""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def _split_subsections(body: str) -> tuple[str, list[str]]:
    lead, parts = [], []
    for line in body.splitlines(keepends=True):
        if line.startswith("### "):
            parts.append(line)
        elif parts:
            parts[-1] += line
        else:
            lead.append(line)
    return "".join(lead), parts


def replace_section(
    name: str, lines: list[str], *, subsection: str | None = None, docs: Path = DOCS
) -> None:
    """Replace the lead of section ``name`` (``subsection=None``) or the subsection whose
    heading is ``subsection`` (appended when missing) with ``lines``."""
    start, end = f"<!-- section:{name} -->", f"<!-- /section:{name} -->"
    text = docs.read_text()
    if start not in text:
        text = text.rstrip("\n") + f"\n\n{start}\n{end}\n"
    head, rest = text.split(start, 1)
    body, tail = rest.split(end, 1)
    lead, parts = _split_subsections(body.strip("\n") + "\n")
    block = "\n".join(lines).rstrip("\n") + "\n\n"
    if subsection is None:
        lead = block
    else:
        heading = subsection if subsection.startswith("### ") else f"### {subsection}"
        block = block if block.startswith(heading) else f"{heading}\n\n{block}"
        index = next((i for i, p in enumerate(parts) if p.startswith(heading)), None)
        if index is None:
            parts.append(block)
        else:
            parts[index] = block
    new_body = (lead.rstrip("\n") + "\n\n" + "".join(parts)).strip("\n")
    docs.write_text(f"{head}{start}\n{new_body}\n{end}{tail}")
