"""Fit settings on 2 workers (MultiWorkerMirroredStrategy) end where one device ends.

One launched job runs several scenarios of `tests/fit_settings_scenarios.py`
(kept small for CI); the test process runs the same scenarios on one device.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests import fit_settings_scenarios as s

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(500)]


def on_each_worker():
    return {
        # First: behind the others' iterators, its own waited minutes for their destruction.
        "iterator_release": s.iterator_release("auto"),
        "steps_per_execution": s.steps_per_execution_run("auto"),
        "sync_batchnorm": s.sync_batchnorm_run("auto", sync=True),
        "mixed_spe": s.mixed_precision_run("auto", steps_per_execution=4, batch_hooks=True, **LOUD),
        "mixed_overflow": s.mixed_precision_run("auto", **s.OVERFLOW),
        "sparse": {(optimizer, kind): s.sparse_gradients_run("auto", optimizer, kind)
                   for optimizer in ("sgd", "adam") for kind in ("position", "tokens")},
        "habits": s.keras_habits_run("auto"),
        "refused": s.refused_settings("auto"),
        "xla": s.xla_and_accumulation_run("auto"),
        "accumulation": s.xla_and_accumulation_run("auto", jit_compile=False, **ACCUMULATION),
        "inputs": s.input_types_run("auto"),  # generator, PyDataset (threads), dict inputs
        "clip_ema": s.xla_and_accumulation_run("auto", jit_compile=False, **CLIP_EMA),
        "clip_accumulation": s.xla_and_accumulation_run("auto", **CLIP_ACCUMULATION),
        "loop_collectives": s.step_loop_collectives("auto"),
        "full_batches": s.full_batch_executions_run("auto"),
        "recompiled": s.recompile_outside_scope_run("auto"),
        "distiller": s.distiller_run("auto"),  # no call(): keras#21800; its losses logged
        "distiller_adam": s.distiller_run("auto", "adam", False, 2),
        "uneven": {case: s.uneven_batches_run("auto", *case) for case in UNEVEN_CASES},
        "uneven_lengths": s.uneven_lengths_run("auto"),
        "release_thread": s.release_state(),  # after the others: none blocked it
        # Last: without kmp's patch the job never ends (a forked data worker ignores SIGTERM).
        "processes": s.input_types_run("auto", ("py_dataset_processes",)),
    }


LOUD = {"scale_y": 30.0, "lr": 1e-4, "loud_half": 30.0}  # worker 1's half overflows float16
ACCUMULATION = {"accumulation": 3, "steps_per_execution": 4}  # updates straddle executions
CLIP_EMA = {"global_clipnorm": 0.5, "use_ema": True, "ema_momentum": 0.5, "ema_overwrite_frequency": 3}
CLIP_ACCUMULATION = {"clipvalue": 0.1, "accumulation": 2}  # with XLA
#: Uneven global batches on 2 workers (the rest of the settings run on 2 devices).
UNEVEN_CASES = [("31_on_2", "mse"), ("one_row", "mse"), ("partial_last", "sample_weight"),
                ("partial_last", "sum_loss"), ("partial_last", "mixed_float16"),
                ("partial_last", "steps_per_execution"), ("partial_last", "custom_step")]


@pytest.fixture(scope="module")
def workers():
    return kmp.launch(on_each_worker, num_workers=2, timeout=450)


def test_workers_agree_bit_for_bit(workers):
    first, second = workers
    for key in ("steps_per_execution", "sync_batchnorm", "mixed_spe", "habits", "xla", "accumulation",
                "clip_ema", "clip_accumulation"):
        for a, b in zip(first[key]["weights"], second[key]["weights"], strict=True):
            assert np.array_equal(a, b), key
    assert first["steps_per_execution"]["history"] == second["steps_per_execution"]["history"]
    assert first["habits"]["histories"] == second["habits"]["histories"]
    assert first["steps_per_execution"]["evaluate"] == second["steps_per_execution"]["evaluate"]


def test_steps_per_execution_with_batch_hooks_matches_one_device(workers):
    one = s.steps_per_execution_run("default")
    for got in workers:
        run = got["steps_per_execution"]
        s.assert_close(run["weights"], one["weights"])
        for key, values in one["history"].items():
            np.testing.assert_allclose(run["history"][key], values, atol=1e-5)
        for key, value in one["evaluate"].items():
            np.testing.assert_allclose(run["evaluate"][key], value, atol=1e-5)
        np.testing.assert_allclose(run["predict"], one["predict"], atol=1e-5)  # every row, in order
        assert run["train_batches"] == one["train_batches"]
    assert workers[0]["steps_per_execution"]["saved"] == one["saved"]  # the chief's checkpoints


def test_steps_per_execution_reduces_the_logs_once_per_execution(workers):
    """Per step: the packed gradient all-reduce, and TensorFlow's input check that every
    worker has a batch unless the execution's batches are known to be full; the logs (loss,
    mae) are reduced across workers after the loop, not per step. With one step per
    execution, the step runs the gradients' all-reduce and one per log (loss, mae); a full
    batch is fetched with no collective, another with TensorFlow's check (as Keras's own step
    fetches every batch)."""
    for worker in workers:
        assert worker["loop_collectives"] == {"checked": {"per_step": 2, "per_execution": 1},
                                              "full_batches": {"per_step": 1, "per_execution": 0},
                                              "single": {"step": 3, "full_fetch": 0,
                                                         "checked_fetch": 1}}


def test_executions_of_full_batches_skip_the_input_check_and_train_as_one_device(workers):
    one = s.full_batch_executions_run("default")
    assert one["claims"] == [] and one["uneven"]["claims"] == []  # one process: Keras's loop
    # 11 batches (the last partial), 4 per execution, 2 epochs: the execution reaching the
    # partial batch keeps the check. Then one iterator kept over 3 epochs of 4 steps, 2 per
    # execution, on 10 batches: Keras runs 5 executions (its input runs out), all full.
    expected = [True, True, False] * 2 + [True] * 5
    for got in workers:
        assert got["full_batches"]["claims"] == expected
        s.assert_close(got["full_batches"]["weights"], one["weights"])
        for run, want in zip(got["full_batches"]["histories"], one["histories"], strict=True):
            for key, values in want.items():
                np.testing.assert_allclose(run[key], values, atol=1e-5)
    for a, b in zip(workers[0]["full_batches"]["weights"], workers[1]["full_batches"]["weights"],
                    strict=True):
        assert np.array_equal(a, b)


def test_single_steps_of_full_batches_skip_the_input_check_and_train_as_one_device(workers):
    """steps_per_execution=1: the 10 full batches' steps fetch without TensorFlow's check,
    the partial last one keeps it; the weights and the History are one device's."""
    one = s.full_batch_executions_run("default")["single"]
    assert one["claims"] == []  # one process: Keras's own step
    for got in workers:
        single = got["full_batches"]["single"]
        assert single["claims"] == [True] * 10 + [False]
        s.assert_close(single["weights"], one["weights"])
        for key, values in one["history"].items():
            np.testing.assert_allclose(single["history"][key], values, atol=1e-5)


