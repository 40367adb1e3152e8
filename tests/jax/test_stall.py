"""No hang is silent on JAX either: 2 processes under `kmp.launch`, process 1 stuck in its
second epoch's end while process 0 waits for it inside JAX's collective.

- With no watchdog asked for, the launcher's default one (its timeout test-sized through
  `KMP_STALL_TIMEOUT`, the source of the default) fails the job naming process 1;
- with no watchdog at all (`stall_timeout=None`), `timeout=` ends the job, naming the
  processes that had not finished, where each was, and their stacks.
"""

from __future__ import annotations

import re
import time

import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.launch import LaunchTimeoutError, WorkerFailedError
from tests.jax import helpers

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def jax_env(monkeypatch):
    for key, value in helpers.environment().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("KMP_STALL_TIMEOUT", raising=False)


def sleep_forever_in_epoch_end():
    while True:
        time.sleep(1)


def hang_on_process_1():
    import keras
    import numpy as np

    rank = kmp.runtime.of().worker_index

    class Hang(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if rank == 1 and epoch == 1:
                sleep_forever_in_epoch_end()

    @kmp.parallelize
    def build():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model

    x = np.ones((16, 3), "float32")
    build().fit(x, x[:, :1], batch_size=8, epochs=4, shuffle=False, verbose=0, callbacks=[Hang()])
    return "fit returned"


def test_the_default_watchdog_names_the_stuck_process(jax_env, monkeypatch, tmp_path):
    monkeypatch.setenv("KMP_STALL_TIMEOUT", "8")
    with pytest.raises(WorkerFailedError) as failure:
        kmp.launch(hang_on_process_1, num_workers=2, timeout=200, log_dir=str(tmp_path))
    text = str(failure.value)
    assert "stopped by StallWatchdog (exit code 70)" in text
    assert "no worker made progress for 8 seconds (timeout=8); stuck: worker 1" in text
    stuck = (tmp_path / "worker-1.log").read_text()
    assert "StallWatchdog: Python stacks of worker 1 of 2" in stuck
    assert re.search(r'File ".*test_stall.py", line \d+ in sleep_forever_in_epoch_end', stuck)
    assert re.search(r"worker 0: waiting inside JAX at ", stuck), stuck[-3000:]


def test_timeout_names_the_processes_not_finished_with_their_stacks(jax_env):
    with pytest.raises(LaunchTimeoutError) as failure:
        kmp.launch(hang_on_process_1, num_workers=2, timeout=40, stall_timeout=None)
    err = failure.value
    assert err.running_workers == [0, 1] and sorted(err.stacks) == [0, 1]
    text = str(err)
    assert text.startswith("The run did not finish within timeout=40 seconds: workers 0, 1 of 2 "
                           "had not finished. All workers were stopped.\n")
    assert re.search(r"\n  worker 0: inside JAX at .*called from hang_on_process_1 ", text), text
    assert re.search(r"\n  worker 1: in sleep_forever_in_epoch_end \(.*test_stall.py:\d+\)\n",
                     text), text
    assert "\n  Likely stuck: worker 1, outside TensorFlow and JAX" in text
    assert re.search(r"\[worker 1\]   File \".*test_stall.py\", line \d+ in "
                     r"sleep_forever_in_epoch_end", text)
    assert "sleep_forever_in_epoch_end" in err.stacks[1]
    assert "StallWatchdog" not in text
