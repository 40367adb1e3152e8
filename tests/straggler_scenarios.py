"""DeviceMetricsLogger's straggler report on 2 real workers, as each lane's test runs it.

`job()` runs in every worker (`kmp.launch`): a small model trained with `@kmp.parallelize`
on the same `PyDataset` of global batches, once per scenario:

- `"input"`: worker 1's `PyDataset` sleeps `DELAY` s per batch it reads;
- `"host"`: a callback sleeps `DELAY` s at each batch end, on worker 1 only;
- `"none"`: nothing injected (run `QUIET_RUNS` times: no worker may be named).

Each fit's epochs report who was named (`straggler/worker`, `straggler/phase`), the phase
figures, the chief's warnings and the summary's straggler line. The lanes' tests:
`tests/multi_worker/test_device_metrics_stragglers.py` (TensorFlow),
`tests/jax/test_device_metrics_stragglers.py`, `tests/torch/test_device_metrics_stragglers.py`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time

import numpy as np

BATCH, STEPS, EPOCHS, FEATURES = 16, 12, 2, 8
DELAY = 0.03
QUIET_RUNS = 5
SCENARIOS = ("input", "host", *("none",) * QUIET_RUNS)


def analytic_flops() -> float:
    """The model's products per step at 2 FLOPs per multiply-add: forward, and the backward
    pass's weight gradients and the second layer's input gradient (`tests/flop_models.py`)."""
    first, second = 2 * BATCH * FEATURES * 32, 2 * BATCH * 32
    return 2 * first + 3 * second


def build():
    import keras

    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def batches(delay: float):
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * STEPS, FEATURES)).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return STEPS

        def __getitem__(self, i):
            if delay:
                time.sleep(delay)
            return x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]

    return Batches()


def sleeper(delay: float):
    import keras

    class Sleep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(delay)

    return Sleep()


def run(scenario: str, model, rank: int) -> dict:
    import keras_mgpu_plugins as kmp

    slow = rank == 1
    data = batches(DELAY if scenario == "input" and slow else 0.0)
    callbacks = [kmp.callbacks.DeviceMetricsLogger(batch_size=BATCH, sample_interval=None)]
    if scenario == "host" and slow:
        callbacks.append(sleeper(DELAY))
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("keras_mgpu_plugins").addHandler(handler)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            history = model.fit(data, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=callbacks)
    finally:
        logging.getLogger("keras_mgpu_plugins").removeHandler(handler)
    keys = {k: [float(v) for v in values] for k, values in history.history.items()
            if k.startswith(("straggler/", "phase/", "step_time/", "flops/"))}
    summary = [line for line in printed.getvalue().splitlines() if line.startswith(
        ("Stragglers:", "Time per step by phase"))]
    return {"scenario": scenario, "keys": keys, "said": [m for m in said if "held back" in m],
            "summary": summary}


def job() -> dict:
    """Every scenario in turn on one model (each `fit` its own run); this worker's reports."""
    import keras_mgpu_plugins as kmp

    rank = kmp.topology().worker_index
    model = kmp.parallelize(build)()
    return {"rank": rank, "runs": [run(scenario, model, rank) for scenario in SCENARIOS]}


def named(report: dict) -> list[tuple[int, int]]:
    """`(worker, phase code)` named at each epoch of one run (`(-1, 0)`: nobody)."""
    keys = report["keys"]
    return list(zip((int(w) for w in keys["straggler/worker"]),
                    (int(p) for p in keys["straggler/phase"]), strict=True))


def describe(report: dict) -> str:
    """One run's figures, for a failing assertion and the closing note."""
    keys = report["keys"]
    figures = {k: [round(v, 2) for v in values] for k, values in keys.items()
               if k.startswith(("phase/", "straggler/"))}
    return f"{report['scenario']}: {figures}; {report['summary']}; {report['said']}"


def check(reports: list[dict]) -> None:
    """The assertions every lane makes on `job()`'s reports (one per worker)."""
    chief, other = reports
    assert (chief["rank"], other["rank"]) == (0, 1)
    for mine, theirs in zip(chief["runs"], other["runs"], strict=True):
        assert mine["keys"] == theirs["keys"]  # one gathered record, on every worker
        assert theirs["said"] == [] and theirs["summary"] == []  # the chief alone reports
    codes = {"input": 1, "host": 2}
    for report in chief["runs"]:  # counted on 2 workers: elementwise ops add 10-20% here
        assert all(abs(f / analytic_flops() - 1.1) < 0.15 for f in report["keys"]["flops/per_step"])
    for report in chief["runs"]:
        print(describe(report))  # the figures, for the closing note (pytest -rP shows them)
        found = named(report)
        if report["scenario"] == "none":  # no false alarm
            assert found == [(-1, 0)] * EPOCHS, describe(report)
            assert report["said"] == [], describe(report)
            assert report["summary"][-1].startswith("Stragglers: no worker holds"), describe(report)
            continue
        phase = report["scenario"]
        assert found == [(1, codes[phase])] * EPOCHS, describe(report)
        excess = report["keys"]["straggler/excess_ms"]
        # TensorFlow reads ahead on tf.data's thread: the first epoch's median may hold half.
        # Above: a loaded machine's sleep(0.03) took 60 ms in CI (its excess then 59 ms).
        assert all(0.3 * 1000 * DELAY < e < 4.0 * 1000 * DELAY for e in excess), describe(report)
        assert len(report["said"]) == EPOCHS and all(
            f"held back by worker 1 ({phase}:" in m for m in report["said"]), describe(report)
        assert report["summary"][-1].startswith(f"Stragglers: held back by worker 1 ({phase}:")
