"""Where each worker is when the run's `timeout` expires: its Python stacks, asked for.

The launcher asks through the job folder (`KMP_JOB_DIR`): it writes `stacks/request`.
Each worker's parent-watch thread (`_worker`), which looks twice a second, answers in
`stacks/worker-<i>.json`: where its main thread is and every thread's stack, read as
`StallWatchdog` reads them (`callbacks._stall_stacks`: `locate`, `format_stacks`). A
thread and a file rather than a signal: a Python signal handler runs only once the main
thread returns to Python, which a stuck main thread may never do.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from keras_mgpu_plugins.io.atomic import write_bytes_atomic

_REQUEST = "request"


def _folder(job_dir: str) -> str:
    return os.path.join(job_dir, "stacks")


def answer_if_asked(job_dir: str, index: int) -> bool:
    """In a worker: writes where it is and its stacks if the launcher asked; whether it did."""
    if not os.path.exists(os.path.join(_folder(job_dir), _REQUEST)):
        return False
    from keras_mgpu_plugins.callbacks._stall_stacks import format_stacks, locate

    _, inside, where = locate(sys._current_frames().get(threading.main_thread().ident))
    answer = {"where": where, "inside": inside, "stacks": format_stacks()}
    write_bytes_atomic(os.path.join(_folder(job_dir), f"worker-{index}.json"), json.dumps(answer))
    return True


def ask(job_dir: str, workers: Sequence[int], wait_s: float) -> dict[int, dict | None]:
    """In the launcher: asks every worker of `workers`; each one's answer, or `None` if none
    came within `wait_s` seconds (its Python is blocked, or it is stopped)."""
    os.makedirs(_folder(job_dir), exist_ok=True)
    write_bytes_atomic(os.path.join(_folder(job_dir), _REQUEST), "")
    answers: dict[int, dict] = {}
    deadline = time.monotonic() + wait_s
    while True:
        for index in workers:
            if index not in answers:
                with contextlib.suppress(OSError, ValueError):
                    with open(os.path.join(_folder(job_dir), f"worker-{index}.json")) as f:
                        answers[index] = json.load(f)
        if len(answers) == len(workers) or time.monotonic() >= deadline:
            return {index: answers.get(index) for index in workers}
        time.sleep(0.1)


def describe(answers: Mapping[int, dict | None], num_workers: int, wait_s: float) -> str:
    """Where each worker was, one line each, then the likely stuck one and every stack.

    A worker outside TensorFlow and JAX while others wait inside is named likely stuck,
    as `StallWatchdog` judges (the others wait for it in a collective). The stack
    lines carry the worker's `[worker i] ` prefix, as the watchdog prints them.
    """
    lines = []
    for index, answer in answers.items():
        if answer is None:
            lines.append(f"  worker {index}: did not answer within {wait_s:g} s (its Python is "
                         "blocked: a native call holding the GIL, or the process is stopped)")
        else:
            lines.append(f"  worker {index}: {answer['where']}")
    outside = [i for i, a in answers.items() if a is None or not a["inside"]]
    if outside and len(outside) < len(answers):
        lines.append(f"  Likely stuck: worker {', '.join(map(str, outside))}, outside "
                     "TensorFlow and JAX while the others wait inside (for it, in a collective).")
    for index, answer in answers.items():
        if answer is not None:
            lines.append(f"Python stacks of worker {index} of {num_workers} (all threads):")
            lines.extend(f"[worker {index}] {line}" for line in answer["stacks"].splitlines())
    return "\n".join(lines)
