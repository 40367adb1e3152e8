"""How often `fit`, `evaluate` and `predict` trace their step functions on TensorFlow.

A trace is a compilation there: each one builds a graph that TensorFlow optimises at its
first call. `traces(model)` counts, for each phase (a `fit` of 100 rows in batches of 32,
a partial last batch of 4, for 2 epochs with `validation_data` of 50 rows, the same `fit`
again, `evaluate` and `predict` of the 100 rows, each twice), the graphs in which the
model's `train_step`, `test_step` and `predict_step` were traced (a strategy of N replicas
calls the step N times in one graph: one trace). Used on one process
(`tests/multi_device/test_compilations.py`) and on 2 workers
(`tests/multi_worker/test_compilations.py`).

    python -m tests.compilations SIDE CASE STEPS_PER_EXECUTION OUT.json

runs one side (`kmp` or `plain`) of one case in a fresh process (plain Keras there has no kmp
patch applied, and a `MirroredStrategy` of its own: two over the same devices in one process
collide in TensorFlow's collective instance keys): `CASES`.
"""

from __future__ import annotations

import json
import sys

PHASES = ("fit", "fit again", "evaluate", "evaluate again", "predict", "predict again")
STEPS = ("train_step", "test_step", "predict_step")


def build(steps_per_execution: int = 1):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer="adam", metrics=["accuracy"], steps_per_execution=steps_per_execution,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def traces(model) -> dict[str, dict[str, int]]:
    """`{phase: {step: traces}}` (steps with none left out) of `model` through the phases."""
    import numpy as np
    import tensorflow as tf

    graphs: dict[str, list] = {name: [] for name in STEPS}
    for name in STEPS:
        original = getattr(model, name)

        def counting(data, _original=original, _seen=graphs[name]):
            graph = tf.compat.v1.get_default_graph()  # the function graph being traced
            if not tf.executing_eagerly() and all(g is not graph for g in _seen):
                _seen.append(graph)
            return _original(data)

        setattr(model, name, counting)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 8)).astype("float32")
    y = rng.integers(0, 3, 100)
    calls = {"fit": lambda: model.fit(x, y, batch_size=32, epochs=2, verbose=0,
                                      validation_data=(x[:50], y[:50])),
             "evaluate": lambda: model.evaluate(x, y, batch_size=32, verbose=0),
             "predict": lambda: model.predict(x, batch_size=32, verbose=0)}
    found = {}
    for phase in PHASES:
        before = {name: len(seen) for name, seen in graphs.items()}
        calls[phase.split()[0]]()
        found[phase] = {name: len(seen) - before[name] for name, seen in graphs.items()
                        if len(seen) > before[name]}
    return found


def assert_no_more(kmp_counts: dict, plain: dict) -> None:
    """kmp traces each step no more often than plain Keras in each phase, and nothing again."""
    assert plain["fit"].get("train_step"), plain  # the counting counts
    for phase, names in plain.items():
        for name in set(kmp_counts[phase]) | set(names):
            assert kmp_counts[phase].get(name, 0) <= names.get(name, 0), (phase, name,
                                                                          kmp_counts, plain)
    for phase in ("fit again", "evaluate again", "predict again"):
        assert kmp_counts[phase] == {}, kmp_counts


#: Each case: the devices each side trains on, `None` for no strategy (plain Keras on one
#: device; kmp's `strategy="default"`).
CASES = {"two": ["/cpu:0", "/cpu:1"], "one_mirrored": ["/cpu:0"], "one": None}


def side(name: str, case: str, steps_per_execution: int) -> dict:
    """`traces` of one side of one case, in this process (2 simulated CPU devices)."""
    import keras_mgpu_plugins as kmp

    kmp.simulate_devices(2)
    devices = CASES[case]
    if name == "kmp":
        strategy = "default" if devices is None else "mirrored"
        return traces(kmp.parallelize(strategy=strategy, devices=devices)(build)(steps_per_execution))
    if devices is None:
        return traces(build(steps_per_execution))
    import tensorflow as tf

    with tf.distribute.MirroredStrategy(devices).scope():
        return traces(build(steps_per_execution))


def in_fresh_process(name: str, case: str, steps_per_execution: int, folder) -> dict:
    """`side(...)` run by `python -m tests.compilations` (from the repository's root)."""
    import os
    import pathlib
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[1]
    out = pathlib.Path(folder) / f"{name}-{case}-{steps_per_execution}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "tests.compilations", name, case,
                           str(steps_per_execution), str(out)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


if __name__ == "__main__":
    found = side(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    with open(sys.argv[4], "w", encoding="utf-8") as f:
        json.dump(found, f)
