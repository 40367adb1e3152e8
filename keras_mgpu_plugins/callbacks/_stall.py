"""The parts of `StallWatchdog` that need no Keras: the verdict, stacks, heartbeats.

- `locate(frame)`, `format_stacks()`, `outermost_call`, `has_frame`: reading
  stacks (`_stall_stacks`, imported here).
- `decide(...)`: the pure decision: has every worker gone `timeout` seconds
  without progress, and which ones are stuck rather than waiting?
- `Board`: each worker's heartbeat, a small JSON file in a folder every worker
  can read (the launcher's job folder), or in memory when there is none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Mapping

from keras_mgpu_plugins.callbacks._stall_stacks import (  # noqa: F401 (this module's API)
    format_stacks,
    has_frame,
    locate,
    outermost_call,
)
from keras_mgpu_plugins.io.atomic import write_bytes_atomic


@dataclasses.dataclass(frozen=True)
class Report:
    """One worker's heartbeat.

    Attributes:
        worker: Its index.
        idle_s: Seconds since its last progress, when written.
        written_at: Wall time it was written.
        progress: Number of progress events so far (batches, epochs, ...).
        state: `"running"`, `"busy"` (clock paused) or `"finished"`.
        inside_tf: Whether its training thread is inside a TensorFlow op.
        where: Where its training thread is, in words.
    """

    worker: int
    idle_s: float
    written_at: float
    progress: int
    state: str
    inside_tf: bool
    where: str

    def idle_at(self, now: float) -> float:
        """Seconds without progress at wall time `now` (a stale file counts too)."""
        return self.idle_s + max(0.0, now - self.written_at)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A stall: who is stuck, and the message every worker prints."""

    stuck: tuple[int, ...]
    message: str


#: Seconds after which a heartbeat no longer tells where its worker is (it is written
#: every second or faster): the verdict waits for a fresh one.
STALE_S = 5.0


def decide(reports: Mapping[int, Report | None], num_workers: int, timeout: float,
           now: float, unreported_idle: float, stale_after: float = STALE_S) -> Verdict | None:
    """Whether the job is stalled: no worker made progress for `timeout` seconds.

    A worker without a report counts as idle for `unreported_idle` seconds (it
    never started watching: stuck before training). Finished workers do not
    count; a busy one (tracing, saving) means no stall. Stuck are the workers
    outside TensorFlow (a worker inside TensorFlow may be waiting for a peer in
    a collective); if every worker is inside TensorFlow, those with the least
    progress. A report older than `stale_after` seconds shows where its worker
    was, not where it is: the verdict waits for a fresher one, and names the
    worker stuck once its heartbeat has been silent for `timeout` (a waiting
    worker's watchdog thread keeps writing, since TensorFlow releases the GIL
    while it waits; a silent one is stopped, or blocks Python in a native call).

    Returns:
        The verdict, or `None` while some worker progresses.
    """
    idle: dict[int, float] = {}
    for worker in range(num_workers):
        report = reports.get(worker)
        if report is not None and report.state == "finished":
            continue
        if report is not None and report.state == "busy":
            return None
        idle[worker] = report.idle_at(now) if report is not None else unreported_idle
    if not idle or min(idle.values()) < timeout:
        return None
    missing = [w for w in idle if reports.get(w) is None]
    age = {w: now - reports[w].written_at for w in idle if w not in missing}
    if any(stale_after < a < timeout for a in age.values()):
        return None  # where that worker is now is not known yet
    silent = [w for w, a in age.items() if a >= max(timeout, stale_after)]
    outside = [w for w in age if w not in silent and not reports[w].inside_tf]
    if missing or silent or outside:
        stuck = tuple(sorted(missing + silent + outside))
    else:
        least = min(reports[w].progress for w in idle)
        stuck = tuple(w for w in idle if reports[w].progress == least)
    lines = [f"StallWatchdog: no worker made progress for {timeout:g} seconds "
             f"(timeout={timeout:g}); stuck: worker {', '.join(map(str, stuck))}"]
    for worker in sorted(idle):
        report = reports.get(worker)
        if report is None:
            lines.append(f"  worker {worker}: stuck: it never reported (no StallWatchdog "
                         f"running there, or it is stuck before training began).")
            continue
        if worker in silent:
            lines.append(f"  worker {worker}: stuck: its heartbeat stopped {age[worker]:.0f} s "
                         "ago (the process is stopped, or a native call holds Python's GIL); "
                         f"it was last seen {report.where}.")
            continue
        role = "stuck" if worker in stuck else "waiting"
        lines.append(f"  worker {worker}: {role} {report.where}; no progress for "
                     f"{report.idle_at(now):.0f} s after {report.progress} progress events.")
    if not missing and not silent and not outside:
        lines.append("  Every worker is inside TensorFlow: the stuck one is the one with the "
                     "least progress (a stuck input pipeline, or a collective no peer joined).")
    return Verdict(stuck, "\n".join(lines))


