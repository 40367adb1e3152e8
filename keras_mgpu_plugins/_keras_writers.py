"""Keras's own file-writing callbacks in a multi-worker `fit`: chief-only, or refused.

Keras's callbacks have no rank logic (on TensorFlow or on JAX): given to every
worker of a job, each one writes the same path from every process. Where the
chief's file alone is what one process would write, kmp keeps them on the chief
only; where it is not, `fit` fails on every worker before the first step:

- `keras.callbacks.CSVLogger` and `keras.callbacks.TensorBoard` (and subclasses)
  are dropped from the non-chief workers' `fit`: the chief writes what one
  process writes (the logs, weights and graph they record are the same on every
  worker). `TensorBoard(profile_batch=...)` profiles the chief only.
- `keras.callbacks.ModelCheckpoint` and `keras.callbacks.BackupAndRestore` (not
  kmp's subclasses) are refused: saving the model takes every worker on each lane (the
  lane's own words: its backend's `saving_in_a_job()`), a backup must be restored by
  every worker alike, and a crash mid-write leaves a truncated file. kmp's drop-ins do this:
  `kmp.callbacks.ModelCheckpoint`, `kmp.callbacks.BackupAndRestore`.

Used by the multi-worker `fit` wrapper (`_same_callbacks`), whose one all-gather
carries which workers were given a refused callback, so that every worker raises
even when only some were given one (the tf.keras idiom `[...] if chief else []`).

`check_installed` refuses, before training, a Keras writer the environment cannot run:
`keras.callbacks.TensorBoard` imports `tensorflow.summary` on every Keras backend (Keras
3.10 to 3.15, `keras/src/callbacks/tensorboard.py`), so on a JAX or torch lane without
TensorFlow it died at train begin with only "No module named 'tensorflow'".
"""

from __future__ import annotations

from typing import Any

#: Keras's callbacks kept on the chief only.
CHIEF_ONLY = ("CSVLogger", "TensorBoard")
#: Keras's callbacks refused under several workers, each with kmp's drop-in.
REFUSED = {"ModelCheckpoint": "kmp.callbacks.ModelCheckpoint",
           "BackupAndRestore": "kmp.callbacks.BackupAndRestore"}


def _is_keras(callback: Any, name: str) -> bool:
    import keras

    return isinstance(callback, getattr(keras.callbacks, name))


def check_installed(callbacks: Any) -> None:
    """Raises, before training, where a Keras writer among `callbacks` needs packages this
    environment lacks (Keras's `TensorBoard`: TensorFlow's `tf.summary`, and `tensorboard`).

    Raises:
        ModuleNotFoundError: Naming the callback, the lane and what to install.
    """
    import importlib.util

    if not callbacks or not any(_is_keras(c, "TensorBoard") for c in callbacks):
        return
    missing = [name for name in ("tensorflow", "tensorboard")
               if importlib.util.find_spec(name) is None]
    if not missing:
        return
    import keras

    from keras_mgpu_plugins import _backend

    packages = " ".join("tensorflow-cpu" if m == "tensorflow" else m for m in missing)
    verb, them = ("is", "it") if len(missing) == 1 else ("are", "them")
    raise ModuleNotFoundError(
        f"keras.callbacks.TensorBoard writes its event files with TensorFlow's tf.summary on "
        f"every Keras backend (Keras {keras.__version__} imports tensorflow.summary in it, on "
        f"the {_backend.lane()} lane too), and {' and '.join(missing)} {verb} not installed "
        f"here: its fit would fail at train begin with \"No module named '{missing[0]}'\". "
        f"Install {them} beside the lane's framework (pip install {packages}; or tensorflow "
        "with GPUs), or leave TensorBoard out and log with keras.callbacks.CSVLogger or "
        "keras_mgpu_plugins.integrations.wandb.WandbLogger.", name=missing[0])


def for_this_worker(callbacks: list, is_chief: bool) -> list:
    """`callbacks` without Keras's `CSVLogger` and `TensorBoard` unless this is the chief."""
    if is_chief:
        return list(callbacks)
    return [c for c in callbacks if not any(_is_keras(c, name) for name in CHIEF_ONLY)]


def refused(callbacks: list) -> tuple[str, ...]:
    """The Keras callbacks among `callbacks` that several workers must not run, as sorted
    `keras.callbacks.X` names (kmp's subclasses of them are not)."""
    names = []
    for callback in callbacks:
        if type(callback).__module__.startswith("keras_mgpu_plugins."):
            continue
        names += [f"keras.callbacks.{name}" for name in REFUSED if _is_keras(callback, name)]
    return tuple(sorted(names))


def refusal(here: tuple[str, ...], worker: int, holders: list[int]) -> ValueError:
    """The error every worker raises when any worker was given a refused callback.

    Args:
        here: `refused(...)` of this worker's callbacks.
        worker: This worker's index.
        holders: The workers that were given one.
    """
    where = ", ".join(str(r) for r in holders)
    if not here:
        return ValueError(
            f"model.fit on several workers: worker(s) {where} were given Keras's ModelCheckpoint "
            "or BackupAndRestore, which kmp refuses under several workers (the error there "
            "names it); every worker stops before training so that none waits for the others. "
            "Use kmp.callbacks.ModelCheckpoint / kmp.callbacks.BackupAndRestore, the same on "
            f"every worker. Received (worker {worker}): callbacks without them")
    from keras_mgpu_plugins import _backend

    drop_ins = ", ".join(f"{name} -> {REFUSED[name.rsplit('.', 1)[1]]}" for name in here)
    return ValueError(
        f"model.fit on several workers ({_backend.lane()} lane) was given {', '.join(here)}, "
        "which has no multi-worker logic: every worker would write the same path (a crash "
        f"mid-write leaves a truncated file), and {_backend.active().saving_in_a_job()}. Use "
        f"kmp's drop-in, with the same arguments ({drop_ins}): the chief writes, atomically, "
        "and every worker takes part; pass it to every worker. Every worker stops before "
        f"training (given one: worker(s) {where}). Received (worker {worker}): "
        f"callbacks=[{', '.join(here)}]")
