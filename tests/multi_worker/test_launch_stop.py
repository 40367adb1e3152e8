"""`kmp-launch` cleans up after every ending, and forwards stop signals to its workers.

Each case runs the real command on a small script (no TensorFlow imported,
`--no-strategy`) with its own temporary folder, then checks the exit code, the
message, that every worker's `finally` ran where it had the time to, and that
no `kmp-launch-*` folder (spec, payload, job folder) was left behind: only the
log folder stays, as documented.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(120)]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = """
import os, pathlib, signal, sys, time
index = int(os.environ["KMP_WORKER_INDEX"])
marks = pathlib.Path(sys.argv[1])
mode = sys.argv[2]
if mode == "ignore" and index == 1:  # a worker still busy (saving) at the first signal
    signal.signal(signal.SIGTERM, lambda *_: (marks / "ignored-1").write_text(""))
(marks / f"up-{index}").write_text(str(os.getpid()))
try:
    if mode == "raise" and index == 1:
        while len(list(marks.glob("up-*"))) < 2:
            time.sleep(0.02)
        raise RuntimeError("boom on worker 1")
    time.sleep(60)
finally:
    (marks / f"finally-{index}").write_text("")
"""


def _start(tmp_path, mode, *options):
    marks = tmp_path / "marks"
    marks.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    pythonpath = filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath), "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2", "--no-strategy",
         *options, str(script), str(marks), mode],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(marks.glob("up-*"))) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    return proc, marks, tmp


def _finish(proc):
    out, err = proc.communicate(timeout=90)
    return proc.returncode, err


def _left_behind(tmp: pathlib.Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name != "kmp-launch-logs")


def test_sigterm_is_forwarded_each_worker_ends_cleanly_saying_nothing_was_saved(tmp_path):
    proc, marks, tmp = _start(tmp_path, "sleep")
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert ("kmp-launch: SIGTERM received: forwarded to every worker; no worker runs a fit "
            "with kmp.callbacks.BackupAndRestore, so they stop now and nothing is saved") in err
    assert ("[worker 0] kmp: worker 0 of 2 received SIGTERM and stops; nothing was saved: no "
            "fit with kmp.callbacks.BackupAndRestore was running.") in err
    assert "callbacks=[kmp.callbacks.BackupAndRestore(backup_dir=...)]" in err
    assert err.rstrip().endswith(
        "kmp-launch: The job was stopped by SIGTERM (sent to kmp-launch, which forwarded it to "
        "every worker); nothing was saved: no fit with kmp.callbacks.BackupAndRestore was "
        "running in workers 0, 1 (exit code 143).")
    assert sorted(p.name for p in marks.glob("finally-*")) == ["finally-0", "finally-1"]
    assert _left_behind(tmp) == []


def test_sigusr1_to_one_worker_stops_the_job_and_names_that_worker(tmp_path):
    proc, marks, tmp = _start(tmp_path, "sleep")
    os.kill(int((marks / "up-1").read_text()), signal.SIGUSR1)
    code, err = _finish(proc)
    assert code == 128 + signal.SIGUSR1, err
    assert ("The job was stopped by SIGUSR1 (received by worker 1); nothing was saved"
            in err), err
    assert (marks / "finally-1").exists()
    assert _left_behind(tmp) == []


def test_a_second_sigterm_stops_the_workers_at_once(tmp_path):
    proc, marks, tmp = _start(tmp_path, "ignore")
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while not (marks / "ignored-1").exists():  # worker 1 got the first one, and goes on
        assert time.monotonic() < deadline
        time.sleep(0.05)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc)
    assert time.monotonic() - start < 15
    assert code == 143, err
    assert ("kmp-launch: SIGTERM received again while the workers were stopping after SIGTERM: "
            "every worker was stopped at once") in err
    assert _left_behind(tmp) == []


@pytest.mark.parametrize("ending", ["sigint", "failed_worker", "timeout"])
def test_every_other_ending_leaves_no_job_folder(tmp_path, ending):
    options = ("--timeout", "3") if ending == "timeout" else ()
    proc, marks, tmp = _start(tmp_path, "raise" if ending == "failed_worker" else "sleep",
                              *options)
    if ending == "sigint":
        proc.send_signal(signal.SIGINT)
    code, err = _finish(proc)
    assert code == {"sigint": 130, "failed_worker": 1, "timeout": 124}[ending], err
    assert _left_behind(tmp) == []