def decide_alone(report: Report, worker: int, timeout: float, now: float) -> Verdict | None:
    """Whether this worker, which reads no other worker's heartbeat (no folder every worker
    can read: a job a scheduler started on several hosts), is stalled.

    Only its own progress is known, so it names only itself: outside its framework (in
    Python: a callback, the input, a deadlock) for `timeout` seconds, it is stuck; inside it
    (a step, a collective: possibly waiting for a peer stuck elsewhere, which then fails
    first and ends the job) it fails only after twice `timeout`, as a worker that waited.
    """
    if report.state in ("finished", "busy"):
        return None
    idle = report.idle_at(now)
    alone = ("Each worker judges only its own progress here: no folder every worker can read "
             "(pass StallWatchdog(directory=...) on a file system every worker shares to "
             "name the stuck worker from every worker).")
    if not report.inside_tf and idle >= timeout:
        return Verdict((worker,), (
            f"StallWatchdog: worker {worker} made no progress for {timeout:g} seconds "
            f"(timeout={timeout:g}); stuck: worker {worker}\n  worker {worker}: stuck "
            f"{report.where}; no progress for {idle:.0f} s after {report.progress} progress "
            f"events.\n  {alone}"))
    if report.inside_tf and idle >= 2 * timeout:
        return Verdict((), (
            f"StallWatchdog: worker {worker} made no progress for {idle:.0f} seconds, twice "
            f"timeout={timeout:g}, waiting {report.where}: a peer is stuck or gone, or a "
            f"collective no peer joined.\n  {alone}"))
    return None


class Board:
    """Heartbeats of every worker: files in `directory`, or in memory without one."""

    def __init__(self, directory: str | None, worker: int) -> None:
        self.directory, self.worker = directory, worker
        self._memory: dict[int, Report] = {}
        if directory is not None:
            os.makedirs(directory, exist_ok=True)

    def _path(self, name: str) -> str:
        return os.path.join(self.directory or "", name)

    def publish(self, report: Report) -> None:
        if self.directory is None:
            self._memory[report.worker] = report
            return
        write_bytes_atomic(self._path(f"heartbeat-{report.worker}.json"),
                      json.dumps(dataclasses.asdict(report)))

    def read(self, num_workers: int, since: float) -> dict[int, Report | None]:
        """Each worker's latest report; `None` if absent or written before `since`."""
        if self.directory is None:
            return {w: self._memory.get(w) for w in range(num_workers)}
        reports: dict[int, Report | None] = {}
        for worker in range(num_workers):
            try:
                with open(self._path(f"heartbeat-{worker}.json")) as f:
                    report = Report(**json.load(f))
            except (OSError, ValueError, TypeError):
                report = None
            reports[worker] = report if report is None or report.written_at >= since else None
        return reports

    def claim(self, message: str) -> str:
        """Records the stall once for the job; returns the message recorded first."""
        if self.directory is None:
            return message
        tmp = self._path(f".stall-{self.worker}.tmp")
        write_bytes_atomic(tmp, message)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, self._path("stall.txt"))
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return self.stall() or message

    def stall(self) -> str | None:
        """The job's stall message, if a worker recorded one."""
        if self.directory is None:
            return None
        try:
            with open(self._path("stall.txt")) as f:
                return f.read()
        except OSError:
            return None

    def dumped(self, num_workers: int, wait_s: float) -> None:
        """Marks this worker's stacks as printed; waits (up to `wait_s`) for the others'."""
        if self.directory is None:
            return
        write_bytes_atomic(self._path(f"dumped-{self.worker}"), "")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not all(
                os.path.exists(self._path(f"dumped-{w}")) for w in range(num_workers)):
            time.sleep(0.1)


def meet(directory: str, worker: int, num_workers: int, fit: int, settings: Mapping,
         wait_s: float) -> list[int]:
    """Out of band, before any collective: which workers run no watchdog in this fit?

    Writes this worker's `settings-{worker}.json` (`fit`: how many fits with a
    watchdog this process began; `settings`) and waits up to `wait_s` seconds
    for every worker's file of the same fit. A worker with a watchdog writes
    its file at its train begin, so one whose file never comes has none (or is
    stuck before training). Files older than `wait_s` + 60 s are a previous
    job's. Runs no collective: a worker without a watchdog would not join it.

    Returns:
        The workers whose file did not come, in order (empty: all are there).
    """
    now, path = time.time(), os.path.join(directory, f"settings-{worker}.json")
    mine = {"fit": fit, "written_at": now, "settings": dict(settings), "gave_up": False}
    write_bytes_atomic(path, json.dumps(mine))
    deadline, missing = time.monotonic() + wait_s, list(range(num_workers))
    while True:
        missing = [w for w in missing if not _met(directory, w, fit, now - wait_s - 60.0)]
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if missing:  # a late peer must not take this worker, about to raise, as present
        write_bytes_atomic(path, json.dumps({**mine, "gave_up": True}))
    return missing


def _met(directory: str, worker: int, fit: int, since: float) -> bool:
    try:
        with open(os.path.join(directory, f"settings-{worker}.json")) as f:
            seen = json.load(f)
        return seen["fit"] >= fit and seen["written_at"] >= since and not seen["gave_up"]
    except (OSError, ValueError, TypeError, KeyError):
        return False
