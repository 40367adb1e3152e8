"""Keras patch for `PyDataset(use_multiprocessing=True)` in a multi-worker process.

`patch_py_dataset_pool_sigterm` gives Keras's forked data workers back the
default SIGTERM action, so that the pool's shutdown at exit can stop them.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins._compat_checks import source_has


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
    from keras.src.trainers.data_adapters import py_dataset_adapter

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
    from keras.src.trainers.data_adapters import py_dataset_adapter

    return (source_has(py_dataset_adapter.OrderedEnqueuer._get_executor_init,
                       "initializer=init_pool_generator")
            and not source_has(py_dataset_adapter.init_pool_generator, "SIGTERM"))
