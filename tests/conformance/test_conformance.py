"""The conformance table (`table.py`), every cell of the active lane: one promise under one way
of starting a job. The same code runs on every lane (each CI lane runs it with its own
backend); a cell the table marks refused asserts the refusal, a start absent from a lane
skips with the reason.

The jobs each cell needs are run once per start and shared by the cells that read them
(`Jobs`): an uninterrupted run (fit, EarlyStopping, uneven and tiny batches), a chain of
runs stopped and resumed (SIGTERM, then SIGKILL, then to the end, and the SIGTERM backup
resumed on one worker), and one run each for the refusals and failures.
"""

from __future__ import annotations

import functools
import pathlib
import shutil

import numpy as np
import pytest

from tests.conformance import job, starts, table

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.conformance,
              pytest.mark.timeout(900)]

ATOL = 1e-5
STOPPED = 75  # errors.STOPPED_EXIT_CODE


def lane() -> str:
    import keras

    return keras.backend.backend()


def close(got, want, what: str, atol: float = ATOL) -> None:
    got, want = np.asarray(got, dtype="float64"), np.asarray(want, dtype="float64")
    assert got.shape == want.shape, f"{what}: shape {got.shape} against {want.shape}"
    difference = float(np.max(np.abs(got - want))) if got.size else 0.0
    assert difference <= atol, f"{what}: {difference:.3g} off one device (> {atol})"


def close_weights(got: list, want: list, what: str, atol: float = ATOL) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        close(g, w, f"{what}, variable {i}", atol)


def close_history(got: dict, want: dict, what: str) -> None:
    assert sorted(got) == sorted(want), f"{what}: History keys {sorted(got)} != {sorted(want)}"
    for key in want:
        close(got[key], want[key], f"{what}: History[{key!r}]")


class Jobs:
    """The runs of one lane, each made once, on first use."""

    def __init__(self, base: pathlib.Path) -> None:
        self.base = base

    def _out(self, *parts: str) -> pathlib.Path:
        return self.base.joinpath(*parts)

    @functools.cache  # noqa: B019 - one Jobs per session
    def reference(self) -> starts.Run:
        run = starts.REFERENCE.run([], self._out("reference"))
        assert run.code == 0, run.output[-4000:]
        return run

    @functools.cache  # noqa: B019
    def train(self, start: str) -> starts.Run:
        return starts.BY_NAME[start].run([], self._out(start, "train"))

    @functools.cache  # noqa: B019
    def chain(self, start: str) -> dict:
        """SIGTERM at epoch 0 (stop, saved), the rerun killed by SIGKILL in epoch 1, the
        rerun to the end; and the SIGTERM backup resumed on one worker."""
        how, victim = starts.BY_NAME[start], victim_of(start)
        out = self._out(start, "chain")
        found = {}
        found["term"] = how.run(["--phases", "main", "--at", f"0:3:SIGTERM:{victim}"], out)
        found["term_hooks"] = hooks(found["term"])
        if (out / "backup").exists():
            shutil.copytree(out / "backup", self._out(start, "elastic", "backup"))
        for stale in (out / "results").glob("hooks-w*.json"):  # the SIGTERM run's
            stale.unlink()
        found["kill"] = how.run(["--phases", "main", "--at", f"1:3:SIGKILL:{victim}"], out)
        found["kill_hooks"] = hooks(found["kill"])
        found["end"] = how.run(["--phases", "main"], out)
        found["elastic"] = how.run(["--phases", "main"], self._out(start, "elastic"), workers=1)
        return found

    @functools.cache  # noqa: B019
    def special(self, start: str, case: str) -> starts.Run:
        victim = victim_of(start)
        args = {"undecorated": ["--phases", "main", "--undecorated"],
                "stall": ["--phases", "main", "--at", f"0:2:stall:{victim}",
                          "--stall-timeout", "10"],
                "raise": ["--phases", "main", "--at", f"0:2:raise:{victim}"],
                "version": ["--phases", "main"]}[case]
        env = {"PYTHONPATH": shim_path()} if case == "version" else None
        return starts.BY_NAME[start].run(args, self._out(start, case), env=env)


def victim_of(start: str) -> int:
    """The worker an event happens to: worker 1, or the one process of the devices column."""
    return 1 if starts.BY_NAME[start].workers > 1 else 0


def hooks(run: starts.Run) -> list[list[dict]]:
    return [r["hooks"] for r in run.results("hooks")]


def shim_path() -> str:
    return str(pathlib.Path(__file__).resolve().parent / "shims" / "unchecked_keras")


@pytest.fixture(scope="session")
def jobs(tmp_path_factory) -> Jobs:
    return Jobs(tmp_path_factory.mktemp("conformance"))


def the_cell(promise: str, start: str):
    """The table's cell for the active lane; skips an absent start."""
    found = table.cell(promise, lane(), start)
    if isinstance(found, table.Absent):
        pytest.skip(f"{start} on {lane()}: {found.why}")
    return found


