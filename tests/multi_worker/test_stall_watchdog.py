"""`kmp.callbacks.StallWatchdog` with 2 real workers.

A hang on one worker (worker 1 sleeps forever in `on_epoch_end` of its second
epoch, or in a batch hook while worker 0 waits inside the compiled train step)
ends the job with both workers' stacks and a verdict naming worker 1; a slow
but progressing fit (a train step that takes longer than the timeout to trace,
evaluation) runs to its end; differing timeouts raise on both.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap
import time

import pytest

import keras_mgpu_plugins as kmp

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(300)]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

HANG_SCRIPT = """
import os, time
import numpy as np
import keras
import keras_mgpu_plugins as kmp

index = int(os.environ["KMP_WORKER_INDEX"])

def sleep_forever_in_epoch_end():
    print(f"HANG at {time.time():.3f}", flush=True)
    while True:
        time.sleep(1)

class HangOnWorker1(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if index == 1 and epoch == 1:
            sleep_forever_in_epoch_end()

@kmp.parallelize
def build():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model

x = np.ones((64, 4), "float32")
build().fit(x, x[:, :1], batch_size=16, epochs=5, verbose=0, callbacks=[HangOnWorker1()])
print("fit returned", flush=True)
"""


def _launch(tmp_path, script_text, stall_timeout, options=("--timeout", "240", "--all-output"),
            env=None):
    """Runs a script on 2 workers under `kmp-launch --stall-timeout` (with `stall_timeout=None`,
    the launcher's default); (exit code, output, end)."""
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent(script_text))
    env = {**{k: v for k, v in os.environ.items() if k != "KMP_STALL_TIMEOUT"},
           "PYTHONPATH": os.pathsep.join(
               filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])), **(env or {})}
    stall = [] if stall_timeout is None else ["--stall-timeout", str(stall_timeout)]
    done = subprocess.run(
        [sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2", *options, *stall,
         str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    return done.returncode, done.stdout + done.stderr, time.time()


def test_a_hang_on_worker_1_fails_the_job_with_both_stacks(tmp_path):
    """`kmp-launch --stall-timeout 20` gives every fit `StallWatchdog(timeout=20)`."""
    returncode, out, ended = _launch(tmp_path, HANG_SCRIPT, 20)
    assert returncode == 70, out[-3000:]
    assert "fit returned" not in out
    hang = float(re.search(r"\[worker 1\] HANG at ([\d.]+)", out).group(1))
    assert ended - hang < 60, (ended - hang, out[-3000:])  # 20 s timeout, then the stop
    for worker in (0, 1):
        assert (f"[worker {worker}] StallWatchdog: no worker made progress for 20 seconds "
                "(timeout=20); stuck: worker 1\n") in out
        assert f"[worker {worker}] StallWatchdog: Python stacks of worker {worker} of 2" in out
        assert re.search(rf"\[worker {worker}\] Thread 0x[0-9a-f]+ \(MainThread\)", out)
    assert re.search(r"\[worker 1\]   File \".*hang.py\", line \d+ in sleep_forever_in_epoch_end",
                     out)
    assert re.search(r"\[worker 0\]   worker 0: waiting inside TensorFlow at .*called from "
                     r"<module> \(.*hang.py:\d+\)", out)
    assert re.search(r"\[worker 0\]   worker 1: stuck in sleep_forever_in_epoch_end "
                     r"\(.*hang.py:\d+\)", out)
    assert re.search(r"\[worker 0\]   File \".*hang.py\", line \d+ in <module>", out)
    assert ("kmp-launch: worker 0 of 2 was stopped by StallWatchdog (exit code 70)" in out
            or "kmp-launch: worker 1 of 2 was stopped by StallWatchdog (exit code 70)" in out)


def test_a_hang_fails_the_job_by_default_naming_the_stuck_worker_with_its_stack(tmp_path):
    """No --stall-timeout: the launcher's default watchdog, its timeout test-sized through
    KMP_STALL_TIMEOUT (the default's own source, else 600 s)."""
    returncode, out, _ = _launch(tmp_path, HANG_SCRIPT, None, env={"KMP_STALL_TIMEOUT": "10"})
    assert returncode == 70, out[-3000:]
    assert "fit returned" not in out
    assert ("StallWatchdog: no worker made progress for 10 seconds (timeout=10); "
            "stuck: worker 1\n") in out, out[-3000:]
    assert re.search(r"\[worker 1\]   File \".*hang.py\", line \d+ in sleep_forever_in_epoch_end",
                     out)
    assert re.search(r"kmp-launch: worker [01] of 2 was stopped by StallWatchdog \(exit code 70\)",
                     out)


def test_timeout_names_the_stuck_worker_and_prints_its_stack(tmp_path):
    """No watchdog (--stall-timeout 0): --timeout ends the hang. Worker 1's output is not
    shown (worker 0's only), yet its stack is in the launcher's message."""
    returncode, out, _ = _launch(tmp_path, HANG_SCRIPT, 0, options=("--timeout", "45"))
    assert returncode == 124, out[-3000:]
    assert ("kmp-launch: The run did not finish within timeout=45.0 seconds: workers 0, 1 of 2 "
            "had not finished. All workers were stopped.\n") in out, out[-3000:]
    assert re.search(r"\n  worker 0: inside TensorFlow at .*called from <module> "
                     r"\(.*hang.py:\d+\)\n", out), out[-3000:]
    assert re.search(r"\n  worker 1: in sleep_forever_in_epoch_end \(.*hang.py:\d+\)\n", out)
    assert "\n  Likely stuck: worker 1, outside TensorFlow and JAX" in out
    assert "\nPython stacks of worker 1 of 2 (all threads):\n" in out
    assert re.search(r"\[worker 1\]   File \".*hang.py\", line \d+ in sleep_forever_in_epoch_end",
                     out)
    assert "StallWatchdog" not in out


def test_a_hang_in_a_batch_hook_is_caught_while_the_other_waits_in_the_train_step(tmp_path):
    """Worker 0 waits inside the compiled train step (a `tf.function` call, not tracing)."""
    script = HANG_SCRIPT.replace("def on_epoch_end(self, epoch, logs=None):",
                                 "def on_train_batch_end(self, batch, logs=None):").replace(
        "if index == 1 and epoch == 1:", "if index == 1 and batch == 1:")
    returncode, out, _ = _launch(tmp_path, script, 10)
    assert returncode == 70, out[-3000:]
    assert ("[worker 0] StallWatchdog: no worker made progress for 10 seconds (timeout=10); "
            "stuck: worker 1\n") in out, out[-3000:]
    assert re.search(r"\[worker 0\]   worker 0: waiting inside TensorFlow at ", out)
    assert re.search(r"\[worker 0\]   worker 1: stuck in sleep_forever_in_epoch_end", out)


def fit_on_worker_0_only():
    import keras
    import numpy as np

    from keras_mgpu_plugins._progress import clock

    if kmp.topology().worker_index == 1:
        return "no fit"
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])  # under no strategy
    model.compile("sgd", "mse")
    x = np.ones((16, 4), "float32")
    started = time.monotonic()
    model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0)
    return time.monotonic() - started, clock.count


