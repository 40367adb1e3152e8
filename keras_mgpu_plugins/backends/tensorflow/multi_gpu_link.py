"""The link between `multi_gpu_model`'s template and its parallel model.

The template receives the parallel model's weights (by value) at each epoch
end and when `fit`/`evaluate` return (`push`), by the one copy that
`ModelCheckpoint(model=template)` also uses (`io.snapshots.copy_weights`);
saving the template is `ModelCheckpoint`'s (snapshot, then the chief writes).
Weights given to the template since the last copy are taken in before `fit`,
`evaluate` and `predict` run (`pull`): `fit` and `evaluate` compare CRC-32
fingerprints of both models' weights (a full read, once per call); `predict`
(called in loops by legacy code) only takes them in after the template's
`set_weights` or `load_weights` ran, which the link watches: a `predict` with
nothing changed reads no weight.
"""

from __future__ import annotations

import functools
import inspect
import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from keras_mgpu_plugins.io.snapshots import copy_weights

Fingerprint = tuple[tuple[tuple[int, ...], str, int], ...]


def weights_fingerprint(weights: Sequence[Any]) -> Fingerprint:
    """A cheap digest of a list of arrays: shape, dtype and CRC-32 of each."""
    arrays = [np.asarray(w) for w in weights]
    return tuple(
        (a.shape, str(a.dtype), zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))
        for a in arrays
    )


def sync_action(synced: Fingerprint, template: Fingerprint, parallel: Fingerprint) -> str:
    """What to do before running the parallel model, given who changed since the last copy.

    Returns:
        `"none"`: the template is unchanged (or both hold the same values);
        `"pull"`: only the template changed, take its weights;
        `"conflict"`: both changed, differently.
    """
    if template == synced or template == parallel:
        return "none"
    return "pull" if parallel == synced else "conflict"


class TemplateLink:
    """Keeps the template's weights a copy of the parallel model's; installs the wrappers."""

    def __init__(self, template: keras.Model, parallel: keras.Model, strategy: Any) -> None:
        self.template = template
        self.parallel = parallel
        self.strategy = strategy
        self.cls = type(parallel)
        self.synced = weights_fingerprint(template.get_weights())
        self.in_fit = False
        self.template_changed = False  # set by the template's set_weights / load_weights

    def push(self) -> None:
        """Copies the parallel model's weights into the template (by value).

        The one copy of trained values into a template, shared with
        `ModelCheckpoint(model=template)`: a snapshot read and an `assign` per
        variable (`io.snapshots.copy_weights`; not the template's watched
        `set_weights`: not a change to take in).
        """
        self.synced = weights_fingerprint(copy_weights(self.parallel, self.template))

    def pull(self, check: bool = True) -> None:
        """Takes in weights given to the template since the last copy.

        Args:
            check: Compare fingerprints (a full read of both models). With
                `False`, only if the template's `set_weights`/`load_weights` ran.
        """
        if not (check or self.template_changed):
            return
        self.template_changed = False
        template_weights = self.template.get_weights()
        template = weights_fingerprint(template_weights)
        if template == self.synced:
            return
        action = sync_action(
            self.synced, template, weights_fingerprint(self.parallel.get_weights())
        )
        if action == "pull":
            self.parallel.set_weights(template_weights)
            self.synced = template
        elif action == "conflict":
            warnings.warn(
                "The weights of both the template model and the parallel model changed since "
                "they were last copied; the parallel model's are kept and copied into the "
                "template. Change the weights of only one of them.",
                UserWarning,
                stacklevel=3,
            )
            self.push()
        else:
            self.synced = template

    def install(self) -> None:
        """Replaces `compile`, `fit`, `evaluate`, `predict` on the parallel model instance,
        and watches the template's `set_weights` and `load_weights`."""
        from keras_mgpu_plugins import compat  # registered per-instance patches

        compat.apply_to("multi_gpu_parallel_methods", self.parallel, self)
        compat.apply_to("multi_gpu_template_watch", self.template, self)

    def _watch(self, method: Any) -> Any:
        def watched(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(self.template, *args, **kwargs)
            finally:
                self.template_changed = True

        return watched

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        with self.strategy.scope():  # every optimizer argument (a GAN's compile has two)
            args = tuple(self._optimizer_in_scope(a) for a in args)
            kwargs = {k: self._optimizer_in_scope(v) for k, v in kwargs.items()}
            return self.cls.compile(self.parallel, *args, **kwargs)

    def _optimizer_in_scope(self, optimizer: Any) -> Any:
        """An optimizer instance made outside the scope, re-made inside from its config."""
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            return optimizer  # a name or None: created by compile, in the scope
        iterations = getattr(optimizer.iterations, "value", optimizer.iterations)
        if self.strategy.extended.variable_created_in_scope(iterations):
            return optimizer
        return type(optimizer).from_config(optimizer.get_config())

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        self.pull()
        bound = inspect.signature(self.cls.fit).bind(self.parallel, *args, **kwargs)
        given = bound.arguments.get("callbacks") or []
        if isinstance(given, keras.callbacks.CallbackList):
            given = given.callbacks
        bound.arguments["callbacks"] = [_CopyToTemplate(self), *given]
        self.in_fit = True
        try:
            history = self.cls.fit(*bound.args, **bound.kwargs)
        finally:
            self.in_fit = False
        self.push()
        return history

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        if self.in_fit:  # fit's own validation: weights are copied at epoch end
            return self.cls.evaluate(self.parallel, *args, **kwargs)
        self.pull()
        result = self.cls.evaluate(self.parallel, *args, **kwargs)
        self.push()
        return result

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        if not self.in_fit:
            self.pull(check=False)  # no read of the weights unless the template was given some
        return self.cls.predict(self.parallel, *args, **kwargs)


def forward_parallel_methods(parallel: keras.Model, link: TemplateLink) -> None:
    """The per-instance patch `multi_gpu_parallel_methods`: the link's methods on `parallel`."""
    for name in ("compile", "fit", "evaluate", "predict"):
        _replace(parallel, name, getattr(link, name))


def watch_template(template: keras.Model, link: TemplateLink) -> None:
    """The per-instance patch `multi_gpu_template_watch`: weight changes noted on the link."""
    for name in ("set_weights", "load_weights"):
        _replace(template, name, link._watch(getattr(type(template), name)))


def _replace(model: keras.Model, name: str, implementation: Any) -> None:
    """Sets `model.<name>` to call `implementation`, with the class method's doc and signature."""
    method = getattr(type(model), name)
    wrapper = functools.wraps(method)(_forward(implementation))
    signature = inspect.signature(method)
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=list(signature.parameters.values())[1:]  # without self
    )
    object.__setattr__(model, name, wrapper)  # untracked by Keras


def _forward(method: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    return wrapper


class _CopyToTemplate(keras.callbacks.Callback):
    """Copies the trained weights into the template at each epoch end (no batch hook)."""

    def __init__(self, link: TemplateLink) -> None:
        super().__init__()
        self._link = link

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._link.push()