def refused(run: starts.Run, expected: table.Refused) -> None:
    """Every process refused with the expected error, before any training step."""
    assert run.code != 0, f"expected {expected.error}, but the job succeeded"
    assert expected.error in run.output and expected.match in run.output, run.output[-4000:]
    assert not any(h for h in hooks(run)), "a step was trained before the refusal"


START_NAMES = [s.name for s in starts.STARTS]


# --- the uninterrupted run ----------------------------------------------------------------


@pytest.mark.parametrize("start", START_NAMES)
def test_fit_equal(jobs, start):
    cell, run = the_cell("fit_equal", start), jobs.train(start)
    if isinstance(cell, table.Refused):
        return refused(run, cell)
    assert run.code == 0, run.output[-4000:]
    (want,), found = jobs.reference().results("main"), run.results("main")
    assert len(found) == max(1, starts.BY_NAME[start].workers)
    for rank, got in enumerate(found):
        close_weights(got["weights"], want["weights"], f"worker {rank}: weights")
        close_history(got["history"], want["history"], f"worker {rank}")
        close(list(got["evaluate"].values()), list(want["evaluate"].values()),
              f"worker {rank}: evaluate")
        close(got["predict"], want["predict"], f"worker {rank}: predict")
        assert got["weights"] == found[0]["weights"], f"worker {rank}: not bit-identical to 0"


@pytest.mark.parametrize("start", START_NAMES)
def test_uneven_batches(jobs, start):
    cell, run = the_cell("uneven_batches", start), jobs.train(start)
    if isinstance(cell, table.Refused):
        return refused(run, cell)
    assert run.code == 0, run.output[-4000:]
    for phase in ("uneven", "tiny"):
        (want,), found = jobs.reference().results(phase), run.results(phase)
        for rank, got in enumerate(found):
            assert "error" not in got, f"{phase}, worker {rank}: {got.get('message')}"
            close_weights(got["weights"], want["weights"], f"{phase}, worker {rank}: weights")
            close_history(got["history"], want["history"], f"{phase}, worker {rank}")
            close(got["predict"], want["predict"], f"{phase}, worker {rank}: predict")