def test_workers_with_arrays_of_different_lengths_agree_on_the_full_batches(workers):
    """10 full batches on worker 0, 9 and a partial one on worker 1, 2 per execution: the
    workers agree on 9, so the 5th execution keeps TensorFlow's check on both (a worker
    skipping it alone would leave the other waiting in its collective)."""
    for got in workers:
        assert got["full_batches"]["uneven"]["claims"] == [True] * 4 + [False]
    for a, b in zip(workers[0]["full_batches"]["uneven"]["weights"],
                    workers[1]["full_batches"]["uneven"]["weights"], strict=True):
        assert np.array_equal(a, b)


def test_used_iterators_are_destroyed_off_the_training_thread(workers):
    """Destroying a used distributed iterator blocked the training thread for 0.24-15 s per
    fit on 2 workers; kmp's release thread destroys each once its fit has returned (and
    every one is destroyed: none leaks, none is stuck behind an earlier scenario's)."""
    from keras_mgpu_plugins.backends.tensorflow.patches.iterators import REAPER_NAME

    for worker in workers:
        threads, made, state = worker["iterator_release"]
        # the epoch's: kmp builds the model from the input's spec (no iterator drawn from),
        # and for arrays defers the one Keras makes at the epoch's end
        assert made >= 1
        assert threads == [REAPER_NAME] * made, state


def test_no_iterator_destruction_is_stuck_after_every_scenario(workers):
    """Under load destructions fall behind (seconds each), but none may block the thread."""
    for worker in workers:
        state = worker["release_thread"]
        assert state["alive"] and not state["stalled"], state
        assert state["busy_for_s"] is None or state["busy_for_s"] < 60, state


