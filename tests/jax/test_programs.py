"""Keras-on-JAX programs written by others run unchanged on 2 devices, on 2 processes and, for
the large-model ones, with `strategy="model_parallel"`, as on one device: `kmp.verify`.

Six programs (`tests/programs/jax_*.py`: keras.io's custom JAX `train_step` guide, its image
classifier with augmentation layers, its miniature GPT with a callback that predicts, its
distribution guide with its own LayoutMap, and two keras-hub tasks built from small
configs: a `BertTextClassifier` whose class overrides `fit`, a `GemmaCausalLM` with the
backbone's own `get_layout_map`), each with a row count or a batch that does not divide
over 2 devices, adapted with the decorator alone (`tests/jax/programs.py`), one after the
other in one function that `kmp.verify` runs on one device, on one device with the rows
of each batch reversed (each program's float noise), and on 2 devices (each large-model
program again with `strategy="model_parallel"`) or 2 processes: every step of each fit,
its validation logs, its variables at the end, `evaluate` and `predict` must be within
ten times the program's noise (1e-6 at least), and with 2 processes both must log and
hold the same. The figures:

    PYTHONPATH=. KERAS_BACKEND=jax python -m tests.jax.programs --table
"""

from __future__ import annotations

import sys

import pytest

from tests.jax import helpers, programs
from tests.programs import JAX_PROGRAMS

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(1800)]


@pytest.fixture(autouse=True)
def jax_environment(monkeypatch):
    if "keras_hub" not in sys.modules:
        pytest.importorskip("keras_hub")
    for key, value in helpers.environment().items():
        monkeypatch.setenv(key, value)


def assert_every_run_equal(report, mode: str) -> None:
    names = {i + 1: f"{n}/{h}" for i, (n, h) in enumerate(programs.runs_of(mode))}
    print("fits:", names, report, sep="\n")  # the figures, with pytest -s
    assert report.verdict != "cannot compare", report
    failing = sorted({int(r["figure"].split(":")[0].split()[1]) for r in report.rows
                      if not r["within"]})
    assert not failing, f"{[names[i] for i in failing]} differ from one device:\n{report}"
    predicted = {int(r["figure"].split(":")[0].split()[1]) for r in report.rows
                 if r["figure"].endswith("predict")}
    assert predicted == set(names) and report.ok, report


def test_programs_on_two_devices_and_model_parallel_train_as_one_device():
    large = [n for n in JAX_PROGRAMS if getattr(programs.program(n), "LARGE", False)]
    assert len(large) >= 3 and ("jax_hub_gemma", "model_parallel") in programs.runs_of(
        "devices")
    assert_every_run_equal(programs.verified("devices"), "devices")


def test_programs_on_two_processes_train_as_one_device_and_alike():
    report = programs.verified("processes")
    assert any(r["figure"].endswith("every process logs and holds the same")
               for r in report.rows), report
    assert_every_run_equal(report, "processes")
