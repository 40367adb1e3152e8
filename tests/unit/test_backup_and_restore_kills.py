"""`BackupAndRestore` killed at each point of its writes restores a whole backup, or none.

A child process trains with the callback and SIGKILLs itself right before or
right after its k-th `os.replace` (the only step that publishes a file: see
`io.atomic`), so every crash point between the files of a backup is hit, in a
fixed order (no randomness). The relaunch in this process must then resume
from the last complete backup (or start from scratch, with a warning, when
the first one was cut), and end with the weights of an uninterrupted run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest

from keras_mgpu_plugins.callbacks import BackupAndRestore
from keras_mgpu_plugins.io import atomic

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import keras, numpy as np
    from keras_mgpu_plugins.callbacks import BackupAndRestore
    folder, kill_at, when, double = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
    real_replace, count = os.replace, [0]

    def replace(src, dst):
        count[0] += 1
        if count[0] == kill_at and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)
        if count[0] == kill_at and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = replace
    sys.path.insert(0, os.path.dirname(__file__))
    from model import build, data
    x, y = data()
    build().fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False,
                callbacks=[BackupAndRestore(folder, double_checkpoint=double)])
    sys.exit(3)  # never reached: the kill point is within the first two backups
    """
)

MODEL = textwrap.dedent(
    """
    import keras, numpy as np

    class Canary(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.counter = self.add_weight(shape=(), initializer="zeros", trainable=False)

        def call(self, x):
            self.counter.assign_add(1)
            return x

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), Canary(), keras.layers.Dense(2)])
        model.compile(loss="mse", optimizer=keras.optimizers.Adam(0.05))
        return model

    def data():
        rng = np.random.default_rng(0)
        return rng.random((12, 3)).astype("float32"), rng.random((12, 2)).astype("float32")
    """
)

# (double_checkpoint, k, before/after the k-th os.replace, epochs completed and backed up).
# Without double_checkpoint a backup replaces the metadata, then the weights; with it, a
# backup that has a predecessor first copies the metadata and the weights to *.bkp.
POINTS = [
    (False, 1, "before", 0),  # first weights staged, nothing replaced
    (False, 1, "after", 0),  # first metadata in place, no weights: no backup, a warning
    (False, 2, "after", 1),  # first backup whole
    (False, 3, "after", 1),  # second metadata beside the first weights
    (False, 4, "after", 2),
    (True, 3, "after", 1),  # *.bkp metadata copied
    (True, 4, "after", 1),  # *.bkp weights copied
    (True, 5, "after", 1),  # second metadata beside the first weights
    (True, 6, "after", 2),
]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killed_at_every_write_point_resumes_from_a_whole_backup_or_scratch(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "model.py").write_text(MODEL)
    sys.path.insert(0, str(tmp_path))
    try:
        from model import build, data  # noqa: PLC0415 - written above
    finally:
        sys.path.remove(str(tmp_path))
    x, y = data()
    reference = build()
    reference.fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    children = []
    for i, (double, k, when, _) in enumerate(POINTS):
        folder = tmp_path / f"backup{i}"
        children.append(subprocess.Popen(
            [sys.executable, str(tmp_path / "child.py"), str(folder), str(k), when,
             str(int(double))], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        if len(children) % 3 == 0 or i == len(POINTS) - 1:  # three at a time
            for child in children[-3:]:
                _, err = child.communicate(timeout=300)
                assert child.returncode == -9, err.decode()[-2000:]
    for i, (double, k, when, done) in enumerate(POINTS):
        folder = tmp_path / f"backup{i}"
        epochs = []
        model = build()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False, callbacks=[
                BackupAndRestore(str(folder), double_checkpoint=double, delete_checkpoint=False),
                keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs, seen=epochs: seen.append(e))])
        point = f"double_checkpoint={double}, killed {when} replace {k}"
        assert epochs == list(range(done, 3)), point
        interrupted = [w for w in caught if "interrupted before it completed" in str(w.message)]
        assert bool(interrupted) == (k == 1 and when == "after"), point
        assert int(model.layers[0].counter.numpy()) == 3 * 3, point  # batches, restored + run
        for ours, theirs in zip(model.get_weights(), reference.get_weights(), strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6, err_msg=point)
        assert not [n for n in os.listdir(folder) if atomic.is_temp_name(n)], point