def test_sync_batchnorm_matches_one_device_on_the_global_batch(workers):
    one = s.sync_batchnorm_run("default", sync=False)
    s.assert_close(workers[0]["sync_batchnorm"]["weights"], one["weights"])


def test_mixed_precision_with_steps_per_execution_and_batch_hooks_like_one_device(workers):
    one = s.mixed_precision_run("default", steps_per_execution=4, batch_hooks=True, **LOUD)
    run = workers[0]["mixed_spe"]
    assert run["scale"] == one["scale"] < 32768.0
    assert run["train_batches"] == one["train_batches"] == s.execution_batches(0, 4) * 3
    assert run["saved"] == one["saved"] and one["saved"]
    np.testing.assert_allclose(run["history"]["loss"], one["history"]["loss"], rtol=1e-4)


def test_keras_habits_match_one_device(workers):
    one = s.keras_habits_run("default")
    run = workers[0]["habits"]
    s.assert_close(run["weights"], one["weights"])
    for got, want in zip(run["histories"], one["histories"], strict=True):
        for key in want:  # the loss tracker fed by a custom train_step: one device's loss
            np.testing.assert_allclose(got[key], want[key], atol=1e-5, err_msg=key)
    for key, value in one["evaluate"].items():
        np.testing.assert_allclose(run["evaluate"][key], value, atol=1e-5, err_msg=key)
    np.testing.assert_allclose(run["predict"], one["predict"], atol=1e-5)


def test_refused_settings_name_the_multi_worker_strategy(workers):
    for got in workers:
        custom = got["refused"]["jit_compile_custom_train_step"]
        assert "jit_compile=True" in custom and "MultiWorkerMirroredStrategy" in custom
        assert "sync_batchnorm=False" in got["refused"]["jit_compile_sync_batchnorm"]


def assert_same_run(got, want):
    s.assert_close(got["weights"], want["weights"])
    for key, values in want["history"].items():
        np.testing.assert_allclose(got["history"][key], values, atol=1e-5, err_msg=key)
    for key, value in want["evaluate"].items():
        np.testing.assert_allclose(got["evaluate"][key], value, atol=1e-5, err_msg=key)
    assert got["iterations"] == want["iterations"]


def test_jit_compile_compiles_each_worker_step_and_trains_as_one_device(workers):
    one = s.xla_and_accumulation_run("default")
    for got in workers:
        assert got["xla"]["xla"] and all(got["xla"]["xla"])  # each worker's step was XLA's
        assert_same_run(got["xla"], one)


def test_gradient_accumulation_matches_one_device_accumulating_the_global_micro_batches(workers):
    one = s.xla_and_accumulation_run("default", jit_compile=False, **ACCUMULATION)
    assert one["iterations"] == 5  # 16 micro-batches, an update every 3
    for got in workers:
        assert_same_run(got["accumulation"], one)


def test_generator_py_dataset_and_dict_inputs_train_as_one_process(workers):
    one = s.input_types_run("default")
    for got in workers:
        for kind in ("generator", "py_dataset", "dict_multi_io"):
            s.assert_close(got["inputs"][kind], one[kind], what=kind)
        assert got["inputs"]["data_changed"] == 0.0  # numpy_function_owned_outputs
        for key, values in one["dict_multi_io_history"].items():
            np.testing.assert_allclose(got["inputs"]["dict_multi_io_history"][key], values, atol=1e-5)


def test_clipping_and_ema_overwrite_match_one_device(workers):
    """Clipped after the all-reduce (global_clipnorm, clipvalue with accumulation and XLA), the
    EMA overwrite in the cross-replica context: as one device."""
    for key, settings in (("clip_ema", {"jit_compile": False, **CLIP_EMA}),
                          ("clip_accumulation", CLIP_ACCUMULATION)):
        one = s.xla_and_accumulation_run("default", **settings)
        for got in workers:
            assert_same_run(got[key], one)


def test_py_dataset_with_forked_workers_ends_and_trains_as_one_process(workers):
    """PyDataset(use_multiprocessing=True) on 2 workers: both processes exit (the launch
    returned) and train on the data one process trains on."""
    one = s.input_types_run("default", ("py_dataset_processes",))
    for got in workers:
        s.assert_close(got["processes"]["py_dataset_processes"], one["py_dataset_processes"])


