"""Checkpoint snapshots in host memory, and the background thread that writes them.

A `Snapshot` holds everything Keras would write for `model.save(path)` or
`model.save_weights(path)`, copied off the model on the calling (training)
thread: the config, and a NumPy copy of every variable in the order and layout
Keras's saver walks them. `Snapshot.write(path)` later produces the same file
from that copy alone, so it can run on another thread while training goes on
and changes the variables.

It relies on Keras's saving internals, all reached through `compat` (the
private use `"saving_internals"`: `compat.save_state_walk`, Keras's own walk
over layers, optimizer and their variables, run here with a recording store
instead of an H5 file; `compat.h5_store_class`, subclassed so the walk accepts
that store; `compat.open_h5_store`, `open_assets_store`,
`serialize_model_as_json`, `archive_names` and `save_model_to_hdf5` to write).
`check_keras_internals` fails loudly when one is missing or changed.

The same walk also serves non-chief workers, which must read the variables in
the order the chief's save does (a read can be a collective operation under a
multi-worker strategy) but keep nothing: `take_snapshot(..., keep=False)`.
"""

from __future__ import annotations

import dataclasses
import io
import threading
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from keras_mgpu_plugins import compat


def check_keras_internals() -> None:
    """Raises `RuntimeError` if a Keras internal this module needs is missing or changed."""
    compat.require("saving_internals")


def kind_of(filepath: str, weights_only: bool) -> str:
    """`"weights"` (`.weights.h5`), `"keras"` (`.keras`) or `"h5"` (legacy `.h5`)."""
    if weights_only:
        return "weights"
    return "keras" if filepath.endswith(".keras") else "h5"


@dataclasses.dataclass
class Snapshot:
    """A checkpoint's content in host memory; `write(path)` makes the file."""

    kind: str
    entries: list = dataclasses.field(default_factory=list)
    config_json: str | None = None
    metadata_json: str | None = None
    assets_zip: bytes | None = None
    h5_bytes: bytes | None = None

    def write(self, path: str) -> None:
        """Writes the checkpoint file at `path` (not atomically: see `_atomic`)."""
        if self.kind == "h5":
            with open(path, "wb") as f:
                f.write(self.h5_bytes)
        elif self.kind == "weights":
            _replay(compat.open_h5_store(path), self.entries)
        else:
            names = compat.archive_names()
            with open(path, "wb") as f, zipfile.ZipFile(f, "w") as zf:
                zf.writestr(names.metadata, self.metadata_json)
                zf.writestr(names.config, self.config_json)
                _replay(compat.open_h5_store(names.weights, archive=zf), self.entries)
                with zipfile.ZipFile(io.BytesIO(self.assets_zip)) as assets:
                    for info in assets.infolist():
                        zf.writestr(info, assets.read(info))


def take_snapshot(model: Any, kind: str, keep: bool = True) -> Snapshot:
    """Copies what `model.save`/`save_weights` would write, on this thread.

    Args:
        model: The Keras model.
        kind: See `kind_of`.
        keep: With `False`, every variable is read as the save would read it,
            and nothing is kept (for workers that do not write).

    Returns:
        The snapshot (empty when `keep` is false).
    """
    if kind == "h5":
        import h5py

        buffer = io.BytesIO()
        with h5py.File(buffer, "w") as f:
            compat.save_model_to_hdf5(model, f)
        return Snapshot(kind, h5_bytes=buffer.getvalue() if keep else None)
    if kind == "weights" and not model.built:
        raise ValueError(
            "You are saving a model that has not yet been built. Try building the "
            "model first by calling it on some data or by using `build()`."
        )
    store = _RecordingStore(keep)
    snapshot = Snapshot(kind, entries=store.entries)
    if kind == "keras" and keep:
        snapshot.config_json, snapshot.metadata_json = compat.serialize_model_as_json(model)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            assets = compat.open_assets_store(archive)
            try:
                compat.save_state_walk(model, store, assets)
            finally:
                assets.close()  # zips the assets and removes its temporary folder
        snapshot.assets_zip = buffer.getvalue()
    else:
        compat.save_state_walk(model, store)
    return snapshot


def _replay(store: Any, entries: list) -> None:
    try:
        for path, metadata, values in entries:
            entry = store.make(path, metadata=metadata)
            for key, value in values.items():
                entry[key] = value
    finally:
        store.close()


def _recording_store_class() -> type:
    import keras

    class RecordingStore(compat.h5_store_class()):
        """Stands in for `H5IOStore(mode="w")`: records NumPy copies, writes nothing."""

        def __init__(self, keep: bool) -> None:  # no H5 file is opened
            self.mode = "w"
            self.keep = keep
            self.entries: list = []
            self.current: dict = {}

        def __bool__(self) -> bool:
            return True

        def make(self, path: str, metadata: dict | None = None) -> RecordingStore:
            self.current = {}
            if self.keep:
                self.entries.append((path, metadata, self.current))
            return self

        def __setitem__(self, key: str, value: Any) -> None:
            # The read; for a variable, one copy of its current value to host memory.
            if isinstance(value, keras.Variable):
                array = np.asarray(value.value)
            else:
                array = keras.ops.convert_to_numpy(value)
            if self.keep:
                owned = array.base is None and array.flags.owndata and array.flags.writeable
                self.current[key] = array if owned else np.array(array)

        def __getitem__(self, key: str) -> Any:
            return self.current[key]

        def __contains__(self, key: object) -> bool:
            return key in self.current

        def __delitem__(self, key: str) -> None:
            del self.current[key]

        def __len__(self) -> int:
            return len(self.current)

        def keys(self) -> Any:
            return self.current.keys()

        def close(self) -> None:
            pass

    return RecordingStore


_store_class: type | None = None


def _RecordingStore(keep: bool) -> Any:  # noqa: N802 - built lazily (imports Keras)
    global _store_class
    if _store_class is None:
        _store_class = _recording_store_class()
    return _store_class(keep)


class BackgroundWriter:
    """Runs one job at a time on a background thread and keeps its outcome.

    `submit` waits for the previous job first, so at most one is in flight.
    Outcomes `(record, error)` are collected on the training thread with
    `collect`; nothing is raised or published from the writer thread.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._done: list[tuple[Any, BaseException | None]] = []

    def submit(self, job: Callable[[], Any], record: Any) -> None:
        """Waits for the job in flight, then starts `job` in the background."""
        self.wait()

        def run() -> None:
            error = None
            try:
                job()
            except BaseException as err:  # handed to the training thread
                error = err
            with self._lock:
                self._done.append((record, error))

        # Not a daemon: a checkpoint being written is finished before exit.
        self._thread = threading.Thread(target=run, name="kmp-checkpoint-writer")
        self._thread.start()

    def wait(self) -> None:
        """Blocks until no job is in flight."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def has_news(self) -> bool:
        """Whether a job finished since the last `collect` (cheap, lock-free)."""
        return bool(self._done)

    def collect(self) -> list[tuple[Any, BaseException | None]]:
        """The `(record, error)` of every job finished since the last call."""
        with self._lock:
            done, self._done = self._done, []
        return done
