"""keras.io example programs train on 2 devices and 2 workers as on one device: `kmp.verify`.

Each program of `tests/programs` (five keras.io examples, small and seeded) is trained
adapted as README.md says (`@kmp.parallelize` on the factory, kmp's callbacks), with SGD
and with the program's own optimizer, one after the other in one function
(`harness.every_case`), which `kmp.verify` runs on one device, on one device with the
rows of each batch reversed (each program's float noise) and on 2 simulated devices:
every step of each program's fit (loss, metrics, variables), its validation logs, every
variable at its end and its final `evaluate` must be within ten times that noise (1e-6
at least). Two of the programs also run on 2 workers (`processes=True`: real processes).
The figures: `PYTHONPATH=. python -m tests.programs.harness --table`.

kmp.verify compares with kmp on one device. Where a batch repeats an Embedding row (the
text transformer's tokens), Keras 3's Adam-family optimizers square each repeated row's
slices on one device: plain Keras is then off the dense gradient's update, and kmp, which
sums the rows first on 1 and N devices (sum_duplicate_sparse_gradient_rows,
docs/distribution_matrix.md), trains otherwise than plain Keras; that difference is
asserted to be there.
"""

from __future__ import annotations

import pytest

from tests.programs import harness

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

CASES = harness.all_cases()
ON_WORKERS = [("mnist_convnet", "program"), ("feature_space", "program")]  # the cheapest
KMP_ONE_DEVICE = {("text_transformer", "program")}


def assert_every_case_equal(report, cases) -> None:
    names = {i + 1: f"{n}/{o}" for i, (n, o) in enumerate(cases)}
    print("fits:", names, report, sep="\n")  # the figures, with pytest -s
    assert report.verdict != "cannot compare", report
    failing = sorted({int(r["figure"].split(":")[0].split()[1]) for r in report.rows
                      if not r["within"]})
    assert not failing, f"{[names[i] for i in failing]} differ from one device:\n{report}"
    assert report.ok and report.steps > 0, report
    # every fit of every case was compared, each with its evaluate
    evaluated = {int(r["figure"].split(":")[0].split()[1]) for r in report.rows
                 if "evaluate" in r["figure"]}
    assert evaluated == set(names), report


def test_two_devices_train_as_one_device():
    assert_every_case_equal(harness.verified(CASES), CASES)


@pytest.mark.multi_worker
def test_two_workers_train_as_one_device():
    report = harness.verified(ON_WORKERS, processes=True)
    assert report.processes
    assert_every_case_equal(report, ON_WORKERS)


@pytest.mark.parametrize(("name", "optimizer"), sorted(KMP_ONE_DEVICE))
def test_plain_keras_is_off_the_dense_update_where_a_batch_repeats_an_embedding_row(
        name, optimizer):
    """Why kmp on one device is not plain Keras there (Adam squares each repeated row's
    slices); drop the case from KMP_ONE_DEVICE when not."""
    difference = harness.largest_difference(harness.train(name, optimizer, parallel=False),
                                            harness.train(name, optimizer, "default"))
    assert difference["weights"] > 1e-4, difference
