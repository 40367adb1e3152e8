"""The environment `kmp.launch` gives workers sharing a host, seen from the workers.

The allocator setting works around TensorFlow page-faulting its buffers in at
every step under several workers (`_compat_env`): the test counts the minor page
faults of real 2-worker fits with it and with glibc's default top pad.
"""

from __future__ import annotations

import os

import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.compat import _env as _compat_env
from keras_mgpu_plugins.launch._tuning import usable_cpus

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(300)]

GLIBC_DEFAULT_TOP_PAD = "glibc.malloc.top_pad=131072"


def _environment():
    return {name: os.environ.get(name) for name in
            ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "GLIBC_TUNABLES")}


def test_workers_get_their_share_of_the_cores_and_the_top_pad():
    share = str(max(1, usable_cpus() // 2))
    tunables = _compat_env.TUNABLE if _compat_env.applies(_compat_env.tensorflow_version()) else None
    seen = kmp.launch(_environment, 2, create_strategy=False)
    assert seen == [{"TF_NUM_INTRAOP_THREADS": share, "TF_NUM_INTEROP_THREADS": share,
                     "GLIBC_TUNABLES": tunables}] * 2
    alone = kmp.launch(_environment, 1, create_strategy=False)[0]
    assert alone["TF_NUM_INTRAOP_THREADS"] is None and alone["GLIBC_TUNABLES"] == tunables


def test_the_users_own_values_are_kept():
    env = {"TF_NUM_INTRAOP_THREADS": "5", "GLIBC_TUNABLES": GLIBC_DEFAULT_TOP_PAD}
    seen = kmp.launch(_environment, 2, create_strategy=False, env=env)[1]
    assert seen["TF_NUM_INTRAOP_THREADS"] == "5"
    assert seen["GLIBC_TUNABLES"] == GLIBC_DEFAULT_TOP_PAD


def _page_faults_per_step(steps: int = 48) -> float:
    import resource

    import keras
    import numpy as np

    @kmp.parallelize
    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer="adam", steps_per_execution=16,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    model = build()
    x = np.random.default_rng(0).normal(size=(256 * steps, 64)).astype("float32")
    y = np.zeros(len(x), "int64")
    model.fit(x, y, batch_size=256, verbose=0)  # traces; the heaps reach their size
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model.fit(x, y, batch_size=256, verbose=0)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps


@pytest.mark.slow
@pytest.mark.skipif(not _compat_env.applies(_compat_env.tensorflow_version()),
                    reason="the allocator workaround is known for glibc and TensorFlow "
                           f"{_compat_env.MIN_TENSORFLOW} to <{_compat_env.MAX_TENSORFLOW}")
def test_two_workers_do_not_fault_their_buffers_in_at_every_step():
    tuned = kmp.launch(_page_faults_per_step, 2, timeout=240)
    untuned = kmp.launch(_page_faults_per_step, 2, timeout=240,
                         env={"GLIBC_TUNABLES": GLIBC_DEFAULT_TOP_PAD})
    # About 50 against 3,000 per step on the development machine (TensorFlow 2.21).
    assert max(tuned) < 400, f"minor page faults per step with kmp's environment: {tuned}"
    assert min(untuned) > 4 * max(tuned), (
        f"without the top pad: {untuned} page faults per step, with it: {tuned}; if they are "
        "close, TensorFlow no longer needs the workaround (_compat_env)")