def test_a_fit_that_spans_no_workers_is_watched_alone():
    """The launcher's watchdog is in the fit (its hooks counted progress), and does not wait
    for worker 1, which runs no fit: no collective joins the two, so no peer can stall it."""
    (took, progress), other = kmp.launch(fit_on_worker_0_only, num_workers=2,
                                         create_strategy=False, stall_timeout=20, timeout=120)
    assert other == "no fit"
    assert progress >= 2 * 2 + 2 * 2 and took < 20, (took, progress)


#: Seconds the train step takes to trace in `fit_then_differ`: 4 s above its watchdog's timeout.
TRACE_S = 12


def fit_then_differ():
    import keras
    import numpy as np

    from keras_mgpu_plugins.callbacks import _stall
    from keras_mgpu_plugins.callbacks.stall_watchdog import StallWatchdog

    class SlowToTrace(keras.layers.Layer):
        def call(self, inputs, training=None):
            if training:  # Python in `call` runs while the train step is traced, not per step
                time.sleep(TRACE_S)
            return inputs

    @kmp.parallelize
    def build():
        model = keras.Sequential([keras.Input((4,)), SlowToTrace(), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model

    rank = kmp.topology().worker_index
    x = np.ones((64, 4), "float32")
    model = build()
    started = time.monotonic()
    history = model.fit(x, x[:, :1], batch_size=16, epochs=3, verbose=0,
                        validation_data=(x, x[:, :1]),
                        callbacks=[StallWatchdog(timeout=TRACE_S - 4)])
    first_fit_s = time.monotonic() - started
    board = _stall.Board(os.path.join(os.environ["KMP_JOB_DIR"], "stall_watchdog"), rank)
    # Each worker marks itself finished in its own on_train_end; nothing orders that against
    # this worker's return from fit, so wait (bounded) for the peer's mark.
    deadline = time.monotonic() + 60
    while True:
        states = [r and r.state for r in board.read(2, since=0).values()]
        if states == ["finished", "finished"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    from keras_mgpu_plugins._progress import clock

    before = clock.count
    kmp.collective.agree(True, model.distribute_strategy)  # entered and left: 2 progress events
    collective_progress = clock.count - before
    try:
        model.fit(x, x[:, :1], epochs=1, verbose=0, callbacks=[StallWatchdog(timeout=10 + rank)])
        differing = None
    except Exception as err:  # noqa: BLE001 - the message is the result
        differing = f"{type(err).__name__}: {err}"
    return {"epochs": len(history.history["loss"]), "first_fit_s": first_fit_s,
            "collective_progress": collective_progress,
            "states": states, "differing": differing}


def test_progressing_fit_finishes_and_differing_timeouts_raise_on_both():
    results = kmp.launch(fit_then_differ, num_workers=2, timeout=240)
    for rank, r in enumerate(results):
        assert r["epochs"] == 3 and r["states"] == ["finished", "finished"], r
        assert r["collective_progress"] == 2
        assert r["differing"] == (
            "SettingsDifferError: StallWatchdog must be created with the same arguments on "
            "every worker: they decide where it runs collective operations, and a worker that "
            "runs fewer would leave the others waiting. Differing: timeout (here "
            f"{10.0 + rank!r}; differs from the chief's on worker(s) 1).")
        assert r["first_fit_s"] > TRACE_S  # the tracing alone outlasted the timeout
    print("first fit took", [r["first_fit_s"] for r in results], f"s with timeout={TRACE_S - 4}")


def fit_with_watchdog_on_worker_0_only():
    import keras
    import numpy as np

    from keras_mgpu_plugins.callbacks.stall_watchdog import StallWatchdog

    @kmp.parallelize
    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model

    rank = kmp.topology().worker_index
    x = np.ones((64, 4), "float32")
    callbacks = [StallWatchdog(timeout=10)] if rank == 0 else []
    try:
        build().fit(x, x[:, :1], batch_size=16, epochs=2, verbose=0, callbacks=callbacks)
    except kmp.collective.SettingsDifferError as err:
        return str(err)
    return "fit returned"


@pytest.mark.timeout(240)
def test_a_watchdog_on_one_worker_only_raises_on_every_worker():
    """fit's kmp-callback check (one all-gather, the first thing at train begin on every
    worker) names it on both, before the watchdog's own out-of-band check or any step."""
    first, second = kmp.launch(fit_with_watchdog_on_worker_0_only, num_workers=2, timeout=200)
    assert first.startswith("model.fit was given different kmp callbacks on different workers: "
                            "here (worker 0) ['StallWatchdog']"), first
    assert second.startswith("model.fit was given different kmp callbacks on different workers: "
                             "here (worker 1) []"), second
    for message in (first, second):
        assert "kmp_callbacks (here" in message and "on worker(s) 1" in message, message
