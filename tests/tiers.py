"""The fast tier: what `python -m pytest -q` runs without a path (README's command 2), per lane.

Each lane's core promises, one real run each (2 devices or 2 workers against one device;
checkpoints written once, by the chief; every worker stopping at the same epoch; a stop signal
saving one agreed step, resumed bit-exact; the launcher's quiet output; the documented installs
and manifests). `tests/conftest.py` marks these tests `fast` on every run, and selects them alone
when pytest is given no path, no `-m` and no `-k` (and `KMP_TESTS_TIER` is not `full`). Every
test, the conformance suite included: `python -m pytest -q tests` (what `.ci/run` runs).

An entry is a test file, or a test (its parametrized cases included): `path::name`.
"""

from __future__ import annotations

#: Tests that hold on any backend (documents, CI, pure logic).
EVERY_LANE = [
    "tests/unit/test_install_docs.py",
    "tests/unit/test_launch_quiet.py",
    "tests/unit/test_public_api.py",
]

FAST_TIER: dict[str, list[str]] = {
    "tensorflow": [
        *EVERY_LANE,
        "tests/unit/test_ci.py",
        "tests/unit/test_topology.py",
        "tests/unit/test_early_stopping.py",
        # the drop-in parity with Keras's ModelCheckpoint: two of its cases (all: ~2 minutes)
        "tests/unit/test_model_checkpoint.py::test_same_files_content_and_messages_as_keras"
        "[best_val_loss_named-sync]",
        "tests/unit/test_model_checkpoint.py::test_same_files_content_and_messages_as_keras"
        "[every_2_batches-async]",
        "tests/unit/test_backup_and_restore.py",
        "tests/integration/test_kubernetes_manifests.py",
        # 2 replicas in one process against one device
        "tests/multi_device/test_parallelize.py::test_mirrored_fit_matches_one_device_fit",
        "tests/multi_device/test_weight_sync_verifier.py::test_no_false_alarm_over_several_epochs_with_batch_norm_dropout_adam",
        "tests/multi_device/test_weight_sync_verifier.py::test_planted_drift_raises_naming_variable_replica_and_difference",
        # 2 real workers against one process
        "tests/multi_worker/test_fit.py::test_workers_hold_bit_identical_weights_and_history",
        "tests/multi_worker/test_fit.py::test_same_weights_as_one_process_on_the_same_global_batches",
        "tests/multi_worker/test_model_checkpoint.py::test_only_the_chief_writes_each_checkpoint_once",
        "tests/multi_worker/test_model_checkpoint.py::test_checkpoints_hold_the_weights_both_workers_trained",
        "tests/multi_worker/test_early_stopping.py::test_both_workers_stop_at_the_same_epoch_with_identical_weights",
        "tests/multi_worker/test_early_stopping.py::test_same_decision_and_weights_as_one_process",
        "tests/multi_worker/test_preemption.py::test_sigterm_to_one_worker_stops_both_at_one_step_and_the_rerun_is_bit_exact",
        "tests/integration/test_quickstart_output.py",
    ],
    "jax": [
        *EVERY_LANE,
        "tests/jax/test_parity.py",
        "tests/jax/test_callbacks.py::test_every_process_ran_on_two_devices_each",
        "tests/jax/test_callbacks.py::test_process_0_alone_writes_each_checkpoint_atomically",
        "tests/jax/test_callbacks.py::test_early_stopping_stops_every_process_at_the_chiefs_epoch_with_the_best_weights",
        "tests/jax/test_callbacks.py::test_weight_sync_checks_every_device_copy_without_false_alarm",
        "tests/jax/test_callbacks.py::test_a_killed_process_then_relaunch_resumes_bit_exact",
        "tests/jax/test_quickstart.py::test_a_two_process_quickstart_prints_at_most_three_lines_of_its_own",
    ],
    "torch": [
        *EVERY_LANE,
        "tests/torch/test_parity.py",
        "tests/torch/test_callbacks.py::test_every_process_ran_in_the_process_group",
        "tests/torch/test_callbacks.py::test_process_0_alone_writes_each_checkpoint_atomically",
        "tests/torch/test_callbacks.py::test_early_stopping_stops_every_process_at_the_chiefs_epoch_with_the_best_weights",
        "tests/torch/test_callbacks.py::test_weight_sync_checks_every_process_copy_without_false_alarm",
        "tests/torch/test_callbacks.py::test_a_killed_process_then_relaunch_resumes_a_shuffled_fit_bit_exact",
        "tests/torch/test_quickstart.py::test_the_quickstart_trains_on_two_processes[kmp-launch]",
    ],
}


def in_fast_tier(nodeid: str, backend: str) -> bool:
    """Whether the test `nodeid` (pytest's id, from the rootdir) is in `backend`'s fast tier."""
    for entry in FAST_TIER.get(backend, []):
        if nodeid == entry or nodeid.startswith(entry + ("[" if "::" in entry else "::")):
            return True
    return False


def fast_tier_files(backend: str) -> set[str]:
    """The test files the fast tier of `backend` collects."""
    return {entry.split("::")[0] for entry in FAST_TIER.get(backend, [])}
