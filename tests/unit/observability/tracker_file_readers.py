"""Read what each tracker wrote to disk, with the tracker's own record formats.

W&B 0.31 no longer ships a Python reader for its ``.wandb`` transaction log, so
:func:`read_wandb_records` walks the log's framing (LevelDB-log style, 32 KiB blocks, 7-byte
record headers, after a 7-byte ``:W&B`` file header) and parses every record with wandb's own
protobuf definitions (``wandb.proto.wandb_internal_pb2.Record``). SwanLab ships its reader
(``DataStoreReader``) and protobuf ``Record``; TensorBoard its ``EventAccumulator``; MLflow its
``MlflowClient``.
"""

from __future__ import annotations

import glob
import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

_BLOCK = 32768
_RECORD_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _leveldb_log_payloads(data: bytes, magic: bytes) -> list[bytes]:
    assert data[: len(magic)] == magic, f"not a {magic!r} file: {data[:8]!r}"
    payloads: list[bytes] = []
    position, pending = _RECORD_HEADER, b""
    while position + _RECORD_HEADER <= len(data):
        left_in_block = _BLOCK - position % _BLOCK
        if left_in_block < _RECORD_HEADER:
            position += left_in_block
            continue
        checksum, length, kind = struct.unpack("<IHB", data[position : position + _RECORD_HEADER])
        if kind == 0 and length == 0:
            position += left_in_block
            continue
        chunk = data[position + _RECORD_HEADER : position + _RECORD_HEADER + length]
        # The checksum covers the record type byte then the payload (CRC-32).
        assert zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF == checksum, "corrupt record"
        position += _RECORD_HEADER + length
        if kind == _FULL:
            payloads.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            payloads.append(pending + chunk)
    return payloads


@dataclass
class WandbOfflineRun:
    history: list[dict[str, object]] = field(default_factory=list)
    config: dict[str, object] = field(default_factory=dict)


def read_wandb_offline_run(wandb_dir: Path) -> WandbOfflineRun:
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(str(wandb_dir / "wandb" / "offline-run-*" / "*.wandb"))
    run = WandbOfflineRun()
    for payload in _leveldb_log_payloads(Path(path).read_bytes(), b":W&B"):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            run.history.append(row)
        elif kind == "config":
            for item in record.config.update:
                run.config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return run


@dataclass
class SwanlabPoint:
    key: str
    step: int
    value: float


def read_swanlab_scalars(swanlab_dir: Path) -> list[SwanlabPoint]:
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = glob.glob(str(swanlab_dir / "run-*" / "*.swanlab"))
    reader = DataStoreReader()
    reader.open(path)
    points = []
    try:
        for payload in reader:
            record = Record()
            record.ParseFromString(payload)
            if record.HasField("scalar"):
                scalar = record.scalar
                points.append(SwanlabPoint(scalar.key, scalar.step, scalar.value.number))
    finally:
        reader.close()
    return points


def swanlab_config_file(swanlab_dir: Path) -> Path:
    (path,) = glob.glob(str(swanlab_dir / "run-*" / "files" / "config.yaml"))
    return Path(path)


def read_tensorboard_scalars(tensorboard_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tensorboard_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def read_tensorboard_text(tensorboard_dir: Path, tag: str) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tensorboard_dir), size_guidance={"tensors": 0})
    accumulator.Reload()
    (event,) = [
        e
        for t in accumulator.Tags()["tensors"]
        if t.startswith(tag)
        for e in accumulator.Tensors(t)
    ]
    return event.tensor_proto.string_val[0].decode()
