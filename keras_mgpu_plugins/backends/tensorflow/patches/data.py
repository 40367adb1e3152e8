"""Keras patch for `PyDataset(use_multiprocessing=True)` in a multi-worker process.

`patch_py_dataset_pool_sigterm` gives Keras's forked data workers back the
default SIGTERM action, so that the pool's shutdown at exit can stop them.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins._step_phases import CLOCK
from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve


def patch_py_dataset_pool_sigterm() -> Any:
    """A process exits only after Keras's forked PyDataset workers do; under a multi-worker strategy they never do.

    `PyDataset(use_multiprocessing=True)` feeds `fit` from a
    `multiprocessing.Pool` forked from the training process; at exit,
    `multiprocessing` stops the pool's workers still alive with SIGTERM and
    waits for them. Under MultiWorkerMirroredStrategy TensorFlow's preemption
    notifier has installed its own SIGTERM handler (outside Python: it records
    the signal, the process goes on), and the forked workers inherit it: they
    ignore SIGTERM and the training process waits for them forever, after
    `fit` returned. Keras's pool initializer now first restores the default
    action in the worker when SIGTERM's handler is not a Python one (Python's
    `signal.getsignal` still reports SIG_DFL then; a handler set with
    `signal.signal` in Python is left alone). The data, and the order
    the workers deliver it in, do not change.
    """
    py_dataset_adapter = resolve("py_dataset adapter module")
    original = py_dataset_adapter.init_pool_generator

    def init_pool_generator(gens, random_seed=None, id_queue=None):
        import signal

        # Python still sees its own view (SIG_DFL, or None when unknown): not a Python handler.
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return original(gens, random_seed, id_queue)

    py_dataset_adapter.init_pool_generator = init_pool_generator
    return lambda: setattr(py_dataset_adapter, "init_pool_generator", original)


def pool_initializer_keeps_sigterm() -> bool | None:
    py_dataset_adapter = resolve("py_dataset adapter module")
    return (source_has(py_dataset_adapter.OrderedEnqueuer._get_executor_init,
                       "initializer=init_pool_generator")
            and not source_has(py_dataset_adapter.init_pool_generator, "SIGTERM"))


def patch_numpy_function_owned_outputs() -> Any:
    """A `numpy_function`'s outputs (every batch of `fit(generator)` and `fit(PyDataset)`) can be overwritten in place.

    TensorFlow turns a NumPy array a `tf.numpy_function` returns into a tensor
    without a copy when its data is 64-byte aligned: the tensor's buffer is
    the caller's memory, marked as not owned so that no op writes into it.
    `tf.data.Dataset.from_generator`, which Keras uses for Python generators
    and `PyDataset`, returns the generator's arrays this way. When a
    MirroredStrategy splits such a batch between its replicas, the first
    replica's part is a zero-copy slice whose buffer TensorFlow takes for
    owned memory (`Tensor::RefCountIsOne` asks the slice, not the memory's
    owner), so an elementwise op whose input is used nowhere else
    (`y_pred - y_true` in the loss) writes its output into it, that is into
    the user's array. Measured with TensorFlow 2.21 on 2 simulated devices:
    the first replica's targets of each batch became the loss's intermediate
    values, in the user's `y`, and every later epoch, and every later model
    trained on that `y`, trained on them (weights 0.05-0.3 away from one
    device). It depends on where the allocator put the array, so it came and
    went with garbage collection. One device does not show it, with or
    without a slice in the step (measured).

    Each NumPy array a Python function of `tf.numpy_function` (or
    `from_generator`) returns is now copied before TensorFlow takes it: the
    copy belongs to TensorFlow alone, so a write into it harms nobody. The
    values do not change; the cost is one copy per batch, as for an array
    that is not aligned. Each call is also timed as input read on `tf.data`'s thread
    (`_step_phases.CLOCK`: `DeviceMetricsLogger`'s input phase; nothing is kept while no
    logger watches a `fit`).
    """
    import numpy as np

    registry = resolve("numpy_function registry")
    original = registry.__dict__["__call__"]

    def owned(value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.dtype != object:  # strings are copied anyway
            return value.copy()
        return value

    def __call__(self, token, device, args):
        with CLOCK.reading_input():  # a generator's batch: DeviceMetricsLogger's input
            ret = original(self, token, device, args)
        return [owned(v) for v in ret] if isinstance(ret, list) else owned(ret)

    registry.__call__ = __call__
    return lambda: setattr(registry, "__call__", original)


def numpy_function_aliases_outputs() -> bool | None:
    # TensorFlow 2.16 converts with `np.asarray(value, ...)`, 2.18 on with
    # `numpy_compat.np_asarray(value, ...)`: neither copies an array that fits.
    registry = resolve("numpy_function registry")
    convert = registry._convert
    return (source_has(registry.__call__, "return self._convert(ret)")
            and (source_has(convert, "np_asarray(value") or source_has(convert, "np.asarray(value")))
