"""How often `fit`, `evaluate` and `predict` compile their step functions, kmp against plain Keras.

    python -m tests.jax.compilations_job SIDE DEVICES OUT.json   # SIDE: kmp or plain

Counts JAX's backend compilations (`jax.monitoring`'s `backend_compile_duration` events,
named by the jitted function: `jit(train_step)`, `jit(test_step)`, `jit(predict_step)`)
during each phase: a `fit` of 100 rows in batches of 32 (a partial last batch of 4) for
2 epochs with `validation_data` of 50 rows (a partial batch of 18), the same `fit` again,
`evaluate` and `predict` of the 100 rows, each twice. kmp: `@kmp.parallelize` (every device
of every process). Plain: Keras alone on one device; `DataParallel` over the devices set by
hand on several; on several processes each process passes its own rows of every global
batch (`on_each_process`), as plain Keras needs.
"""

from __future__ import annotations

import collections
import json
import sys

PHASES = ("fit", "fit again", "evaluate", "evaluate again", "predict", "predict again")
ROWS, BATCH = 100, 32


def _build():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _own_rows(array, index: int, processes: int):
    """This process's rows of each global batch of `BATCH` (the last one partial)."""
    import numpy as np

    starts = range(0, len(array), BATCH)
    return np.concatenate([array[s:s + BATCH].reshape(processes, -1, *array.shape[1:])[index]
                           for s in starts])


def count(side: str, devices: int = 0) -> dict:
    """Each phase's compilations of each step function in this process: `{phase: {name: n}}`;
    `devices`: CPU devices to simulate first (kmp's way or JAX's), 0 for those there are."""
    import jax

    import keras_mgpu_plugins as kmp

    if devices and side == "kmp":
        kmp.simulate_devices(devices)
    elif devices:
        jax.config.update("jax_num_cpu_devices", devices)
    import numpy as np
    from jax import monitoring

    compiled: collections.Counter = collections.Counter()

    def listen(event: str, duration: float, **kwargs) -> None:
        name = kwargs.get("fun_name", "")
        if event == "/jax/core/compile/backend_compile_duration" and "step" in name:
            compiled[name] += 1

    monitoring.register_event_duration_secs_listener(listen)
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 8)).astype("float32")
    y = rng.integers(0, 3, ROWS)
    batch = BATCH
    if side == "kmp":
        model = kmp.parallelize(_build)()
    else:
        from keras_mgpu_plugins.cluster.processes import planned_processes

        plan = planned_processes()
        if plan is not None:
            keras.distribution.initialize(plan.coordinator_address, plan.num_processes,
                                          plan.process_id)
        if jax.device_count() > 1:
            keras.distribution.set_distribution(keras.distribution.DataParallel(
                devices=keras.distribution.list_devices(), auto_shard_dataset=False))
        model = _build()
        if jax.process_count() > 1:
            p, i = jax.process_count(), jax.process_index()
            x, y, batch = _own_rows(x, i, p), _own_rows(y, i, p), BATCH // p
    validation = (x[: len(x) // 2], y[: len(y) // 2])
    calls = {"fit": lambda: model.fit(x, y, batch_size=batch, epochs=2, verbose=0,
                                      validation_data=validation),
             "evaluate": lambda: model.evaluate(x, y, batch_size=batch, verbose=0),
             "predict": lambda: model.predict(x, batch_size=batch, verbose=0)}
    found = {}
    for phase in PHASES:
        if phase == "predict" and side == "plain" and jax.process_count() > 1:
            break  # plain Keras cannot read predictions spread over processes (kmp gathers them)
        before = collections.Counter(compiled)
        calls[phase.split()[0]]()
        found[phase] = {k: n - before[k] for k, n in compiled.items() if n - before[k]}
    return found


def on_each_process(side: str) -> dict:
    """`count` in a process of `kmp.launch`, with its rank (JAX's, once it has started)."""
    counts = count(side)
    import jax

    return {"rank": jax.process_index(), "counts": counts}


if __name__ == "__main__":
    side, devices, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    found = count(side, devices)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(found, f)
