"""The `.wandb` file reader, on files written here chunk by chunk (LevelDB-style log)."""

from __future__ import annotations

import struct
import zlib

import pytest

from keras_mgpu_plugins.integrations._wandb_records import (
    BLOCK_SIZE,
    CorruptRunFileError,
    find_runs,
    read_records,
    read_run,
)

pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")


def write_log(path, payloads):
    """Writes payloads the way W&B does: header, 32 KiB blocks, full/first/middle/last chunks."""
    out = bytearray(struct.pack("<4sHB", b":W&B", 0xBEE1, 0))
    for payload in payloads:
        rest, first = payload, True
        while True:
            left = BLOCK_SIZE - len(out) % BLOCK_SIZE
            if left < 7:
                out += b"\0" * left
                continue
            chunk, rest = rest[: left - 7], rest[left - 7 :]
            kind = (1 if first else 4) if not rest else (2 if first else 3)
            crc = zlib.crc32(chunk, zlib.crc32(bytes([kind])))
            out += struct.pack("<IHB", crc, len(chunk), kind) + chunk
            first = False
            if not rest:
                break
    path.write_bytes(bytes(out))


def run_record(run_id="abc", group="g"):
    record = pb.Record()
    record.run.run_id, record.run.run_group, record.run.display_name = run_id, group, "n"
    item = record.run.config.update.add()
    item.key, item.value_json = "lr", "0.1"
    return record


def history_record(step, **values):
    record = pb.Record()
    for key, value in {"_step": step, **values}.items():
        item = record.history.item.add()
        item.nested_key.append(key)
        item.value_json = repr(value)
    return record


def test_reads_records_split_across_blocks(tmp_path):
    big = history_record(1, blob=1)
    big.history.item[1].value_json = '"' + "x" * (3 * BLOCK_SIZE) + '"'  # first/middle*/last
    records = [run_record(), big] + [history_record(s, loss=0.5) for s in range(2, 400)]
    path = tmp_path / "run-abc.wandb"
    write_log(path, [r.SerializeToString() for r in records])
    assert path.stat().st_size > 3 * BLOCK_SIZE
    assert list(read_records(path)) == records
    run = read_run(path)
    assert (run.id, run.group, run.name, run.config) == ("abc", "g", "n", {"lr": 0.1})
    assert [row["_step"] for row in run.history] == list(range(1, 400))
    assert len(run.history[0]["blob"]) == 3 * BLOCK_SIZE
    assert run.history_keys == {"_step", "blob", "loss"}


def test_a_flipped_byte_or_a_foreign_file_is_reported(tmp_path):
    path = tmp_path / "run-abc.wandb"
    write_log(path, [run_record().SerializeToString()])
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRunFileError, match="checksum"):
        list(read_records(path))
    path.write_bytes(b"SQLite format 3\0" + b"\0" * 64)
    with pytest.raises(CorruptRunFileError, match="Not a W&B run file"):
        list(read_records(path))


def test_an_unfinished_last_chunk_is_ignored(tmp_path):
    path = tmp_path / "run-abc.wandb"
    write_log(path, [run_record().SerializeToString(), history_record(1).SerializeToString()])
    path.write_bytes(path.read_bytes()[:-3])  # a run still being written
    assert [r.WhichOneof("record_type") for r in read_records(path)] == ["run"]


def test_find_runs_lists_run_folders(tmp_path):
    for name in ("offline-run-20250101_000000-aaa", "run-20250101_000001-bbb", "empty-run-x"):
        (tmp_path / "wandb" / name).mkdir(parents=True)
    for name, run_id in (("offline-run-20250101_000000-aaa", "aaa"), ("run-20250101_000001-bbb", "bbb")):
        write_log(tmp_path / "wandb" / name / f"run-{run_id}.wandb", [run_record(run_id).SerializeToString()])
    assert [p.name for p in find_runs(tmp_path)] == [
        "offline-run-20250101_000000-aaa", "run-20250101_000001-bbb",
    ]
    assert [read_run(p).id for p in find_runs(tmp_path / "wandb")] == ["aaa", "bbb"]
