"""What a `BackupAndRestore` backup holds beside the weights file, so that training resumes
as the uninterrupted run would have gone on.

Keras's weights file holds the layers' weights and the optimizer's variables (its step
count too). The backup's metadata (`BackupState.training`, JSON) adds:

- `seed_generators`: the state of every `keras.random.SeedGenerator` of the model
  (Dropout's masks, random augmentation layers), the variables `model.variables` holds
  beyond `model.weights` (which Keras's weights file leaves out);
- `numpy_rng`, `python_rng`, `backend_rng`: NumPy's, Python's and (torch) the backend's
  global random states at the start of the epoch to resume: Keras, and kmp on several
  processes as Keras does (`inputs.shuffle`), draw the shuffle of arrays (NumPy's on JAX,
  torch's on torch) and of a `PyDataset`'s batches (Python's) from them at each epoch's
  start;
- `data_order`: the state of kmp's own shuffled feeding at that epoch's start
  (`_data_order`: several processes, JAX or torch), so the resumed epochs see the rows in the
  order of the uninterrupted run whatever seed the new `fit` drew;
- `backend_rng_now` (torch): every worker's state of torch's global random generators at
  the backup's step (`backends.torch.resume`): an unseeded Dropout draws its masks from
  them, so a resumed epoch gives them back once its trained batches are drawn;
- `structure`: the model's weights (path, shape) and its optimizer (class, variables):
  a backup of another model or optimizer is refused with `BackupMismatchError` before
  Keras would load part of it (Keras skips an optimizer of another kind with a warning);
- `world`: the replicas and workers that trained, and Keras's batches per epoch: a backup
  resumes on another number of them (elastic) with the same global batches.

TensorFlow's shuffle of arrays (`tf.random.shuffle` in Keras's input pipeline) draws the
same permutation at every epoch once `keras.utils.set_random_seed` is set: a resumed run
that sets the seed sees the uninterrupted run's order; without a seed, no two runs share
an order (interrupted or not).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from keras_mgpu_plugins import _backend, _data_order
from keras_mgpu_plugins.io.backup_state import BackupMismatchError, way_out


def _random_states(model: Any) -> list:
    weights = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def seed_generators(model: Any) -> list[list]:
    """The model's random-state variables (those not in `model.weights`), in order:
    `[path, values]` each (a path names it; the order matches it, as paths can differ
    between two builds in one process)."""
    import keras

    return [[v.path, np.asarray(keras.ops.convert_to_numpy(v.value)).astype(np.int64).tolist()]
            for v in _random_states(model)]


def set_seed_generators(model: Any, states: list[list], backup_dir: str) -> None:
    """Gives the model's random-state variables, in order, the values of `states`.

    Raises:
        BackupMismatchError: If the model has other random states than the backup.
    """
    here = _random_states(model)
    shapes = [list(np.shape(values)) for _, values in states]
    if shapes != [list(v.shape) for v in here]:
        raise BackupMismatchError(
            f"The backup in backup_dir={backup_dir!r} holds {len(states)} random states "
            f"({[path for path, _ in states]}); this model has {len(here)} "
            f"({[v.path for v in here]}), from layers with a seed (e.g. Dropout): it was "
            "written by another model. " + _way_out(backup_dir))
    for variable, (_, values) in zip(here, states, strict=True):
        variable.assign(np.asarray(values, dtype=variable.dtype))


def numpy_rng() -> list:
    """NumPy's global random state (`np.random.get_state()`) as JSON values."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]


def set_numpy_rng(state: list) -> None:
    name, keys, pos, has_gauss, cached = state
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def python_rng() -> list:
    """Python's `random` state (`random.getstate()`) as JSON values."""
    import random

    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def set_python_rng(state: list) -> None:
    import random

    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


def backend_rng() -> list | None:
    """The active backend's global random state where its Keras draws from one (torch's
    generator: its `DataLoader` shuffle), as JSON values; `None` elsewhere."""
    return _backend.active().random_state()


def set_backend_rng(state: list | None) -> None:
    if state is not None:
        _backend.active().set_random_state(state)


def epoch_start() -> dict:
    """The random states and data order a backup taken within the epoch that starts now
    resumes with (read before the epoch's shuffle draws)."""
    return {"numpy_rng": numpy_rng(), "python_rng": python_rng(),
            "backend_rng": backend_rng(), "data_order": data_order()}


