"""Where the workers check for a stop signal (`callbacks._stopping.Checks`), on every lane.

Run with each lane's backend (TensorFlow, JAX, torch: `.ci/run` lists this file in every
subset). The schedule is pure logic: K, the steps between two checks, is computed by every
worker from the one vector they all gathered, so two workers whose own clocks differ still
check at the same steps. Then Keras's real `fit` on the active backend: a 2-worker job seen
from one process (`_Mirrored`: the other worker does what this one does) checks a few times,
not at every step; a signal becomes a stop, saved, within `stop_check_interval`; and the
batch-end hooks still run off the training thread where Keras does that (JAX, torch).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import keras
import numpy as np
import pytest

from keras_mgpu_plugins import _stop_signals, runtime
from keras_mgpu_plugins.callbacks import BackupAndRestore, _stopping
from keras_mgpu_plugins.errors import STOPPED_EXIT_CODE, TrainingStopped
from keras_mgpu_plugins.runtime import Rank, Runtime

pytestmark = pytest.mark.timeout(240)


# --- the schedule, without Keras ------------------------------------------------------------

@pytest.mark.parametrize("step_s, cost_s, interval_s, expected", [
    (0.011, 0.005, 2.0, 91),   # a check of 5 ms at 0.5% of 91 steps of 11 ms (1.0 s apart)
    (0.011, 0.050, 2.0, 181),  # a costly check: at most 2 s apart (181 steps), 2.5% of them
    (0.200, 0.005, 2.0, 5),    # slow steps: 5 steps (1 s) make the check 0.5%
    (3.000, 0.005, 2.0, 1),    # a step longer than the interval: every step
    (0.011, 0.005, 0.0, 1),    # stop_check_interval=0: every step
    (0.0, 0.005, 2.0, 1),      # nothing measured yet
])
def test_the_steps_between_checks_keep_a_check_cheap_within_the_interval(step_s, cost_s,
                                                                         interval_s, expected):
    every = _stopping.next_interval(step_s, cost_s, interval_s)
    assert every == expected
    if every * step_s * _stopping.COST_SHARE >= cost_s:
        assert cost_s / (every * step_s) <= _stopping.COST_SHARE  # the cost bound held
    assert every * step_s <= max(interval_s, step_s)  # the time bound held


@pytest.mark.parametrize("value", [-1, "2", True, float("nan"), float("inf")])
def test_a_check_interval_that_is_no_time_is_refused(value):
    with pytest.raises(ValueError, match=r"stop_check_interval must be a number of seconds >= 0 "
                                         rf"\(0: check at every step\). Received: "
                                         rf"stop_check_interval={value!r}"):
        _stopping.check_interval(value, None)


def test_a_check_interval_the_stop_grace_cannot_honour_is_refused_with_the_figure(monkeypatch):
    monkeypatch.setenv(_stop_signals.STOP_GRACE_ENV, "30")
    assert BackupAndRestore("b", stop_check_interval=15).stop_check_interval == 15
    with pytest.raises(ValueError) as refused:
        BackupAndRestore("b", stop_check_interval=20)
    assert str(refused.value).startswith(
        "stop_check_interval=20 s cannot honour a stop signal within the job's stop grace of "
        "30 s (KMP_STOP_GRACE, kmp-launch --stop-grace)")
    assert "Use stop_check_interval <= 15 (half the grace), or a longer grace." in str(
        refused.value)
    monkeypatch.setenv(_stop_signals.STOP_GRACE_ENV, "soon")
    with pytest.raises(ValueError, match="KMP_STOP_GRACE must be a positive number of seconds. "
                                         "Received: KMP_STOP_GRACE='soon'"):
        BackupAndRestore("b")


class _Pair(Runtime):
    """Worker `index` of 2 workers that are threads of this process: a real all-gather."""

    def __init__(self, index: int, shared: dict) -> None:
        self.index, self.shared = index, shared

    def rank(self) -> Rank:
        return Rank(self.index, 2, self.index == 0)

    @property
    def spans_workers(self) -> bool:
        return True

    def _gather(self, wire: np.ndarray) -> np.ndarray:
        self.shared[self.index] = wire
        self.shared["barrier"].wait()
        rows = np.stack([self.shared[0], self.shared[1]])
        self.shared["barrier"].wait()
        return rows


@pytest.mark.filterwarnings("ignore:BackupAndRestore. a check for stop signals takes")
def test_two_workers_with_different_clocks_check_at_the_same_steps_and_stop_at_one():
    """Worker 1's steps look twice as long to it, and it alone gets the signal (recorded
    before its step 150): both check at the same steps, with the same K, and both find the
    signal at the same check."""
    shared = {"barrier": threading.Barrier(2, timeout=30)}
    seen: dict[int, list] = {0: [], 1: []}
    signalled = _stop_signals.Request(signal.SIGTERM, "SIGTERM", 0.0)

    def work(index: int) -> None:
        checks = _stopping.Checks(_Pair(index, shared), interval_s=0.2)
        for step in range(600):
            if checks.batch_begins():
                found = checks.agreed_with(signalled if index == 1 and step > 150 else None)
                seen[index].append((checks.trained, checks.every, found))
                if found:
                    return
            time.sleep(0.0005 * (1 + index))

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen[0] == seen[1]  # the same steps, the same K, the same answer
    assert seen[0][-1][2] == ("SIGTERM", [1])
    assert 150 < seen[0][-1][0] and len(seen[0]) < 150  # checked well below once a step
    assert {every for _, every, _ in seen[0][3:]} != {1}


class _Quick(_Pair):
    """One worker of a job whose check's all-gather is instant (the other worker mirrored)."""

    def __init__(self) -> None:
        super().__init__(0, {})

    def _gather(self, wire: np.ndarray) -> np.ndarray:
        return np.stack([wire, wire])


