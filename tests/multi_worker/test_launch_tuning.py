"""The environment `kmp.launch` gives workers sharing a host, seen from the workers.

Run with each lane's backend (`.ci/run` lists this file in every subset): the thread shares
are the same variables on every lane; on torch the workers' inter-op threads are checked too.

The allocator setting works around TensorFlow page-faulting its buffers in at
every step under several workers (`_compat_env`): the test counts the minor page
faults of real 2-worker fits with it and with glibc's default top pad.
"""

from __future__ import annotations

import os

import keras
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.compat import _env as _compat_env
from keras_mgpu_plugins.launch._tuning import usable_cpus

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(300)]

GLIBC_DEFAULT_TOP_PAD = "glibc.malloc.top_pad=131072"


NAMES = ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "PJRT_NPROC",
         "KMP_WORKER_THREADS", "GLIBC_TUNABLES")


def _environment():
    return {name: os.environ.get(name) for name in NAMES}


@pytest.fixture(autouse=True)
def _no_thread_settings_of_the_test_runner(monkeypatch):
    for name in (*NAMES, "MKL_NUM_THREADS", "NPROC"):
        monkeypatch.delenv(name, raising=False)


def test_workers_get_their_share_of_the_cores_and_the_top_pad(capfd):
    share = str(max(1, usable_cpus() // 2))
    tunables = _compat_env.TUNABLE if _compat_env.applies(_compat_env.tensorflow_version()) else None
    seen = kmp.launch(_environment, 2, create_strategy=False)
    assert seen == [{**dict.fromkeys(NAMES[:-1], share), "GLIBC_TUNABLES": tunables}] * 2
    assert (f"kmp.launch: threads of each of 2 workers on {usable_cpus()} cores: "
            f"OMP_NUM_THREADS={share} TF_NUM_INTRAOP_THREADS={share} TF_NUM_INTEROP_THREADS="
            f"{share} PJRT_NPROC={share} torch inter-op={share}\n") in capfd.readouterr().err
    alone = kmp.launch(_environment, 1, create_strategy=False)[0]
    assert alone == {**dict.fromkeys(NAMES[:-1]), "GLIBC_TUNABLES": tunables}


def test_the_users_own_values_are_kept_and_said(capfd):
    env = {"TF_NUM_INTRAOP_THREADS": "5", "OMP_NUM_THREADS": "3",
           "GLIBC_TUNABLES": GLIBC_DEFAULT_TOP_PAD}
    seen = kmp.launch(_environment, 2, create_strategy=False, env=env)[1]
    assert (seen["TF_NUM_INTRAOP_THREADS"], seen["OMP_NUM_THREADS"]) == ("5", "3")
    assert seen["GLIBC_TUNABLES"] == GLIBC_DEFAULT_TOP_PAD
    assert "; kept yours: OMP_NUM_THREADS=3 TF_NUM_INTRAOP_THREADS=5\n" in capfd.readouterr().err


def _torch_threads(set_first: bool) -> tuple[int, int]:
    """torch's inter-op and intra-op threads in a worker, after one fit (a script that sets
    its inter-op threads first: `set_first`)."""
    import torch

    if set_first:
        torch.set_num_interop_threads(2)
    import keras
    import numpy as np

    @kmp.parallelize
    def build():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    build().fit(np.zeros((8, 2), "float32"), np.zeros((8, 1), "float32"), batch_size=4,
                verbose=0)
    return torch.get_num_interop_threads(), torch.get_num_threads()


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's own thread pools")
def test_torch_workers_get_their_share_of_both_pools_unless_the_script_set_them():
    share = max(1, usable_cpus() // 2)
    assert kmp.launch(_torch_threads, 2, args=(False,), timeout=200) == [(share, share)] * 2
    assert kmp.launch(_torch_threads, 2, args=(True,), timeout=200) == [(2, share)] * 2


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