def set_epoch_start(saved: dict) -> None:
    """Gives back the random states `epoch_start` recorded (those present)."""
    if saved.get("numpy_rng"):
        set_numpy_rng(saved["numpy_rng"])
    if saved.get("python_rng"):
        set_python_rng(saved["python_rng"])
    set_backend_rng(saved.get("backend_rng"))
    set_data_order(saved.get("data_order"))


def data_order() -> dict | None:
    """The state of kmp's feeding of the running `fit`, where it feeds it (`_data_order`)."""
    order = _data_order.current()
    return None if order is None else order.state()


def set_data_order(state: dict | None) -> None:
    order = _data_order.current()
    if state is not None and order is not None:
        order.restore(state)


def backup_extras(model: Any, here: Any, start: dict[str, Any], steps: Any) -> dict[str, Any]:
    """`BackupState.training` of a backup taken now (`start`: `epoch_start()` of its epoch).
    Where the backend has global generators (torch), every worker's state now (one
    all-gather across workers): the step after the backup draws from them."""
    extras = {**start, "seed_generators": seed_generators(model), "structure": structure(model),
              "world": world(here.replicas_in_sync, here.num_workers, steps)}
    now = backend_rng()
    if now is not None:
        mine = json.dumps(now)
        every = here.gather_texts(mine) if here.spans_workers else [mine]
        extras["backend_rng_now"] = [json.loads(text) for text in every]
    return extras


def set_backend_rng_now(saved: dict, here: Any) -> None:
    """Gives this worker's backend generators their state at the backup's step
    (`backup_extras`), where the backup's workers are these (elastic: left as they are)."""
    states = saved.get("backend_rng_now") or []
    if len(states) == here.num_workers and states[here.worker_index] is not None:
        set_backend_rng(states[here.worker_index])


def drop_fed(model: Any, count: int) -> None:
    """`count` batches were drawn for a resumed epoch and not trained: the backend forgets
    what it kept for their steps (torch: `backends.torch.resume.drop_fed`)."""
    _backend.active().drop_fed(model, count)


def check_steps_per_execution(batches_done: int, model: Any, backup_dir: str) -> None:
    """Raises where the resumed `fit` cannot start its epoch at the backup's batch: its
    `steps_per_execution` does not divide the batches the backup had trained.

    Raises:
        BackupMismatchError: Naming both and what to do.
    """
    per_call = int(getattr(model, "steps_per_execution", 1) or 1)
    if batches_done % per_call:
        raise BackupMismatchError(
            f"The backup in backup_dir={backup_dir!r} was taken after {batches_done} batches "
            f"of its epoch; this model's steps_per_execution={per_call} runs {per_call} "
            f"batches per step, so its epoch cannot go on at batch {batches_done}: compile "
            "with the steps_per_execution of the run that wrote it (or one that divides "
            f"{batches_done}). " + _way_out(backup_dir))


def structure(model: Any) -> dict[str, Any]:
    """The model's weights (path, shape) and optimizer (class, variable count)."""
    optimizer = getattr(model, "optimizer", None)
    return {"weights": [[w.path, list(w.shape)] for w in model.weights],
            "optimizer": None if optimizer is None else type(optimizer).__name__,
            "optimizer_variables": 0 if optimizer is None else len(optimizer.variables)}


def check_structure(saved: dict[str, Any] | None, model: Any, backup_dir: str) -> None:
    """Raises unless the model and its (built) optimizer are those that wrote the backup.

    Raises:
        BackupMismatchError: Naming the first difference and what to do.
    """
    if not saved:
        return  # written by Keras or an older kmp: nothing recorded to compare
    here = structure(model)
    problem = None
    mine, theirs = here["weights"], saved.get("weights", [])
    if len(mine) != len(theirs):
        problem = (f"the backup holds {len(theirs)} weights, this model has {len(mine)}")
    else:
        for i, (a, b) in enumerate(zip(theirs, mine, strict=True)):
            if list(a[1]) != list(b[1]):
                problem = (f"weight {i} is {a[0]!r} of shape {tuple(a[1])} in the backup, "
                           f"{b[0]!r} of shape {tuple(b[1])} in this model")
                break
    if problem is None and (saved.get("optimizer"), saved.get("optimizer_variables")) != (
            here["optimizer"], here["optimizer_variables"]):
        problem = (f"the backup's optimizer is {saved.get('optimizer')} with "
                   f"{saved.get('optimizer_variables')} variables, this model's is "
                   f"{here['optimizer']} with {here['optimizer_variables']}")
    if problem is not None:
        raise BackupMismatchError(
            f"The backup in backup_dir={backup_dir!r} was written by another model or "
            f"optimizer: {problem}. A backup resumes the model and optimizer that wrote it. "
            + _way_out(backup_dir))


