"""`strategy="model_parallel"` and `"hybrid"` on JAX: a `keras.distribution.ModelParallel`
whose layouts kmp chooses as each variable is created.

Keras lays a variable out when it is created under a distribution
(`Distribution.get_variable_layout(variable)`, which `ModelParallel` answers from its
`LayoutMap` by the variable's path); an optimizer slot takes its parameter's layout.
So the layout must be known before the factory creates its variables. `KmpModelParallel`
decides at that moment, from the variable alone:

- a table of an `Embedding` (path ending in `embeddings`): its rows (axis 0) along the
  model axis;
- any other variable of rank 2 or more (Dense kernels, conv kernels, EinsumDense):
  its last axis (output columns, output channels) along the model axis;
- rank 0 and 1 (biases, normalisation scales, moving statistics, counters, seeds):
  replicated, as is a variable whose chosen axis does not divide over the model axis
  (the reason is kept for `kmp.placement_report`).

With `layout_map=` the user's `keras.distribution.LayoutMap` decides instead, as in
Keras's own `ModelParallel` (any map Keras takes: exact paths or regular expressions
matched in full, tuples or `TensorLayout`s, `<layer path>/output` keys that lay out a
layer's output, keras-hub's `get_layout_map(mesh)`), checked: a layout that cannot
shard a variable evenly raises naming the variable, its shape and the axis; after the
factory, a key that matched no variable and no layer output warns once naming the
paths it could mean, and a large variable the map leaves replicated warns (and is
marked in `kmp.placement_report`).

The mesh has two axes, `("batch", "model")`: `(1, local devices)` for
`"model_parallel"` (one process), `(processes, local devices)` for `"hybrid"` (each
process's devices one row: data parallel across processes, model parallel within).
"""

from __future__ import annotations

import difflib
import re
import warnings
from typing import Any

import keras

BATCH, MODEL = "batch", "model"
_warned: set[str] = set()


class KmpModelParallel(keras.distribution.ModelParallel):
    """`keras.distribution.ModelParallel` whose variable layouts are chosen (or checked) by kmp.

    Args:
        device_mesh: A `keras.distribution.DeviceMesh` with a `"model"` axis (and the batch
            axis first).
        layout_map: The user's `LayoutMap`, or `None` for kmp's choice.
    """

    def __init__(self, device_mesh: Any, layout_map: Any = None) -> None:
        self.user_map = layout_map
        self.decisions: dict[str, tuple[tuple[Any, ...], str]] = {}
        self.matched: set[str] = set()
        self.outputs: set[str] = set()  # the layer output paths Keras asked about
        super().__init__(layout_map=layout_map if layout_map is not None
                         else keras.distribution.LayoutMap(device_mesh),
                         batch_dim_name=device_mesh.axis_names[0], auto_shard_dataset=False)

    def get_variable_layout(self, variable: Any) -> Any:
        """The layout of `variable` as it is created (see the module docstring)."""
        # Keras asks only for a variable created without a layout (an optimizer slot is
        # given its parameter's), once, as it is created.
        if self.user_map is not None:
            axes, why = self._user_axes(variable)
        else:
            axes, why = self._chosen_axes(variable)
        self.decisions.setdefault(variable.path, (axes, why))
        return keras.distribution.TensorLayout(list(axes), self.device_mesh)

    def get_tensor_layout(self, path: str) -> Any:
        """A layer output's layout (`<layer path>/output` keys), as Keras's `ModelParallel`."""
        self.outputs.add(path)
        if self.user_map is None:
            return None
        key = _matching_key(self.user_map, path)
        if key is not None:
            self.matched.add(key)
        return super().get_tensor_layout(path)

    def _axis_size(self, name: str) -> int:
        mesh = self.device_mesh
        return int(mesh.shape[list(mesh.axis_names).index(name)])

    def _chosen_axes(self, variable: Any) -> tuple[tuple[Any, ...], str]:
        shape = tuple(int(d) for d in variable.shape)
        axes: list[Any] = [None] * len(shape)
        if len(shape) < 2:
            return tuple(axes), "replicated (small: rank < 2)"
        n = self._axis_size(MODEL)
        axis = 0 if variable.path.split("/")[-1] == "embeddings" else len(shape) - 1
        if shape[axis] % n:
            return tuple(axes), (f"replicated: axis {axis} (size {shape[axis]}) does not divide "
                                 f"over the {n} devices of the model axis")
        axes[axis] = MODEL
        return tuple(axes), f"axis {axis} sharded over {MODEL!r} ({n} devices)"

    def _user_axes(self, variable: Any) -> tuple[tuple[Any, ...], str]:
        shape = tuple(int(d) for d in variable.shape)
        key = _matching_key(self.user_map, variable.path)
        if key is None:
            return (None,) * len(shape), "replicated (no layout_map key matches)"
        self.matched.add(key)
        axes = tuple(self.user_map[key].axes)
        if len(axes) != len(shape):
            raise ValueError(
                f"layout_map[{key!r}] = {axes} has {len(axes)} axes, but the variable "
                f"{variable.path!r} it matches has shape {shape} (rank {len(shape)}). Give "
                f"one mesh axis name (or None) per dimension of {variable.path!r}.")
        for dim, (size, names) in enumerate(zip(shape, axes, strict=True)):
            if names is None:
                continue
            parts = names if isinstance(names, (tuple, list)) else (names,)
            known = list(self.device_mesh.axis_names)
            unknown = [p for p in parts if p not in known]
            if unknown:
                raise ValueError(f"layout_map[{key!r}] names the mesh axis {unknown[0]!r}, which "
                                 f"the device mesh lacks: its axes are {known}.")
            devices = 1
            for part in parts:
                devices *= self._axis_size(part)
            if size % devices:
                raise ValueError(
                    f"layout_map[{key!r}] cannot shard the variable {variable.path!r} evenly: "
                    f"its shape is {shape}, and dimension {dim} (size {size}) does not divide "
                    f"over the mesh axis {names!r} ({devices} devices). Shard a dimension that "
                    f"is a multiple of {devices}, or leave it None (replicated).")
        return axes, f"layout_map[{key!r}]"