def test_a_watched_sources_question_counts_in_the_checks_cost():
    """A source asked at each check (Ray's preemption notice: a barrier over the group) that
    takes 20 ms: the checks are spaced so that the question too stays within 0.5% of the steps
    between two (1 ms steps: about 4,000), not only the all-gather's microseconds."""
    undo = _stop_signals.watch(lambda: time.sleep(0.02))
    try:
        checks = _stopping.Checks(_Quick(), interval_s=60.0)
        for _ in range(3):
            checks.batch_begins()
            time.sleep(0.001)
            checks.trained += 1
            checks.agreed()
    finally:
        undo()
    assert checks._cost >= 0.02
    assert checks.every >= 0.02 / (_stopping.COST_SHARE * 0.01)  # even were a step 10 ms


# --- a real fit on this lane's backend ---------------------------------------------------------

ROWS, BATCH = 1600, 8  # 200 steps an epoch


class _Mirrored(Runtime):
    """This process as worker 0 of 2 whose other worker does exactly what it does: every
    collective of `BackupAndRestore` runs (and is counted) as in a 2-worker job, and takes
    2 ms (a round trip between machines)."""

    def __init__(self, gathered: list) -> None:
        self.gathered = gathered

    def rank(self) -> Rank:
        return Rank(0, 2, True)

    @property
    def spans_workers(self) -> bool:
        return True

    def _gather(self, wire: np.ndarray) -> np.ndarray:
        self.gathered.append(wire.shape)
        time.sleep(0.002)
        return np.stack([wire, wire])


def _build():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _data():
    x = np.random.default_rng(0).normal(size=(ROWS, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


class _SignalAt(keras.callbacks.Callback):
    """SIGTERM to this process at the end of batch `at` of epoch 0 (or at the end of epoch
    `at_epoch_end`); then each batch sleeps `slow` s; records the batches trained."""

    def __init__(self, at=None, slow=0.0, at_epoch_end=None):
        super().__init__()
        self.at, self.slow, self.trained, self.sent = at, slow, [], None
        self.at_epoch_end = at_epoch_end

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.at_epoch_end:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_end(self, batch, logs=None):
        self.trained.append(batch)
        if batch == self.at:
            self.sent = time.monotonic()
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(self.slow)


@pytest.fixture
def two_workers(monkeypatch):
    gathered: list = []
    monkeypatch.setattr(runtime, "of", lambda model=None: _Mirrored(gathered))
    return gathered


def test_two_workers_check_a_few_times_not_at_every_step(tmp_path, two_workers):
    x, y = _data()
    _build().fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                 callbacks=[BackupAndRestore(str(tmp_path / "b"), stop_check_interval=0.5)])
    checks = two_workers.count((3,))
    # before: one a step, 400 (and 2 epoch ends, and one before the first step)
    assert 2 <= checks <= 12, f"{checks} checks in 400 steps"


def test_a_signal_stops_both_workers_at_a_check_within_the_interval_saved(tmp_path,
                                                                         two_workers, capfd):
    x, y = _data()
    folder = str(tmp_path / "b")
    sender = _SignalAt(at=60, slow=0.01)
    with pytest.raises(TrainingStopped) as stopped:
        _build().fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                     callbacks=[BackupAndRestore(folder, stop_check_interval=0.5), sender])
    took = time.monotonic() - sender.sent
    assert (stopped.value.code, stopped.value.saved) == (STOPPED_EXIT_CODE, True)
    done = stopped.value.batches_done
    assert sender.trained[-1] == done - 1  # no step trained beyond the stop
    assert 61 <= done <= 61 + 0.5 / 0.01 + 1 and took < 0.5 + 1.0, (done, took)
    assert _stopping_record(folder) == (0, done)
    err = capfd.readouterr().err
    assert "kmp received SIGTERM: training stops at the workers' next check, in " in err
    assert "steps, 0.5 s apart at most), once BackupAndRestore has saved that step." in err


