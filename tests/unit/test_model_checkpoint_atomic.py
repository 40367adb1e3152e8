"""Checkpoints appear complete or not at all, even when the process is killed mid-save.

The helpers of `keras_mgpu_plugins.io.atomic` are tested on files; the
callback is tested by killing a real training process (SIGKILL from here, at
random moments of a loop of saves of a model of a few MB) and loading whatever
is left under the final name.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import keras
import numpy as np
import pytest

from keras_mgpu_plugins.callbacks import ModelCheckpoint
from keras_mgpu_plugins.io import atomic

# --- the helpers -------------------------------------------------------------------


def test_temp_path_is_hidden_beside_the_target_and_keeps_the_suffix(tmp_path):
    target = str(tmp_path / "ckpt-01.weights.h5")
    tmp = atomic.temp_path(target, ".weights.h5")
    assert os.path.dirname(tmp) == str(tmp_path)
    name = os.path.basename(tmp)
    assert name.startswith(".ckpt-01.kmp-tmp-") and name.endswith(".weights.h5")
    assert atomic.is_temp_name(name) and not atomic.is_temp_name("ckpt-01.weights.h5")
    assert tmp != atomic.temp_path(target, ".weights.h5")  # fresh each time


def test_atomic_write_moves_the_complete_file_into_place(tmp_path):
    target = tmp_path / "sub" / "a.bin"
    seen = []

    def write(path):
        seen.append(path)
        assert not target.exists()  # nothing at the final name while writing
        with open(path, "wb") as f:
            f.write(b"x" * 1000)

    atomic.atomic_write(str(target), write, suffix=".bin")
    assert target.read_bytes() == b"x" * 1000
    assert os.listdir(target.parent) == ["a.bin"] and not os.path.exists(seen[0])


def test_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "a.bin"
    target.write_bytes(b"previous")

    def write(path):
        with open(path, "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic.atomic_write(str(target), write)
    assert target.read_bytes() == b"previous" and os.listdir(tmp_path) == ["a.bin"]


def test_writable_problem(tmp_path):
    assert atomic.writable_problem(str(tmp_path)) is None
    assert atomic.writable_problem(str(tmp_path / "not" / "yet")) is None  # would be created
    (tmp_path / "file").write_text("")
    assert "is not a folder" in atomic.writable_problem(str(tmp_path / "file" / "sub"))
    assert atomic.writable_problem("gs://bucket/ckpt") is None  # not probed
    assert atomic.writable_problem("/gcs/bucket/ckpt") is None  # remote for Keras too
    assert os.listdir(tmp_path) == ["file"]  # the probe left nothing


def test_remote_paths_are_the_ones_keras_writes_through_gfile():
    file_utils = pytest.importorskip("keras.src.utils.file_utils")
    paths = ["gs://b/m.keras", "ram://x", "s3://b/k/m.h5", "hdfs://nn/p", "/gcs/b/m.keras",
             "/cns/x", "/hdfs/y", "/tmp/m.keras", "m.keras", "ckpt/gs://x", "", "C:/m.keras",
             "/gcsfuse/m.keras"]
    assert [atomic.is_remote(p) for p in paths] == [file_utils.is_remote_path(p) for p in paths]
    assert [atomic.is_remote(p) for p in paths[:7]] == [True] * 7


def test_atomic_write_to_a_remote_path_copies_a_complete_local_file(tmp_path, monkeypatch):
    import tensorflow as tf

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the local copy is made
    target = f"ram://kmp-atomic-{os.getpid()}/sub/a.weights.h5"
    seen = []

    def write(path):
        seen.append(path)
        assert not tf.io.gfile.exists(target)  # nothing at the final name while writing
        with open(path, "wb") as f:  # a local file, named like the target
            f.write(b"x" * 1000)

    atomic.atomic_write(target, write, suffix=".weights.h5")
    with tf.io.gfile.GFile(target, "rb") as f:
        assert f.read() == b"x" * 1000
    assert os.path.basename(seen[0]) == "a.weights.h5" and seen[0].startswith(str(tmp_path))
    assert os.listdir(tmp_path) == []  # the local copy is gone
    assert atomic.isdir(os.path.dirname(target)) and not atomic.isdir(target)

    def failing(path):
        with open(path, "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic.atomic_write(target, failing)
    with tf.io.gfile.GFile(target, "rb") as f:
        assert f.read() == b"x" * 1000  # the previous file, untouched
    assert os.listdir(tmp_path) == []


def _temp_of(folder, name, host, pid):
    """A temporary named as `temp_path` names it, for another host or process."""
    path = folder / f".{name}{atomic.TEMP_MARKER}{host}-{pid}-0badf00d.keras"
    path.write_bytes(b"partial")
    return path.name


def test_remove_stale_temps_keeps_live_writers_of_any_job_and_host(tmp_path):
    here = atomic.host_tag()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        kept = [
            "a.keras", ".hidden", "x.kmp-tmp-1-2.keras",  # not made by temp_path
            os.path.basename(atomic.temp_path(str(tmp_path / "c.keras"), ".keras")),  # ours
            _temp_of(tmp_path, "live", here, live.pid),  # a second job, still writing
            _temp_of(tmp_path, "remote", "other_host", dead.pid),  # another host's, fresh
            ".old.kmp-tmp-999999-0badf00d.keras",  # an older name format, fresh
        ]
        (tmp_path / kept[0]).write_bytes(b"")
        (tmp_path / kept[1]).write_bytes(b"")
        (tmp_path / kept[2]).write_bytes(b"")
        (tmp_path / kept[3]).write_bytes(b"")
        (tmp_path / kept[6]).write_bytes(b"")
        stale = [_temp_of(tmp_path, "dead", here, dead.pid),  # its writer died
                 _temp_of(tmp_path, "ancient", "other_host", live.pid)]  # untouched for days
        old = time.time() - atomic.STALE_AFTER_S - 60
        os.utime(tmp_path / stale[1], (old, old))
        folder = tmp_path / f".d{atomic.TEMP_MARKER}{here}-{dead.pid}-abcdef01.keras"
        folder.mkdir()  # a folder-shaped leftover
        removed = atomic.remove_stale_temps(str(tmp_path))
        assert sorted(removed) == sorted(stale + [folder.name])
        assert sorted(os.listdir(tmp_path)) == sorted(kept)
    finally:
        live.kill()
        live.wait()
    assert atomic.remove_stale_temps(str(tmp_path / "missing")) == []
    assert atomic.remove_stale_temps("gs://bucket/ckpt") == []


def test_temp_names_carry_host_and_pid_and_the_rule_reads_them():
    name = os.path.basename(atomic.temp_path("/x/m.keras", ".keras"))
    assert f"{atomic.TEMP_MARKER}{atomic.host_tag()}-{os.getpid()}-" in name
    assert atomic.host_tag("node-3.cluster.local") == "node_3_cluster_local"
    assert not atomic.is_stale(name, 10.0)  # this process lives
    assert atomic.is_stale(name, 10.0, alive=lambda pid: False)
    assert not atomic.is_stale(name, 10.0, host="elsewhere", alive=lambda pid: False)
    assert atomic.is_stale(name, atomic.STALE_AFTER_S + 1, host="elsewhere")
    assert not atomic.is_stale("m.keras", 1e9)


# --- SIGKILL during a loop of saves ----------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np, keras
    from keras_mgpu_plugins.callbacks import ModelCheckpoint
    path, weights_only, async_save = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024), keras.layers.Dense(512)])
    model.compile(optimizer="adam", loss="mse")  # ~4 MB of weights, ~12 MB with Adam's slots
    x = np.random.default_rng(0).normal(size=(32, 512)).astype("float32")
    checkpoint = ModelCheckpoint(path, save_freq=1, save_weights_only=weights_only,
                                 async_save=async_save)
    model.fit(x, x, batch_size=32, epochs=1_000_000, verbose=0, callbacks=[checkpoint])
    """
)

