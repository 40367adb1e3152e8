"""What the launcher adds to its workers' environment (`launch._tuning`, `_compat_env`)."""

from __future__ import annotations

import pytest

from keras_mgpu_plugins.compat import _env as _compat_env
from keras_mgpu_plugins.launch._tuning import (
    SHARE_VAR,
    THREAD_VARS,
    threads_line,
    usable_cpus,
    worker_tuning,
)

KNOWN_TF = "2.21.0"


def _allocator(environ, tf_version=KNOWN_TF, libc="glibc"):
    return _compat_env.allocator_environ(environ, tf_version=tf_version, libc=libc)


def test_allocator_top_pad_is_set_on_glibc_for_a_known_tensorflow():
    assert _allocator({}) == {"GLIBC_TUNABLES": "glibc.malloc.top_pad=67108864"}


def test_allocator_keeps_the_users_other_tunables():
    environ = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}
    assert _allocator(environ) == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=4:glibc.malloc.top_pad=67108864"}


@pytest.mark.parametrize("environ", [
    {"GLIBC_TUNABLES": "glibc.malloc.top_pad=131072"},
    {"MALLOC_TOP_PAD_": "0"},
    {"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"},
])
def test_allocator_leaves_the_users_own_setting(environ):
    assert _allocator(environ) == {}


@pytest.mark.parametrize("tf_version,libc", [
    ("2.15.1", "glibc"),  # before the known range
    ("2.22.0", "glibc"),  # nobody checked it yet
    (KNOWN_TF, ""),  # musl, macOS: no glibc tunables
])
def test_allocator_outside_its_known_range_adds_nothing(tf_version, libc):
    assert _allocator({}, tf_version=tf_version, libc=libc) == {}


def test_allocator_without_tensorflow_adds_nothing(monkeypatch):
    monkeypatch.setattr(_compat_env, "tensorflow_version", lambda: None)
    assert _compat_env.allocator_environ({}, libc="glibc") == {}


def test_the_installed_tensorflow_is_read_without_importing_it():
    import sys

    imported = "tensorflow" in sys.modules
    version = _compat_env.tensorflow_version()
    assert version is not None and version[0].isdigit()
    assert ("tensorflow" in sys.modules) == imported


def test_threads_are_shared_between_the_workers_of_a_host_on_every_backend():
    extra = worker_tuning({}, num_workers=2, cpus=16)
    assert {name: extra[name] for name in (*THREAD_VARS, SHARE_VAR)} == {
        "OMP_NUM_THREADS": "8",  # torch's intra-op threads (as torchrun sets it), MKL, oneDNN
        "TF_NUM_INTRAOP_THREADS": "8", "TF_NUM_INTEROP_THREADS": "8",
        "PJRT_NPROC": "8",  # XLA's CPU client (JAX)
        "KMP_WORKER_THREADS": "8"}  # torch's inter-op threads (set at the first fit)
    assert set(worker_tuning({}, num_workers=4, cpus=2).values()) >= {"1"}
    assert worker_tuning({}, num_workers=4, cpus=2)["OMP_NUM_THREADS"] == "1"


def test_one_worker_keeps_the_whole_host():
    assert not set(worker_tuning({}, num_workers=1, cpus=16)) & {*THREAD_VARS, SHARE_VAR}
    assert threads_line("kmp-launch", {}, {}, 1, cpus=16) is None


@pytest.mark.parametrize("users, kept", [
    ({"TF_NUM_INTRAOP_THREADS": "3"}, ["TF_NUM_INTRAOP_THREADS"]),
    ({"OMP_NUM_THREADS": "4"}, ["OMP_NUM_THREADS"]),
    ({"MKL_NUM_THREADS": "4"}, ["OMP_NUM_THREADS"]),  # torch reads MKL's over OpenMP's
    ({"NPROC": "2"}, ["PJRT_NPROC"]),  # XLA reads PJRT_NPROC, then NPROC
    ({"KMP_WORKER_THREADS": "2"}, ["KMP_WORKER_THREADS"]),
])
def test_a_thread_setting_the_user_gave_is_kept_and_said(users, kept):
    extra = worker_tuning(users, num_workers=2, cpus=16)
    assert not set(kept) & set(extra)
    assert {n: extra[n] for n in (*THREAD_VARS, SHARE_VAR) if n not in kept} == {
        n: "8" for n in (*THREAD_VARS, SHARE_VAR) if n not in kept}
    line = threads_line("kmp-launch", users, extra, 2, cpus=16)
    assert line.endswith("; kept yours: " + " ".join(f"{n}={v}" for n, v in users.items()))


def test_the_launchers_line_says_what_it_set():
    extra = worker_tuning({"OMP_NUM_THREADS": "4"}, num_workers=2, cpus=2)
    assert threads_line("kmp-launch", {"OMP_NUM_THREADS": "4"}, extra, 2, cpus=2) == (
        "kmp-launch: threads of each of 2 workers on 2 cores: TF_NUM_INTRAOP_THREADS=1 "
        "TF_NUM_INTEROP_THREADS=1 PJRT_NPROC=1 torch inter-op=1; kept yours: OMP_NUM_THREADS=4")


def test_usable_cpus_follows_the_affinity_mask():
    import os

    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert usable_cpus() == expected
