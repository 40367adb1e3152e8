"""Checkpoint snapshots in host memory: the one way every worker takes part in a save.

A `Snapshot` holds everything Keras would write for `model.save(path)` or
`model.save_weights(path)`, taken off the model on the training thread: the
config, and a read of every variable in the order and layout Keras's saver
walks them. `Snapshot.write(path)` later produces the same file from the
snapshot alone, on the training thread (a synchronous save) or on the writer
thread (`async_save=True`), while training goes on and changes the variables.

A read is the backend's (`_backend.active().read_variable`). It costs no copy
where TensorFlow allows: reading a variable gives a tensor that shares its
buffer, and the next update of that variable copies it first (copy-on-write),
so the snapshot holds the values of the moment it was taken. On JAX it is a
copy on the variable's devices (the trainer donates, hence deletes, the arrays
of each step); a value spread unreplicated over several processes is gathered
to the host then, by every process. The conversion to NumPy, the serialisation and the file I/O all
happen in `write`. On a GPU the read stays in device memory until `write`
copies it to the host (one more copy of the variables in device memory while
a write is pending).

Every worker takes the same snapshot (a read can be a collective operation
under a multi-worker strategy: every worker must read the same variables in
the same order); only the chief writes (`async_writer`).

It relies on Keras's saving internals, all reached through `compat` (the
private use `"saving_internals"`: `compat.save_state_walk`, Keras's own walk
over layers, optimizer and their variables, run here with a store that keeps
the reads instead of writing an H5 file; `compat.h5_store_class`, subclassed
so the walk accepts that store; `compat.open_h5_store`, `open_assets_store`,
`serialize_model_as_json`, `archive_names` and `save_model_to_hdf5` to write).
`check_keras_internals` fails loudly when one is missing or changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import zipfile
from collections.abc import Iterator
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
        """Writes the checkpoint file at `path` (not atomically: see `io.atomic`)."""
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


def read(variable: Any) -> Any:
    """A snapshot read of one Keras variable: its values of this moment, copied only where
    the backend must (`_backend.active().read_variable`)."""
    from keras_mgpu_plugins import _backend

    return _backend.active().read_variable(variable)


def check_template(source: Any, target: Any) -> bool:
    """Whether `target` needs `source`'s values copied (`False`: it shares them).

    Raises:
        ValueError: If the two models' weights differ in number or shapes.
    """
    sources, targets = source.weights, target.weights
    if targets and {id(v) for v in targets} <= {id(v) for v in sources}:
        # The template's variables are the trained ones: the trained model wraps the
        # template (e.g. `Sequential([Input, template])`). `multi_gpu_model` does not
        # share: its template holds a copy, and is copied into here like any other.
        return False
    shapes = [tuple(v.shape) for v in sources]
    wanted = [tuple(v.shape) for v in targets]
    if shapes != wanted:
        raise ValueError(
            "ModelCheckpoint(model=...) saves a template model that must have the "
            f"same weights as the trained model {source.name!r}, in the same order, "
            f"to receive them. The trained model has {len(shapes)} weights of shapes "
            f"{shapes}; the template {target.name!r} has {len(wanted)} weights of shapes "
            f"{wanted}. Received: model={target.name!r}"
        )
    return True


def copy_weights(source: Any, target: Any) -> list | None:
    """Gives `target` the values of `source`'s weights, by the snapshot reads of `read`.

    A template model (`ModelCheckpoint(model=...)`, `multi_gpu_model`'s
    template) receives the trained values this way: one read of each trained
    variable (no copy where the backend allows), then one `assign` of it into
    the target's variable (a device-to-device copy, no NumPy round trip).

    Returns:
        The reads, in `source.weights` order (what `target` now holds), or
        `None` when the target's variables are the source's own (nothing to copy).

    Raises:
        ValueError: If the two models' weights differ in number or shapes.
    """
    if not check_template(source, target):
        return None
    reads = [read(v) for v in source.weights]
    for variable, value in zip(target.weights, reads, strict=True):
        variable.assign(value)
    return reads


def take_snapshot(model: Any, kind: str) -> Snapshot:
    """Reads what `model.save`/`save_weights` would write, on this thread.

    Args:
        model: The Keras model.
        kind: See `kind_of`.

    Returns:
        The snapshot; `write` makes the file from it alone.
    """
    if kind == "h5":  # the legacy format: serialised here, whole
        import h5py

        buffer = io.BytesIO()
        with h5py.File(buffer, "w") as f:
            compat.save_model_to_hdf5(model, f)
        return Snapshot(kind, h5_bytes=buffer.getvalue())
    if kind == "weights" and not model.built:
        raise ValueError(
            "You are saving a model that has not yet been built. Try building the "
            "model first by calling it on some data or by using `build()`."
        )
    store = _SnapshotStore()
    snapshot = Snapshot(kind, entries=store.entries)
    with _optimizer_hands_variables(model):
        if kind == "keras":
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


@contextlib.contextmanager
def _optimizer_hands_variables(model: Any) -> Iterator[None]:
    """During the walk, the optimizer hands the store its variables, not NumPy copies.

    Keras's `Optimizer.save_own_variables` stores `variable.numpy()` for each
    of `optimizer.variables`, a full copy on this thread. An optimizer that
    keeps that method gets, for the walk only, one that stores the same
    variables (the store reads them); the values written are the same.
    """
    import keras

    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or "save_own_variables" in vars(optimizer) or (
        type(optimizer).save_own_variables is not keras.optimizers.Optimizer.save_own_variables
    ):
        yield
        return

    def save_own_variables(store: Any) -> None:
        for i, variable in enumerate(optimizer.variables):
            store[str(i)] = variable

    vars(optimizer)["save_own_variables"] = save_own_variables  # bypasses Keras's tracking
    try:
        yield
    finally:
        del vars(optimizer)["save_own_variables"]


def _replay(store: Any, entries: list) -> None:
    try:
        for path, metadata, values in entries:
            entry = store.make(path, metadata=metadata)
            for key, value in values.items():
                entry[key] = np.asarray(value)  # a device read is copied to the host here
    finally:
        store.close()


def _snapshot_store_class() -> type:
    import keras

    class SnapshotStore(compat.h5_store_class()):
        """Stands in for `H5IOStore(mode="w")`: keeps the reads, writes nothing."""

        def __init__(self) -> None:  # no H5 file is opened
            self.mode = "w"
            self.entries: list = []
            self.current: dict = {}

        def __bool__(self) -> bool:
            return True

        def make(self, path: str, metadata: dict | None = None) -> SnapshotStore:
            self.current = {}
            self.entries.append((path, metadata, self.current))
            return self

        def __setitem__(self, key: str, value: Any) -> None:
            if isinstance(value, keras.Variable):  # the read: shares the buffer until an update
                value = read(value)
            elif not keras.ops.is_tensor(value):  # NumPy data may be the layer's own: copy
                value = np.array(value)
            self.current[key] = value

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

    return SnapshotStore


_store_class: type | None = None


def _SnapshotStore() -> Any:  # noqa: N802 - built lazily (imports Keras)
    global _store_class
    if _store_class is None:
        _store_class = _snapshot_store_class()
    return _store_class()