def test_a_model_compiled_again_outside_the_scope_logs_the_global_loss(workers):
    """Without kmp's compile_in_model_strategy_scope patch each worker logged its own loss."""
    one = s.recompile_outside_scope_run("default")
    for got in workers:
        for run, want in zip(got["recompiled"]["histories"], one["histories"], strict=True):
            for key, values in want.items():
                np.testing.assert_allclose(run[key], values, atol=1e-5, err_msg=key)
        for run, want in zip(got["recompiled"]["weights"], one["weights"], strict=True):
            s.assert_close(run, want)
    assert workers[0]["recompiled"]["histories"] == workers[1]["recompiled"]["histories"]


def test_mixed_precision_overflow_of_the_global_batch_only_skips_the_step_as_one_device(workers):
    """Each worker's half-batch float16 gradient fits where the global batch's overflows."""
    one = s.mixed_precision_run("default", **s.OVERFLOW)
    assert one["scales"][:7] == [16384.0, 8192.0] + [8192.0] * 4 + [4096.0]
    for got in workers:
        assert got["mixed_overflow"]["scales"] == one["scales"]
        s.assert_close(got["mixed_overflow"]["weights"], one["weights"])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_sparse_gradients_train_as_one_device(workers, optimizer):
    """A position embedding as plain Keras on one device; repeated tokens as kmp on one device
    and as the dense gradient (plain Keras squares each repeated row's slices with Adam)."""
    plain = s.sparse_gradients_run(None, optimizer, "position")
    dense = s.sparse_gradients_run(None, optimizer, "tokens", dense=True)
    for got in workers:
        s.assert_close(got["sparse"][(optimizer, "position")]["weights"], plain["weights"])
        s.assert_close(got["sparse"][(optimizer, "tokens")]["weights"], dense["weights"])
    for a, b in zip(workers[0]["sparse"][(optimizer, "tokens")]["weights"],
                    workers[1]["sparse"][(optimizer, "tokens")]["weights"], strict=True):
        assert np.array_equal(a, b)




@pytest.mark.parametrize("key, args", [("distiller", ()), ("distiller_adam", ("adam", False, 2))])
def test_knowledge_distillation_trains_and_logs_as_one_device(workers, key, args):
    """keras.io's Distiller (no call(), losses logged by its own train_step and test_step):
    weights, History and evaluate as one device, the same logs on both workers."""
    one = s.distiller_run("default", *args)
    for got in workers:
        run = got[key]
        s.assert_close(run["weights"], one["weights"])
        assert run["history"].keys() == one["history"].keys()
        for name, values in one["history"].items():
            np.testing.assert_allclose(run["history"][name], values, atol=1e-5, err_msg=name)
        assert run["evaluate"].keys() == one["evaluate"].keys()
        for name, value in one["evaluate"].items():
            np.testing.assert_allclose(run["evaluate"][name], value, atol=1e-5, err_msg=name)
    assert workers[0][key]["history"] == workers[1][key]["history"]
    assert workers[0][key]["evaluate"] == workers[1][key]["evaluate"]


@pytest.mark.parametrize("shape, setting", UNEVEN_CASES, ids=[f"{a}-{b}" for a, b in UNEVEN_CASES])
def test_an_uneven_or_tiny_global_batch_trains_as_one_device(workers, shape, setting):
    """31 rows on 2 workers (16 and 15), a data set of 1 row (1 and none), the partial last
    batch of 21 rows in 8s (3 and 2): before uneven_batches_weighted_by_rows, 2.8e-3 to
    1.7e-2 off one device on the weights (and a data set of 1 row failed to build with a
    regularizer on the worker of no rows)."""
    one = s.uneven_batches_run("default", shape, setting)
    atol = 2e-4 if setting == "mixed_float16" else 1e-5  # float16's rounding per replica
    for got in workers:
        run = got["uneven"][(shape, setting)]
        assert run["history"].keys() == one["history"].keys()
        worst = s.largest_differences(run, one)
        assert max(worst.values()) <= atol, worst
    first, second = (w["uneven"][(shape, setting)] for w in workers)
    assert first["history"] == second["history"]
    for a, b in zip(first["weights"], second["weights"], strict=True):
        assert np.array_equal(a, b)


def test_workers_agree_to_weigh_rows_when_one_has_an_uneven_last_batch(workers):
    """40 rows on worker 0 (even), 39 on worker 1: both weigh rows (else their steps would run
    different collectives), and end with the same weights."""
    assert [w["uneven_lengths"]["weighted"] for w in workers] == [1, 1]
    for a, b in zip(*(w["uneven_lengths"]["weights"] for w in workers), strict=True):
        assert np.array_equal(a, b)