def world(replicas: int, workers: int, steps: Any) -> dict[str, Any]:
    return {"replicas": int(replicas), "workers": int(workers),
            "steps": None if steps is None else int(steps)}


def check_world(saved: dict[str, Any] | None, replicas: int, workers: int, steps: Any,
                backup_dir: str) -> None:
    """Raises if the backup cannot resume here with the same global batches.

    A backup of N replicas resumes on M: Keras's `fit(batch_size=B)` is the global batch,
    split over the replicas, so the same global batches continue, provided the batches per
    epoch are the backup's (the same data and `batch_size`). That `B` divides over the M
    replicas is checked at the first step (`check_split`).

    Raises:
        BackupMismatchError: Naming both counts and what to do.
    """
    if not saved:
        return
    before, steps_before = int(saved.get("replicas", replicas)), saved.get("steps")
    if steps is not None and steps_before is not None and int(steps) != int(steps_before):
        raise BackupMismatchError(
            f"The backup in backup_dir={backup_dir!r} was written by a fit with "
            f"{steps_before} batches per epoch (on {before} replicas); this fit has {steps}: "
            "resume with the data and the batch_size (the global batch) that wrote it. "
            + _way_out(backup_dir))


def check_data_order(saved: dict[str, Any], backup_dir: str) -> None:
    """Raises where the resumed `fit` cannot feed the rows in the backup's order.

    kmp shuffles the global rows itself on several processes (`_data_order`), Keras
    shuffles them its own way in one process: a backup of one resumes in the other's order.

    Raises:
        BackupMismatchError: Naming both, and what to do.
    """
    here, there = _data_order.current() is not None, saved.get("data_order") is not None
    workers = (saved.get("world") or {}).get("workers")
    if there and not here:
        raise BackupMismatchError(
            f"The backup in backup_dir={backup_dir!r} was written by {workers} processes "
            "that fed the rows in kmp's shared shuffled order; this fit does not (one process "
            "shuffles with Keras's own order; or shuffle=False): resume on several processes "
            "with shuffle=True, as the run that wrote it. " + _way_out(backup_dir))
    if here and not there and workers == 1:
        raise BackupMismatchError(
            f"The backup in backup_dir={backup_dir!r} was written by one process (which "
            "shuffles with Keras's own order, if at all); this fit on several processes feeds "
            "the rows in kmp's shared shuffled order: resume on one process, or with "
            "shuffle=False on both. " + _way_out(backup_dir))


def check_split(rows: list[float] | None, runtime: Any, saved: dict[str, Any],
                backup_dir: str) -> None:
    """After the first step resumed on another number of replicas: raises on every worker if
    the replicas were given different numbers of rows (the global batch does not divide
    over them: TensorFlow then averages per replica, not over the global batch).

    Args:
        rows: The rows each of this worker's replicas trained so far this epoch
            (`compat.loss_tracker_rows`), or `None` where not measured (JAX, whose
            batches are split exactly, or fed whole, whatever their rows).
        runtime: The model's runtime (one all-gather when it spans workers).

    Raises:
        BackupMismatchError: Naming N, M and the batch.
    """
    counts = [int(r) for r in rows or ()]
    mine = np.array([min(counts, default=0), max(counts, default=0), sum(counts)], np.int64)
    every = runtime.all_gather(mine) if runtime.spans_workers else mine[None]
    total = int(every[:, 2].sum())
    if rows is not None and every[:, 0].min() != every[:, 1].max():
        raise BackupMismatchError(
            f"The backup in backup_dir={backup_dir!r} was written by "
            f"{saved.get('replicas')} replicas ({saved.get('workers')} workers); here "
            f"{runtime.replicas_in_sync} replicas ({runtime.num_workers} workers) cannot split "
            f"the global batch of {total} rows evenly, so training would not go on as the run "
            f"that wrote it (TensorFlow averages each replica's part): resume on a number of "
            f"replicas that divides {total} (e.g. {saved.get('replicas')}). Nothing was saved "
            "since the backup. " + _way_out(backup_dir))


def _way_out(backup_dir: str) -> str:
    return way_out(backup_dir)