def _matching_key(layout_map: Any, path: str) -> str | None:
    """The key of `layout_map` that `path` selects, as `LayoutMap.__getitem__` does."""
    keys = list(layout_map)  # not `path in layout_map`: LayoutMap answers None, not KeyError
    if path in keys:
        return path
    keys = [k for k in keys if re.fullmatch(k, path)]
    if len(keys) > 1:
        raise ValueError(f"The variable {path!r} matches several layout_map keys: {keys}. Make "
                         "each variable's path match at most one key.")
    return keys[0] if keys else None


def mesh(devices: Any, hybrid: bool) -> Any:
    """The `("batch", "model")` mesh: this process's devices (or `devices`), one row per
    process for `hybrid`."""
    import jax

    if hybrid and jax.process_count() > 1:
        if devices is not None:
            raise ValueError("devices names this process's devices; strategy='hybrid' on several "
                             "processes uses every device of every process. Received: "
                             f"devices={list(devices)!r}. Leave devices=None.")
        rows = [[d for d in jax.devices() if d.process_index == p]
                for p in range(jax.process_count())]
        names = [f"{d.platform}:{d.id}" for row in rows for d in row]
        return keras.distribution.DeviceMesh((len(rows), len(rows[0])), (BATCH, MODEL), names)
    local = [f"{d.platform}:{d.id}" for d in jax.local_devices()]
    if devices is not None:
        names = [str(d).lower() for d in devices]
        unknown = [n for n, raw in zip(names, devices, strict=True) if n not in local]
        if unknown or not names or len(set(names)) != len(names):
            raise ValueError(f"devices must be distinct devices of this process, among {local}. "
                             f"Received: devices={list(devices)!r}")
        local = names
    return keras.distribution.DeviceMesh((1, len(local)), (BATCH, MODEL), local)


def distribution(devices: Any, layout_map: Any, hybrid: bool) -> KmpModelParallel:
    """The `KmpModelParallel` of one factory call (a fresh one per model: its layouts)."""
    if layout_map is None:
        return KmpModelParallel(mesh(devices, hybrid))
    if not isinstance(layout_map, keras.distribution.LayoutMap):
        raise ValueError(f"layout_map must be a keras.distribution.LayoutMap (or None: kmp "
                         f"chooses). Received: layout_map={layout_map!r}")
    if layout_map.device_mesh is None:  # axes only: laid on kmp's mesh
        placed = keras.distribution.LayoutMap(mesh(devices, hybrid))
        for key in layout_map:
            axes = tuple(layout_map[key].axes)
            names = [n for a in axes if a is not None for n in (a if isinstance(a, (tuple, list))
                                                                 else (a,))]
            unknown = [n for n in names if n not in (BATCH, MODEL)]
            if unknown:
                raise ValueError(f"layout_map[{key!r}] = {axes} names the mesh axis "
                                 f"{unknown[0]!r}; kmp's mesh has the axes {[BATCH, MODEL]}.")
            placed[key] = axes
        layout_map = placed
    elif devices is not None:
        raise ValueError("devices and a layout_map with a device mesh both name the devices. "
                         "Pass one: devices=None (the LayoutMap's mesh), or a LayoutMap(None).")
    return KmpModelParallel(layout_map.device_mesh, layout_map)


def check_keys(model: Any, dist: KmpModelParallel) -> None:
    """Warns once per key of the user's layout map that matched none of the model's variables
    and no layer output (Keras ignores such a key), naming the paths it could mean; and once
    for the large variables the map leaves replicated."""
    if dist.user_map is None:
        return
    paths = [v.path for v in model.weights] + sorted(dist.outputs)
    for key in [k for k in dist.user_map if k not in dist.matched]:
        near = difflib.get_close_matches(key, paths, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
        _warn_once(f"layout_map key {key!r} matches none of the model's variables and no layer "
                   f"output, so it lays nothing out (as in Keras).{hint} Variable paths: "
                   f"{[v.path for v in model.weights][:12]}; layer outputs are "
                   "'<layer path>/output'.")
    from keras_mgpu_plugins.backends.jax.placement import large_replicated

    large = large_replicated(model, dist)
    if large:
        _warn_once(f"layout_map leaves large variables replicated on every device (no key "
                   f"matches them): {', '.join(f'{p} ({n:,} bytes)' for p, n in large)}. Each "
                   "device holds them whole; add a key for them to shard them (kmp."
                   "placement_report(model) shows every variable's layout).")


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, UserWarning, stacklevel=4)


def record(model: Any, dist: KmpModelParallel) -> None:
    """Notes `model`'s layouts for `kmp.placement_report` (`backends.jax.placement`)."""
    from keras_mgpu_plugins.backends.jax import placement

    placement.record(model, dist)
