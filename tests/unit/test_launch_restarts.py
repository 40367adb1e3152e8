"""`--max-restarts` / `max_restarts=`: which endings are run again, and what is said."""

from __future__ import annotations

import pytest

from keras_mgpu_plugins.launch import JobStoppedError, WorkerFailedError, _restarts


def stopped(forwarded=False, saved=True):
    return JobStoppedError("m", signal="SIGTERM", saved=saved, exit_code=75 if saved else 143,
                           epoch=1, batches_done=4, backup_dir="/b", forwarded=forwarded,
                           records={1: {"received": True}})


def failed(exitcode, summary="worker 1 of 2 was killed by signal SIGKILL (exit code -9)."):
    return WorkerFailedError("m", summary=summary, worker_index=1, num_workers=2,
                             exitcode=exitcode)


def test_what_is_restarted_and_why():
    assert _restarts.cause(stopped()) == (
        "the job was stopped by SIGTERM; resuming from the backup in /b (epoch 2, after 4 of "
        "its batches)")
    assert _restarts.cause(stopped(saved=False)) == (
        "the job was stopped by SIGTERM; starting again: nothing was saved")
    assert _restarts.cause(failed(-9)) == (
        "worker 1 of 2 was killed by signal SIGKILL (exit code -9); resuming from the last backup")
    assert _restarts.cause(stopped(forwarded=True)) is None  # the launcher was told to stop
    assert _restarts.cause(failed(1, "worker 1 of 2 raised ValueError (exit code 1).")) is None
    assert _restarts.cause(TimeoutError()) is None


def test_restarts_run_again_until_done_or_spent_naming_each(capsys):
    outcomes = iter([failed(-9), stopped(), "done"])

    def once(attempt):
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return (outcome, attempt)

    assert _restarts.run(once, 2, "kmp-launch") == ("done", 2)
    assert capsys.readouterr().err.splitlines() == [
        "kmp-launch: restart 1 of 2: worker 1 of 2 was killed by signal SIGKILL (exit code -9); "
        "resuming from the last backup.",
        "kmp-launch: restart 2 of 2: the job was stopped by SIGTERM; resuming from the backup "
        "in /b (epoch 2, after 4 of its batches)."]

    with pytest.raises(WorkerFailedError):
        _restarts.run(lambda attempt: (_ for _ in ()).throw(failed(-9)), 1, "kmp.launch")
    assert capsys.readouterr().err.splitlines()[-1] == (
        "kmp.launch: not restarted: all 1 restarts were made.")

    with pytest.raises(WorkerFailedError):
        _restarts.run(lambda attempt: (_ for _ in ()).throw(
            failed(1, "worker 1 of 2 raised ValueError (exit code 1).")), 3, "kmp-launch")
    assert capsys.readouterr().err == (
        "kmp-launch: not restarted: worker 1 of 2 raised ValueError (exit code 1), which a "
        "rerun would do again.\n")


def test_no_restarts_says_nothing(capsys):
    with pytest.raises(JobStoppedError):
        _restarts.run(lambda attempt: (_ for _ in ()).throw(stopped()), 0, "kmp-launch")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_bad_max_restarts_is_named(value):
    import keras_mgpu_plugins as kmp

    with pytest.raises(ValueError, match=f"max_restarts must be an integer at least 0. "
                                         f"Received: max_restarts={value!r}"):
        kmp.launch(print, max_restarts=value)