def _stopping_record(folder):
    import json

    with open(os.path.join(folder, "training_metadata.json")) as f:
        record = json.load(f)
    return record["epoch"], record["batches_done"]


def test_a_signal_in_the_last_steps_stops_at_the_end_of_fit_with_the_backup_kept(tmp_path,
                                                                                two_workers):
    """A signal after the last epoch's check (sent by a callback after BackupAndRestore, at the
    epoch's end): the check at the end of `fit` finds it; the training is done, its backup
    kept, so the same command again goes on after `fit`."""
    x, y = _data()
    folder = str(tmp_path / "b")
    with pytest.raises(TrainingStopped, match=r"at the end of fit \(after epoch 1\); "
                                              "BackupAndRestore kept its backup"):
        _build().fit(x[:80], y[:80], batch_size=BATCH, epochs=1, verbose=0,
                     callbacks=[BackupAndRestore(folder, stop_check_interval=60),
                                _SignalAt(at_epoch_end=0)])
    assert _stopping_record(folder) == (1, 0)
    again = _build()
    history = again.fit(x[:80], y[:80], batch_size=BATCH, epochs=1, verbose=0,
                        callbacks=[BackupAndRestore(folder, stop_check_interval=60)])
    assert history.epoch == [] and not os.path.exists(folder)


class _WhereBatchEndsRun(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.threads = set()
        self.async_safe = True  # Keras may run it off the training thread

    def on_train_batch_end(self, batch, logs=None):
        self.threads.add(threading.current_thread() is threading.main_thread())


@pytest.mark.parametrize("backup", [False, True], ids=["alone", "with BackupAndRestore"])
def test_batch_end_hooks_run_where_keras_runs_them_without_the_stop_watch(tmp_path, backup):
    """Keras runs batch-end hooks off the training thread on JAX and torch (not TensorFlow)
    unless a callback's own hook must run there: the default BackupAndRestore no longer
    forces it."""
    x, y = _data()
    where = _WhereBatchEndsRun()
    callbacks = [BackupAndRestore(str(tmp_path / "b"))] if backup else []
    _build().fit(x[:160], y[:160], batch_size=BATCH, epochs=1, verbose=0,
                 callbacks=[*callbacks, where])
    on_main = keras.backend.backend() == "tensorflow"  # Keras: TensorFlow is not thread-safe
    assert where.threads == {on_main}


# --- what the launcher says when it forwards a signal ------------------------------------------

def test_the_launchers_notice_says_what_this_job_will_do():
    from keras_mgpu_plugins.launch._signals import forward_notice

    assert forward_notice(signal.SIGTERM, 120, "kmp-launch", saving=False) == (
        "kmp-launch: SIGTERM received: forwarded to every worker; no worker runs a fit with "
        "kmp.callbacks.BackupAndRestore, so they stop now and nothing is saved (pass "
        "callbacks=[kmp.callbacks.BackupAndRestore(backup_dir=...)] to fit to save at a stop "
        "signal; SIGTERM again stops them at once).")
    assert forward_notice(signal.SIGUSR1, 90, "kmp.launch", saving=True) == (
        "kmp.launch: SIGUSR1 received: forwarded to every worker; in the fit with "
        "BackupAndRestore they stop at the next step they check together and save it there "
        "(90 s at most; SIGUSR1 again stops them at once).")


class _SeesTheJobFolder(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.saving = _stop_signals.saving_workers(os.environ["KMP_JOB_DIR"])


def test_a_launched_worker_says_in_the_job_folder_while_its_fit_saves_at_a_signal(
        tmp_path, monkeypatch):
    """What the launcher reads to word its notice (`_stop_signals.saving_workers`)."""
    monkeypatch.setenv("KMP_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("KMP_WORKER_INDEX", "1")
    x, y = _data()
    seen = _SeesTheJobFolder()
    _build().fit(x[:16], y[:16], batch_size=BATCH, verbose=0,
                 callbacks=[BackupAndRestore(str(tmp_path / "b")), seen])
    assert seen.saving == [1]
    assert _stop_signals.saving_workers(str(tmp_path)) == []  # the fit ended
    _build().fit(x[:16], y[:16], batch_size=BATCH, verbose=0,
                 callbacks=[BackupAndRestore(str(tmp_path / "b"), stop_signals=None), seen])
    assert seen.saving == []  # no stop signal handled: nothing saved at one
