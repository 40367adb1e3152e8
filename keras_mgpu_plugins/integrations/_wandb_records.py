"""Reads W&B runs back from their files, without a server (offline runs, tests, docs).

A run's `run-<id>.wandb` file is a LevelDB-style log: a 7-byte W&B header
(`":W&B"`, magic `0xBEE1`, version 0), then 32 KiB blocks of chunks, each with a
7-byte header (CRC-32 of type and data, length, type: full / first / middle /
last). Reassembled, each record is a `wandb.proto.wandb_internal_pb2.Record`.

`read_run(run_dir)` summarises one run: id, name, group, config, history rows,
artifacts. `find_runs(wandb_dir)` lists the run folders under a `WANDB_DIR`.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK_SIZE = 32768
_FILE_HEADER = struct.Struct("<4sHB")
_CHUNK_HEADER = struct.Struct("<IHB")
_IDENT, _MAGIC, _VERSION = b":W&B", 0xBEE1, 0
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


class CorruptRunFileError(ValueError):
    """A `.wandb` file does not hold what its format promises."""


@dataclasses.dataclass
class OfflineRun:
    """What one run recorded, as read from its `.wandb` file."""

    path: Path
    id: str = ""
    name: str = ""
    group: str = ""
    project: str = ""
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    artifacts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    finished: bool = False

    @property
    def history_keys(self) -> set[str]:
        """Every key logged in some history row (W&B's `_step`, `_runtime`... included)."""
        return {key for row in self.history for key in row}


def read_records(path: str | Path) -> Iterator[Any]:
    """Yields the `Record` messages of a `.wandb` file, in order.

    Raises:
        CorruptRunFileError: On a bad header, a bad checksum or a broken chunk chain.
    """
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    ident, magic, version = _FILE_HEADER.unpack_from(data, 0)
    if (ident, magic, version) != (_IDENT, _MAGIC, _VERSION):
        raise CorruptRunFileError(f"Not a W&B run file. Received: path={str(path)!r}")
    for payload in _payloads(data, _FILE_HEADER.size, path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def _payloads(data: bytes, pos: int, path: Any) -> Iterator[bytes]:
    pending: bytes | None = None
    while pos + _CHUNK_HEADER.size <= len(data):
        left = BLOCK_SIZE - pos % BLOCK_SIZE
        if left < _CHUNK_HEADER.size:  # block trailer: padding
            pos += left
            continue
        crc, length, kind = _CHUNK_HEADER.unpack_from(data, pos)
        if kind == 0 and length == 0:  # zero padding up to the next block
            pos += left
            continue
        chunk = data[pos + _CHUNK_HEADER.size : pos + _CHUNK_HEADER.size + length]
        if len(chunk) < length:
            return  # a run still being written: its last chunk is incomplete
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            raise CorruptRunFileError(f"Bad checksum at byte {pos} of {str(path)!r}")
        pos += _CHUNK_HEADER.size + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind in (_MIDDLE, _LAST) and pending is not None:
            pending += chunk
            if kind == _LAST:
                yield pending
                pending = None
        else:
            raise CorruptRunFileError(f"Unexpected chunk type {kind} at byte {pos} of {str(path)!r}")


def find_runs(wandb_dir: str | Path) -> list[Path]:
    """The run folders (`run-*` and `offline-run-*`) under `wandb_dir` or `wandb_dir/wandb`."""
    root = Path(wandb_dir)
    if (root / "wandb").is_dir():
        root = root / "wandb"
    return sorted(p for p in root.glob("*run-*") if p.is_dir() and any(p.glob("run-*.wandb")))


def read_run(run_dir: str | Path) -> OfflineRun:
    """Reads one run folder (or its `.wandb` file) into an `OfflineRun`."""
    path = Path(run_dir)
    files = [path] if path.is_file() else sorted(path.glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"No run-*.wandb file in {str(path)!r}")
    run = OfflineRun(path=files[0])
    for record in read_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            _read_run_record(run, record.run)
        elif kind == "config":
            _apply_config(run.config, record.config)
        elif kind == "history":
            run.history.append({_key(item): json.loads(item.value_json) for item in record.history.item})
        elif kind == "artifact":
            run.artifacts.append(_artifact(record.artifact))
        elif kind == "exit":
            run.finished = True
    return run


def _read_run_record(run: OfflineRun, record: Any) -> None:
    run.id = record.run_id or run.id
    run.name = record.display_name or run.name
    run.group = record.run_group or run.group
    run.project = record.project or run.project
    _apply_config(run.config, record.config)


def _apply_config(config: dict[str, Any], record: Any) -> None:
    for item in record.update:
        config[_key(item)] = json.loads(item.value_json)
    for item in record.remove:
        config.pop(_key(item), None)


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _artifact(record: Any) -> dict[str, Any]:
    return {
        "name": record.name,
        "type": record.type,
        "aliases": sorted(record.aliases),
        "metadata": json.loads(record.metadata) if record.metadata else {},
        "files": {entry.path: entry.digest for entry in record.manifest.contents},
        "digest": record.digest,
    }
