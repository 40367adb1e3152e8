"""The processes of a local job: one per task of its cluster, and how each is named.

Without parameter servers every process is a `"worker"` that runs the user's code
(`TF_CONFIG` task `{"type": "worker", "index": i}`, log `worker-<i>.log`). With
`num_ps` (`kmp.launch(fn, num_workers=2, num_ps=1)`, `kmp-launch -n 2 --ps 1`) the
job is TensorFlow's parameter-server cluster: a `"chief"` runs the user's code and
coordinates, `num_workers` `"worker"` tasks run the steps it sends them and `num_ps`
`"ps"` tasks hold the variables; workers and parameter servers only serve
(`parameter_server.cluster.serve`). A lost worker of that cluster is started again
(`MAX_WORKER_RESTARTS` times at most): the coordinator sends its steps to the others
meanwhile and uses it again once it is back.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins.launch._errors import describe_exit

#: How many times the launcher starts again one worker of a parameter-server cluster that
#: exited (killed, preempted, crashed) before it fails the job.
MAX_WORKER_RESTARTS = 3


@dataclasses.dataclass(frozen=True)
class Task:
    """One process of the job: its `TF_CONFIG` task, its name, whether it only serves."""

    task_type: str
    task_index: int
    serves: bool = False

    @property
    def label(self) -> str:
        """`"worker 1"`, `"chief"`, `"ps 0"`: before its output lines and in messages."""
        return "chief" if self.task_type == "chief" else f"{self.task_type} {self.task_index}"

    @property
    def log_name(self) -> str:
        """`worker-1.log`, `chief.log`, `ps-0.log`."""
        if self.task_type == "chief":
            return "chief.log"
        return f"{self.task_type}-{self.task_index}.log"

    @property
    def restartable(self) -> bool:
        """A worker of a parameter-server cluster: it holds no state, the coordinator
        retries its steps elsewhere, and TensorFlow takes it back when it returns."""
        return self.serves and self.task_type == "worker"


def layout(num_workers: int, num_ps: int) -> list[Task]:
    """The job's processes in launch order (the chief first under parameter servers)."""
    if not num_ps:
        return [Task("worker", i) for i in range(num_workers)]
    return ([Task("chief", 0)] + [Task("worker", i, serves=True) for i in range(num_workers)]
            + [Task("ps", i, serves=True) for i in range(num_ps)])


def cluster(tasks: list[Task], ports: list[int]) -> dict[str, list[str]]:
    """The `TF_CONFIG` cluster of `tasks` on localhost, one port each."""
    spec: dict[str, list[str]] = {}
    for task, port in zip(tasks, ports, strict=True):
        spec.setdefault(task.task_type, []).append(f"localhost:{port}")
    return spec


class Restarts:
    """Starts again a lost worker of a parameter-server cluster (`MAX_WORKER_RESTARTS` each).

    Args:
        tasks: The job's tasks, by process index.
        start: Starts the process of a task index; returns its `_process._Worker`.
    """

    def __init__(self, tasks: list[Task], start: Callable[[int], Any]) -> None:
        self.tasks, self.start = tasks, start
        self.counts: dict[int, int] = {}
        self.lost: list[Any] = []  # the processes replaced, for their last lines

    def replace(self, workers: list[Any]) -> None:
        """Replaces, in place, each restartable worker that exited, within its allowance;
        one past it stays: the supervisor reports its failure."""
        for position, w in enumerate(workers):
            if not (self.tasks[w.index].restartable and w.exited_at is not None):
                continue
            count = self.counts.get(w.index, 0)
            if count >= MAX_WORKER_RESTARTS:
                continue
            self.counts[w.index] = count + 1
            print(f"kmp-launch: {w.label} of the parameter-server cluster exited "
                  f"({describe_exit(w.proc.returncode)}); starting it again ({count + 1} of "
                  f"{MAX_WORKER_RESTARTS}): the chief sends its steps to the other workers "
                  "meanwhile, and to it again once it is back", file=sys.stderr, flush=True)
            self.lost.append(w)
            workers[position] = self.start(w.index)
