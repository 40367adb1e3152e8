"""The launcher's report of the workers that failed: the first to fail named, with its
traceback or the end of its output, the others listed (`WorkerFailedError`)."""

from __future__ import annotations

import os
import time
import warnings

from keras_mgpu_plugins.launch._errors import WorkerFailedError, describe_exit
from keras_mgpu_plugins.launch._process import _Worker


def _raise_first_failure(workers: list[_Worker], expects_result: bool) -> None:
    failures = []
    for w in workers:
        if w.failed(expects_result):
            raised, exc, when, text = w.error_record()
            failures.append((when if when is not None else time.time(), w, raised, exc, text))
        elif expects_result and w.proc.returncode != 0 and os.path.exists(w.result_path):
            warnings.warn(f"Worker {w.index} returned its result, then ended with "
                          f"{describe_exit(w.proc.returncode)} while shutting down.",
                          RuntimeWarning, stacklevel=4)  # at the caller of kmp.launch
    if not failures:
        return
    failures.sort(key=lambda f: f[0])
    _, first, raised, exc, text = failures[0]
    others = {w.index: w.proc.returncode for _, w, _, _, _ in failures[1:]}
    tasks = "workers" if all(w.label == f"worker {w.index}" for w in workers) else "tasks"
    summary = (f"{first.label} of {len(workers)}{'' if tasks == 'workers' else ' tasks'} "
               f"{_how(first, raised, text, expects_result)}.")
    if others:
        summary += " Also failed: " + ", ".join(
            f"{w.label} {_how(w, r, t, expects_result)}"
            for _, w, r, _, t in failures[1:]) + "."
    if len(failures) < len(workers):
        summary += f" The other {tasks} were stopped by the launcher."
    if text is not None:
        detail = f"Remote traceback of {first.label}:\n{text.rstrip()}"
    elif first.stderr_tail:
        detail = f"Last lines of {first.label}'s stderr:\n" + "\n".join(first.stderr_tail)
    else:
        detail = f"{first.label[0].upper()}{first.label[1:]} printed nothing to stderr."
    if not first.shown and first.output_tail:  # its output went to its log only: show the end
        detail += (f"\n\nLast lines of {first.label}'s output (all of it in "
                   f"{first.log_path}):\n" + "\n".join(first.output_tail))
    raise WorkerFailedError(
        f"{summary[0].upper()}{summary[1:]}\n\n{detail}", summary=summary,
        worker_index=first.index, num_workers=len(workers), exitcode=_exit_code(first, raised),
        remote_traceback=text, remote_exception=exc, other_failures=others,
        log_path=first.log_path, output_shown=first.shown, output_tail=list(first.output_tail),
    )


def _ended_by_launcher(w: _Worker) -> bool:
    """Whether the launcher's stop ended worker `w` (its signal's default action, or the
    SIGKILL after the grace), not an exit of its own after it (Python's 1 for an exception)."""
    code = w.proc.returncode
    return w.stopped_by_launcher and (code is None or code < 0 or code >= 128)


def _exit_code(w: _Worker, raised: str | None) -> int | None:
    """The exit code worker `w`'s failure stands for: its own, or 1 (Python's, for an
    exception) where it raised and the launcher stopped it before it could exit (a JAX or
    TensorFlow runtime holding the process: its SIGTERM is the launcher's, no preemption)."""
    if raised is not None and raised != "SystemExit" and _ended_by_launcher(w):
        return 1
    return w.proc.returncode


def _how(w: _Worker, raised: str | None, text: str | None, expects_result: bool) -> str:
    """How worker `w` failed, e.g. "raised ValueError (exit code 1)"."""
    code = w.proc.returncode
    if raised == "StallError":  # the watchdog's verdict, first line, where it was shared
        verdict = f": {text.splitlines()[0]}" if text else " (its output has the verdict)"
        return f"was stopped by StallWatchdog (exit code {code}){verdict}"
    if raised is not None and raised != "SystemExit":
        if _ended_by_launcher(w):  # it reported the error, then did not end by itself
            return f"raised {raised} (then stopped by the launcher)"
        return f"raised {raised} (exit code {code})"
    if code is not None and code < 0:
        return f"was killed by {describe_exit(code)}"
    if text is None and expects_result and code == 0:
        return "exited with code 0 before fn returned"
    return f"exited with code {code}"
