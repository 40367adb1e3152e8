"""The conformance table: every promise kmp makes (rows) x every lane x every way of starting
a job (columns), and what each cell is: the promise holds, or the lane refuses it with a
clear error (which the cell's test asserts), or it does not hold yet (the test runs and must
fail, and the docs say so), or the start does not exist on that lane.

`tests/conformance/test_conformance.py` runs every cell of the active lane against this
table; `python -m tests.conformance.render` writes the table into docs/distribution_matrix.md
(a test keeps the two equal), so the docs claim only what the tests run.
"""

from __future__ import annotations

import dataclasses

LANES = ("tensorflow", "jax", "torch")
LANE_TITLES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "torch"}


@dataclasses.dataclass(frozen=True)
class Promise:
    name: str
    title: str
    what: str  # what the cell's test checks


PROMISES = (
    Promise("fit_equal", "fit, evaluate, predict, History equal one device",
            "every worker's weights, History, evaluate and predict within 1e-5 of one process "
            "on one device (shuffled arrays, validation_split); the workers bit-identical"),
    Promise("uneven_batches", "uneven and tiny global batches",
            "a global batch of 7 on 15 rows (uneven on 2, a partial last batch) and a data set "
            "of one row: weights, History and predict within 1e-5 of one device"),
    Promise("chief_writes", "chief-only writes (kmp's and Keras's writers)",
            "ModelCheckpoint, BackupAndRestore and Keras's CSVLogger written by worker 0 "
            "alone; the checkpoint loads, the CSV holds one device's History"),
    Promise("early_stopping", "EarlyStopping stops every worker together",
            "every worker stops at one device's epoch; restore_best_weights gives one "
            "device's weights"),
    Promise("stop_signal_resume", "SIGTERM: save, stop, resume mid-epoch",
            "SIGTERM to worker 1 mid-epoch: every worker stops at the same step, exit code "
            "75; the rerun's callbacks see the first untrained batch first, with its real "
            "index and full logs"),
    Promise("sigkill_resume", "SIGKILL mid-epoch, rerun: bit-exact",
            "worker 1 killed mid-epoch after a resume, the job run again: final weights "
            "bit-identical to the uninterrupted run's"),
    Promise("elastic_resume", "resume on another number of workers",
            "the backup of a 2-worker (2-device) run stopped by SIGTERM, resumed on 1: final "
            "weights within 1e-5 of the uninterrupted run's"),
    Promise("undecorated_refused", "training without @kmp.parallelize refused on several processes",
            "a model built without the decorator, kmp's callbacks given: every process "
            "refuses before the first step, naming @kmp.parallelize (one process: trains as "
            "one device)"),
    Promise("stall_error", "a stalled worker becomes an error naming it",
            "worker 1 sleeps in a step: every process ends within the StallWatchdog's "
            "timeout and a margin, the output names worker 1 and shows its stack"),
    Promise("failure_exit", "a failing worker fails the job fast, with its cause",
            "worker 1 raises: every process ends by itself within 60 s, the job's exit code "
            "is 1 and its output names worker 1's exception"),
    Promise("version_policy", "an unchecked Keras is refused alike",
            "a Keras release kmp has not checked (a pre-release): every process refuses "
            "before training, naming KMP_ALLOW_UNCHECKED_VERSIONS"),
)
BY_PROMISE = {p.name: p for p in PROMISES}


@dataclasses.dataclass(frozen=True)
class Holds:
    """The promise holds in this cell."""

    mark = "holds"


@dataclasses.dataclass(frozen=True)
class Refused:
    """The lane refuses this: `error` (a type name) whose message contains `match`."""

    error: str
    match: str
    why: str
    mark = "refused"


@dataclasses.dataclass(frozen=True)
class Fails:
    """The promise does not hold here yet: `why` says what differs. The cell's test runs and
    is expected to fail (strictly: the day it passes, the table must say so)."""

    why: str
    mark = "fails"


@dataclasses.dataclass(frozen=True)
class Absent:
    """The start does not exist on this lane (no cell)."""

    why: str
    mark = "absent"


TORCH_DEVICES = Refused(
    "NotImplementedError", "one device per process",
    "Keras on torch trains on one device per process: 2 devices are 2 processes")
NO_TORCHRUN = Absent("torchrun comes with torch, which this lane does not install")

#: Exceptions to "holds": (promise or "*", lane, start) -> the cell.
CELLS: dict[tuple[str, str, str], Holds | Refused | Fails | Absent] = {
    **{("*", lane, "torchrun"): NO_TORCHRUN for lane in ("tensorflow", "jax")},
    ("*", "torch", "devices"): TORCH_DEVICES,
}


def cell(promise: str, lane: str, start: str) -> Holds | Refused | Fails | Absent:
    """What the table says of one cell."""
    return CELLS.get((promise, lane, start)) or CELLS.get(("*", lane, start)) or Holds()