KILL_CASES = [  # (file name, weights only, async save)
    ("ckpt.keras", False, False),
    ("ckpt.weights.h5", True, False),
    ("ckpt.h5", False, False),
    ("ckpt.keras", False, True),
    ("ckpt.weights.h5", True, True),
]


def model_like_child():
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024), keras.layers.Dense(512)])
    model.compile(optimizer="adam", loss="mse")
    return model


def start_saving(folder, name, weights_only, async_save):
    """A child process saving `folder/name` at every batch, until it is killed."""
    script = folder / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    return subprocess.Popen(
        [sys.executable, str(script), str(folder / name), str(int(weights_only)), str(int(async_save))],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def kill_during_saves(child, folder, name, in_write, delay):
    """Kills `child` `delay` s after its first complete checkpoint (then, if `in_write`, at
    once when a save is under way); the checkpoint path and the temporaries left."""
    path = folder / name
    try:
        deadline = time.monotonic() + 240
        while not path.exists():  # the first checkpoint is complete
            assert child.poll() is None, child.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the child never saved"
            time.sleep(0.01)
        time.sleep(delay)
        if in_write:  # wait until a save is under way, then kill at once
            while not any(atomic.is_temp_name(n) for n in os.listdir(folder)):
                time.sleep(0.0005)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    return path, [n for n in os.listdir(folder) if atomic.is_temp_name(n)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_killed_process_never_leaves_a_truncated_checkpoint(tmp_path):
    rng = random.Random(17)  # seeded: the same kill moments every run (bounded by deadlines)
    leftovers, folders, children, outcomes = 0, [], [], []
    try:
        for i, (name, weights_only, async_save) in enumerate(KILL_CASES):  # all start at once
            folders.append(tmp_path / f"case{i}")
            folders[-1].mkdir()
            children.append(start_saving(folders[-1], name, weights_only, async_save))
        delays = [rng.uniform(0.0, 0.5) for _ in KILL_CASES]
        with concurrent.futures.ThreadPoolExecutor(len(KILL_CASES)) as pool:  # each at its moment
            outcomes = list(pool.map(kill_during_saves, children, folders,
                                     [name for name, _, _ in KILL_CASES],
                                     [i % 2 == 0 for i in range(len(KILL_CASES))], delays))
    finally:
        for child in children:
            child.kill()
            child.wait()
    for (name, weights_only, _), folder, (path, temps) in zip(KILL_CASES, folders, outcomes,
                                                             strict=True):
        leftovers += bool(temps)
        assert path.exists()  # the checkpoint that was complete before the kill, or a newer one
        if weights_only:
            model = model_like_child()
            model.load_weights(path)
        else:
            model = keras.saving.load_model(path, compile=not name.endswith(".h5"))
        weights = model.get_weights()
        assert [w.shape for w in weights] == [(512, 1024), (1024,), (1024, 512), (512,)]
        assert all(np.isfinite(w).all() for w in weights)
        if temps:  # the next fit's train begin clears what the killed writer left
            x = np.zeros((1, 512), "float32")
            model_like_child().fit(x, x, epochs=1, verbose=0, callbacks=[ModelCheckpoint(
                str(path), save_weights_only=weights_only)])
            assert not [n for n in os.listdir(folder) if atomic.is_temp_name(n)]
    # the kills did land inside saves: some temporary file was cut short, never the final one
    assert leftovers >= 1
