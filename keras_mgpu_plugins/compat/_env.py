"""A TensorFlow workaround set through the environment of the workers kmp starts.

tensorflow/tensorflow#9757 (and #3009): with glibc's malloc, TensorFlow on CPU
can spend much of a step in page faults. Under MultiWorkerMirroredStrategy,
every step's buffers (the packed gradients, the ring all-reduce's chunks, the
gRPC messages, the optimizer's temporaries) are allocated in the arenas of
several threads; glibc grows an arena's heap for each one and gives the pages
back when they are freed, so the next step faults them in again. Measured on
TensorFlow 2.21, 2 workers on localhost (`benchmarks/workers_throughput.py`'s
model): 3,255 minor page faults per step, 45% of a worker's CPU time in the
kernel, against 16 per step for one process.

glibc's `top_pad` (how much an arena's heap grows beyond each request, and
keeps when memory is freed) set to 64 MB brings it to about 50 per step: 2
workers went from 0.37x to 0.58-0.64x of one worker's samples per second at
`steps_per_execution=16`, for 18 MB more peak memory per worker. A tunable must
be in the environment when the process starts, so only the launcher can set it
(`kmp.launch`, `kmp-launch`); elsewhere, set it yourself:
`export GLIBC_TUNABLES=glibc.malloc.top_pad=67108864`. Preloading tcmalloc or
jemalloc (`LD_PRELOAD`) works as well; kmp does not look for them.

The launcher does not import TensorFlow, so the version guard reads the
installed distribution's metadata.
"""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Mapping

from keras_mgpu_plugins.compat._checks import CHECKED_BELOW, version_checked

#: TensorFlow versions this is known for (run-tested on 2.21), max exclusive.
MIN_TENSORFLOW = "2.16.0"
MAX_TENSORFLOW = CHECKED_BELOW["tensorflow"]
TOP_PAD_BYTES = 64 << 20
TUNABLE = f"glibc.malloc.top_pad={TOP_PAD_BYTES}"
_TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tf-nightly")


def tensorflow_version() -> str | None:
    """The installed TensorFlow's version, from its metadata (no import)."""
    for name in _TENSORFLOW_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def applies(tf_version: str | None, libc: str | None = None) -> bool:
    """Whether the allocator setting is known to help: glibc and a known TensorFlow."""
    libc = platform.libc_ver()[0] if libc is None else libc
    if libc != "glibc" or tf_version is None:
        return False
    return version_checked(tf_version, MIN_TENSORFLOW, MAX_TENSORFLOW)


def allocator_environ(environ: Mapping[str, str], tf_version: str | None = None,
                      libc: str | None = None) -> dict[str, str]:
    """The variables to add to a worker's `environ` for the workaround (may be empty).

    The user's own setting wins: nothing is added when `environ` already sets
    glibc's top pad (`GLIBC_TUNABLES` with `glibc.malloc.top_pad`, or
    `MALLOC_TOP_PAD_`) or preloads another allocator (`LD_PRELOAD`). Other
    tunables in `GLIBC_TUNABLES` are kept.
    """
    tf_version = tensorflow_version() if tf_version is None else tf_version
    if not applies(tf_version, libc):
        return {}
    tunables = environ.get("GLIBC_TUNABLES", "")
    if ("glibc.malloc.top_pad" in tunables or "MALLOC_TOP_PAD_" in environ
            or environ.get("LD_PRELOAD")):
        return {}
    return {"GLIBC_TUNABLES": ":".join(filter(None, [tunables, TUNABLE]))}