@pytest.mark.parametrize("start", START_NAMES)
def test_chief_writes(jobs, start):
    cell, run = the_cell("chief_writes", start), jobs.train(start)
    if isinstance(cell, table.Refused):
        return refused(run, cell)
    assert run.code == 0, run.output[-4000:]
    found = run.results("main")
    assert {"best.keras", "history.csv"} <= set(found[0]["writes"]), found[0]["writes"]
    assert any(w.startswith("backup/") for w in found[0]["writes"]), found[0]["writes"]
    for rank, got in enumerate(found[1:], start=1):
        assert got["writes"] == [], f"worker {rank} wrote {got['writes']}"
    import csv

    import keras

    model = keras.saving.load_model(run.out / "best.keras")
    assert len(model.get_weights()) == len(found[0]["weights"])
    with open(run.out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    want = jobs.reference().results("main")[0]["history"]
    assert [int(r["epoch"]) for r in rows] == list(range(job.EPOCHS))
    close([float(r["loss"]) for r in rows], want["loss"], "history.csv: loss")


@pytest.mark.parametrize("start", START_NAMES)
def test_early_stopping(jobs, start):
    cell, run = the_cell("early_stopping", start), jobs.train(start)
    if isinstance(cell, table.Refused):
        return refused(run, cell)
    assert run.code == 0, run.output[-4000:]
    (want,), found = jobs.reference().results("early"), run.results("early")
    assert want["epochs_run"] < 12, "the reference must stop early for the cell to mean much"
    for rank, got in enumerate(found):
        assert (got["stopped_epoch"], got["epochs_run"]) == (want["stopped_epoch"],
                                                             want["epochs_run"]), f"worker {rank}"
        close_weights(got["weights"], want["weights"], f"worker {rank}: restored weights")


# --- stopped and resumed ----------------------------------------------------------------


@pytest.mark.parametrize("start", START_NAMES)
def test_stop_signal_resume(jobs, start):
    cell = the_cell("stop_signal_resume", start)
    chain = jobs.chain(start)
    if isinstance(cell, table.Refused):
        return refused(chain["term"], cell)
    term = chain["term"]
    assert term.code == STOPPED or (start == "torchrun" and "exitcode  : 75" in term.output), (
        f"exit code {term.code}:\n{term.output[-4000:]}")
    last = {next((r["epoch"], r["batch"]) for r in reversed(h) if "batch" in r)
            for h in chain["term_hooks"]}
    assert len(last) == 1, f"the workers stopped at different steps: {last}"
    (epoch, batch), = last
    steps = -(-int(job.ROWS * 0.75) // job.BATCH)  # per epoch (validation_split=0.25)
    expected = (epoch, batch + 1) if batch + 1 < steps else (epoch + 1, 0)
    assert len(chain["kill_hooks"]) >= 1, "no worker of the resumed run recorded its hooks"
    for rank, resumed in enumerate(chain["kill_hooks"]):
        first = resumed[0]
        assert (first["epoch"], first["batch"]) == expected, (
            f"worker {rank}: the resumed run's first batch hook is {first}, expected the "
            f"first untrained batch {expected}")
        assert "loss" in first["keys"], f"worker {rank}: {first}"


@pytest.mark.parametrize("start", START_NAMES)
def test_sigkill_resume(jobs, start):
    cell = the_cell("sigkill_resume", start)
    chain = jobs.chain(start)
    if isinstance(cell, table.Refused):
        return refused(chain["term"], cell)
    assert chain["kill"].code != 0, "the SIGKILLed run succeeded"
    end = chain["end"]
    assert end.code == 0, end.output[-4000:]
    uninterrupted = jobs.train(start)
    assert uninterrupted.code == 0, uninterrupted.output[-4000:]
    want = uninterrupted.results("main")[0]["weights"]
    for rank, got in enumerate(end.results("main")):
        assert got["weights"] == want, (
            f"worker {rank}: resumed weights differ from the uninterrupted run's "
            f"(largest {max_difference(got['weights'], want):.3g})")


@pytest.mark.parametrize("start", START_NAMES)
def test_elastic_resume(jobs, start):
    cell = the_cell("elastic_resume", start)
    chain = jobs.chain(start)
    if isinstance(cell, table.Refused):
        return refused(chain["term"], cell)
    elastic = chain["elastic"]
    assert elastic.code == 0, elastic.output[-4000:]
    want = jobs.train(start).results("main")[0]["weights"]
    (got,) = elastic.results("main")
    close_weights(got["weights"], want, "resumed on one worker")


def max_difference(got: list, want: list) -> float:
    return max(float(np.max(np.abs(np.asarray(g) - np.asarray(w))))
               for g, w in zip(got, want, strict=True))


# --- refusals and failures ---------------------------------------------------------------


@pytest.mark.parametrize("start", START_NAMES)
def test_undecorated_refused(jobs, start):
    cell, run = the_cell("undecorated_refused", start), jobs.special(start, "undecorated")
    if isinstance(cell, table.Refused):
        return refused(run, cell)
    if starts.BY_NAME[start].workers <= 1:  # one process: plain Keras on one device
        assert run.code == 0, run.output[-4000:]
        close_weights(run.results("main")[0]["weights"],
                      jobs.reference().results("main")[0]["weights"], "undecorated")
        return
    assert run.code != 0, "an undecorated model trained on several processes"
    assert "@kmp.parallelize" in run.output, run.output[-4000:]
    assert not any(h for h in hooks(run)), "a step was trained before the refusal"
    assert run.ended_alone, "a process did not end by itself"


@pytest.mark.parametrize("start", START_NAMES)
def test_stall_error(jobs, start):
    cell, run = the_cell("stall_error", start), jobs.special(start, "stall")
    if isinstance(cell, table.Refused):
        return refused(run, cell)
    assert run.code != 0, "a stalled job succeeded"
    assert run.ended_alone, f"a process did not end by itself:\n{run.output[-4000:]}"
    victim = victim_of(start)
    assert f"stuck: worker {victim}\n" in run.output, run.output[-4000:]
    assert f"worker {victim}: stuck in act (conformance/job.py" in run.output, run.output[-4000:]
    for other in range(starts.BY_NAME[start].workers):  # a waiting peer is never named stuck
        if other != victim:
            assert f"stuck: worker {other}" not in run.output, run.output[-4000:]
            assert f"worker {other}: stuck" not in run.output, run.output[-4000:]


@pytest.mark.parametrize("start", START_NAMES)
def test_failure_exit(jobs, start):
    cell, run = the_cell("failure_exit", start), jobs.special(start, "raise")
    if isinstance(cell, table.Refused):
        return refused(run, cell)
    victim = victim_of(start)
    assert run.ended_alone, f"a process did not end by itself:\n{run.output[-4000:]}"
    assert all(code != 0 for code in run.codes), run.codes
    assert run.code == 1, f"exit code {run.code}:\n{run.output[-4000:]}"
    assert f"worker {victim} broke on purpose" in run.output, run.output[-4000:]


@pytest.mark.parametrize("start", START_NAMES)
def test_version_policy(jobs, start):
    cell, run = the_cell("version_policy", start), jobs.special(start, "version")
    if isinstance(cell, table.Refused):
        return refused(run, cell)
    assert run.code != 0, "an unchecked Keras trained"
    assert "KMP_ALLOW_UNCHECKED_VERSIONS" in run.output, run.output[-4000:]
    assert not any(h for h in hooks(run)), "a step was trained before the refusal"
    assert run.ended_alone, f"a process did not end by itself:\n{run.output[-4000:]}"
