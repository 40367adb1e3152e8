"""A tiny publish/subscribe channel between callbacks of the same `fit`.

Keras gives a callback no handle on its siblings, and users list callbacks in
any order. Callbacks that produce something others may want (a checkpoint file
that is complete, a record of device metrics) publish it on the model being
trained; callbacks that want it subscribe on that model in `set_model` or
`on_train_begin`. Publishing with no subscriber costs nothing.

Topics and payloads (stable, documented):

- `"checkpoint_saved"`: `{"path": str, "epoch": int (0-based, as Keras),
  "batch": int | None, "is_best": bool, "monitor": str, "value": float | None}`,
  published on the training thread after the file is complete at its final name,
  on the chief worker only, at whatever batch the (background) writer finished:
  listeners must not run collective operations (other workers are not calling
  them: the job would hang) and should be quick (they run on the training
  thread; hand slow work such as hashing or uploading the file to a thread of
  their own, as `WandbLogger` does).
- `"before_save"`: `{"epoch": int (0-based), "batch": int | None, "fit": int}`, where
  `fit` is `id(callback.params)`, the same for every callback of one `fit` call (a
  listener left subscribed by a `fit` that raised ignores other fits' saves); published by
  `kmp.callbacks.ModelCheckpoint` on the training thread once it has decided to
  save, right before it reads the weights, on every worker at the same point (the
  decision is agreed across workers). Listeners may change the weights to be saved
  and may run collectives (every worker calls them in the same order), e.g.
  `WeightSyncVerifier(sync_stats=True)` averages the per-replica statistics then, so
  the checkpoint holds them whatever the order of the callbacks. Not published
  for a save that was decided against.
- `"device_metrics"`: `{"epoch": int, "batch": int | None, "metrics": dict[str, float]}`,
  where `batch` is the number of batches done in the epoch for a batch record, and
  `None` for the record at epoch end.
- `"flush"`: `{"reason": "train_end"}`, published by a consumer before it closes
  (e.g. a W&B run at train end); producers finish pending work synchronously when
  they receive it and publish what it yields (an async checkpoint completes and its
  `"checkpoint_saved"` event is published before the consumer closes).

In `"checkpoint_saved"` and `"before_save"`, `batch` is Keras's 0-based index of
the batch just finished for a batch-frequency save, `None` for a save at epoch end.

Announcements are values a callback states about the `fit` (`announce`), kept on the
model for whoever asks later (`announced`), whatever the order of the callbacks: Keras
calls every callback's `set_model` before any `on_train_begin`, so a value announced in
`set_model` is there for every `on_train_begin`. Stable keys:

- `"backup_dir"`: the folder of the `kmp.callbacks.BackupAndRestore` of the `fit` (where
  `WandbLogger` keeps its run's id, so a resumed job continues the same W&B run).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

Listener = Callable[[dict[str, Any]], None]

_lock = threading.Lock()
_listeners: weakref.WeakKeyDictionary[Any, dict[str, list[Listener]]] = (
    weakref.WeakKeyDictionary()
)
_announced: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def announce(model: Any, key: str, value: Any) -> None:
    """States `value` under `key` for the `fit` of `model` (replacing an earlier one; nothing
    for an object that cannot be held weakly, as a stand-in model in a test)."""
    with _lock:
        try:
            _announced.setdefault(model, {})[key] = value
        except TypeError:
            pass


def announced(model: Any, key: str, default: Any = None) -> Any:
    """What was announced under `key` on `model`, or `default`."""
    with _lock:
        try:
            return _announced.get(model, {}).get(key, default)
        except TypeError:
            return default


def subscribe(model: Any, topic: str, listener: Listener) -> None:
    """Calls `listener(payload)` for each `topic` event published on `model`."""
    with _lock:
        topics = _listeners.setdefault(model, {})
        if listener not in topics.setdefault(topic, []):
            topics[topic].append(listener)


def unsubscribe(model: Any, topic: str, listener: Listener) -> None:
    """Stops calling `listener` for `topic` events on `model` (no error if absent)."""
    with _lock:
        listeners = _listeners.get(model, {}).get(topic, [])
        if listener in listeners:
            listeners.remove(listener)


def publish(model: Any, topic: str, payload: dict[str, Any]) -> None:
    """Hands `payload` to every listener of `topic` on `model`, in subscription order."""
    with _lock:
        listeners = list(_listeners.get(model, {}).get(topic, []))
    for listener in listeners:
        listener(payload)


def weak_listener(owner: Any, method: str) -> Listener:
    """A listener calling `owner.<method>(payload)` that holds `owner` weakly.

    A subscription lives as long as the model: a callback subscribing its own
    method would be kept alive (with what it holds) by the channel. Once
    `owner` is gone, the listener does nothing.
    """
    ref = weakref.ref(owner)

    def listener(payload: dict[str, Any]) -> None:
        target = ref()
        if target is not None:
            getattr(target, method)(payload)

    return listener
