"""File datasets: ``data.*.path`` names local JSONL, Parquet, or a ``save_to_disk`` directory.

Nothing is downloaded. Every record is read and checked when the dataset is built (at launch),
so a missing field or a wrong type is refused with the record number, the field and the file
before any role starts — never discovered mid-run. ``split`` selects the split of a
``DatasetDict`` directory; for a file it replaces ``{split}`` in the path
(``data/{split}.jsonl``), and a path without ``{split}`` is the dataset whatever the split.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from dockyard.config.sections.data import DatasetConfig, FieldMapping
from dockyard.data.base import ChatMessage, DatasetError, JsonValue, PromptRecord

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})
_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class FileDataset:
    name: str
    records: tuple[PromptRecord, ...]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> PromptRecord:
        return self.records[index]


def load_file_dataset(config: DatasetConfig, env: str) -> FileDataset:
    if config.params:
        raise DatasetError("params", "a file dataset takes no generator parameters")
    assert config.path is not None
    path = Path(config.path.replace("{split}", config.split)).expanduser()
    rows = _read_rows(path, config.split)
    records = []
    for number, row in enumerate(rows):
        if config.max_samples is not None and number >= config.max_samples:
            break
        records.append(_record(row, number, config.fields, env, path))
    if not records:
        raise DatasetError("path", f"{path} holds no records")
    return FileDataset(name=f"{config.name}/{config.split}", records=tuple(records))


# -- reading --------------------------------------------------------------------------------
def _read_rows(path: Path, split: str) -> Iterator[object]:
    if path.is_dir():
        return _read_saved_dataset(path, split)
    if not path.is_file():
        raise DatasetError("path", f"{path} does not exist (no download is attempted)")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return _read_jsonl(path)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as error:  # pyarrow raises several types for a broken file
            raise DatasetError("path", f"{path} is not a readable Parquet file: {error}") from None
        return iter(table.to_pylist())
    raise DatasetError(
        "path",
        f"{path}: unsupported format {suffix or '(no suffix)'!r}; expected .jsonl, .parquet, "
        "or a directory written by datasets' save_to_disk",
    )


def _read_jsonl(path: Path) -> Iterator[object]:
    with path.open(encoding="utf-8") as lines:
        number = 0
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue  # blank lines separate nothing in JSONL; a trailing newline is common
            try:
                yield json.loads(line)
            except json.JSONDecodeError as error:
                raise DatasetError(
                    "path", f"record {number} (line {line_number}) of {path}: invalid JSON: {error}"
                ) from None
            number += 1


def _read_saved_dataset(path: Path, split: str) -> Iterator[object]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as error:
        raise DatasetError(
            "path", f"{path} is not a directory written by datasets' save_to_disk: {error}"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DatasetError(
                "split", f"{path} has no split {split!r} (splits: {', '.join(sorted(loaded))})"
            )
        loaded = loaded[split]
    return iter(loaded)


# -- mapping a row to a record --------------------------------------------------------------
def _record(row: object, number: int, fields: FieldMapping, env: str, path: Path) -> PromptRecord:
    where = f"record {number} of {path}"
    if not isinstance(row, Mapping):
        raise DatasetError("path", f"{where} is a {type(row).__name__}, not an object")

    def get(key: str, field: str) -> object:
        if field not in row:
            present = ", ".join(sorted(map(str, row))) or "none"
            raise DatasetError(
                f"fields.{key}", f"{where} has no field {field!r} (its fields: {present})"
            )
        return row[field]

    answer = get("answer", fields.answer)
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise DatasetError(
            "fields.answer",
            f"{where}: field {fields.answer!r} is a {type(answer).__name__}; the ground truth "
            "must be a string or a number",
        )
    prompt = ""
    messages: tuple[ChatMessage, ...] = ()
    if fields.prompt_field is not None:
        text = get("prompt", fields.prompt_field)
        if not isinstance(text, str) or not text:
            raise DatasetError(
                "fields.prompt", f"{where}: field {fields.prompt_field!r} is not a non-empty string"
            )
        prompt = text
    else:
        assert fields.messages is not None
        raw = get("messages", fields.messages)
        messages = _messages(raw, f"{where}: field {fields.messages!r}")
    extra: dict[str, JsonValue] = {}
    if fields.tests is not None:
        extra["tests"] = _test_cases(get("tests", fields.tests), f"{where}: field {fields.tests!r}")
    for name in fields.metadata:
        value = get("metadata", name)
        if not isinstance(value, _SCALARS):
            raise DatasetError(
                "fields.metadata",
                f"{where}: metadata field {name!r} is a {type(value).__name__}; metadata must be "
                "a string, number, bool or null",
            )
        if isinstance(value, float) and not math.isfinite(value):
            # Metadata travels in the prompt group's extra, which holds JSON values only.
            raise DatasetError(
                "fields.metadata",
                f"{where}: metadata field {name!r} is {value}, not a finite number",
            )
        extra[name] = value
    images: tuple[bytes, ...] = ()
    if fields.images is not None:
        images = _images(get("images", fields.images), f"{where}: field {fields.images!r}", path)
    agent = "default"
    if fields.agent is not None:
        agent = get("agent", fields.agent)  # type: ignore[assignment]  # object: narrowed on the next line
        if not isinstance(agent, str) or not agent:
            # The agent name picks the record's teacher under OPD: a wrong type must not
            # quietly become some other agent's.
            raise DatasetError(
                "fields.agent",
                f"{where}: field {fields.agent!r} is {agent!r:.60}; an agent name is a "
                "non-empty string",
            )
    return PromptRecord(
        index=number,
        prompt=prompt,
        ground_truth=str(answer),
        env=env,
        agent_name=agent,
        extra=extra,
        messages=messages,
        images=images,
    )


def _images(value: object, where: str, path: Path) -> tuple[bytes, ...]:
    """The files a record's images field names (relative to the data file), read whole; the
    rollout worker checks and bounds them (dockyard.producers.multimodal)."""
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise DatasetError("fields.images", f"{where} is not a list of image file paths")
    files = []
    for item in value:
        image = path.parent / item
        try:
            files.append(image.read_bytes())
        except OSError as error:
            raise DatasetError("fields.images", f"{where}: cannot read {image}: {error}") from None
    return tuple(files)


# The two kinds of test case a program is scored on (dockyard.environments.code_env).
_CASE_KEYS = ({"input", "output"}, {"output"}, {"assert"})


def _test_cases(value: object, where: str) -> list[JsonValue]:
    """Checked here, at launch, so a malformed case is refused with its record, not
    dead-lettered run after run."""
    if not isinstance(value, list) or not value:
        raise DatasetError("fields.tests", f"{where} is not a non-empty list of test cases")
    cases: list[JsonValue] = []
    for index, case in enumerate(value):
        if (
            not isinstance(case, Mapping)
            or set(case) not in _CASE_KEYS
            or not all(isinstance(text, str) for text in case.values())
        ):
            raise DatasetError(
                "fields.tests",
                f"{where}, case {index}: expected {{input, output}} or {{assert}} with string "
                f"values, got {case!r:.120}",
            )
        cases.append(dict(case))
    return cases


def _content_parts(content: object) -> tuple[str, int] | None:
    """``(text, image parts)`` of a message's content; None when it is neither a string nor
    image parts followed by one text part (where the images go is not guessed)."""
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list) or not content:
        return None
    *images, text = content
    if any(part != {"type": "image"} for part in images):
        return None
    if not isinstance(text, Mapping) or set(text) != {"type", "text"} or text["type"] != "text":
        return None
    return (text["text"], len(images)) if isinstance(text["text"], str) else None


def _messages(value: object, where: str) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise DatasetError("fields.messages", f"{where} is not a non-empty list of messages")
    messages = []
    for turn, message in enumerate(value):
        content = message.get("content") if isinstance(message, Mapping) else None
        parts = _content_parts(content)
        if not isinstance(message, Mapping) or message.get("role") not in CHAT_ROLES or not parts:
            raise DatasetError(
                "fields.messages",
                f"{where}, message {turn}: expected {{role, content}} with role one of "
                f"{', '.join(sorted(CHAT_ROLES))} and content a string or a list of "
                f'{{"type": "image"}} parts then one {{"type": "text", "text": ...}}, got '
                f"{message!r:.120}",
            )
        text, images = parts
        messages.append(ChatMessage(role=message["role"], content=text, images=images))
    if messages[-1].role == "assistant":
        # The prompt ends where the model's turn begins; a finished reply here would be
        # continued, not answered.
        raise DatasetError(
            "fields.messages", f"{where} ends with an assistant message; a prompt ends before it"
        )
    return tuple(messages)
