"""What the last canary run found: keras-nightly, each patch's verdict there, the test counts.

`.ci/run canary` installs the newest keras-nightly (the next Keras release, built every
night) with TensorFlow, and again with JAX alone, and runs CI's compatibility subset and
the JAX job's tests there with `KMP_ALLOW_UNCHECKED_VERSIONS=1` (a nightly is never a
checked version: the 2-device and 2-worker tests are the comparison with one device
that the switch asks for). It is not part of `.ci/run all`: a nightly may break on any
day. Its last result is recorded here by hand, and in README.md ("Tested versions"); a
test keeps the two equal and gives every patch a verdict:

- "needed": the nightly still has the code the patch fixes, and its test without the
  patch still fails there (or, for a feature, the Keras method it wraps is there and its
  tests pass);
- "changed": upstream changed what the patch touches; the patch follows (the note says how);
- "fixed upstream": the nightly no longer has the bug: the patch is not applied there.

`kmp.compat.report()` shows each patch's verdict beside what it finds on the installed
versions.
"""

from __future__ import annotations

import dataclasses

VERDICT_KINDS = ("needed", "changed", "fixed upstream")


@dataclasses.dataclass(frozen=True)
class CanaryRun:
    """One run of `.ci/run canary`.

    Attributes:
        date: When it ran (ISO date).
        keras: The keras-nightly version installed.
        tensorflow: The TensorFlow version beside it.
        jax: The JAX version of the JAX-only environment.
        tensorflow_subset: pytest's summary of CI's compatibility subset there.
        jax_subset: pytest's summary of the JAX job's tests there.
        torch_subset: pytest's summary of the torch lane's tests there.
    """

    date: str
    keras: str
    tensorflow: str
    jax: str
    tensorflow_subset: str
    jax_subset: str
    torch: str
    torch_subset: str

    def summary(self) -> str:
        return (f"{self.date}, keras-nightly {self.keras} with TensorFlow {self.tensorflow}: "
                f"{self.tensorflow_subset}; with JAX {self.jax}: {self.jax_subset}; with torch "
                f"{self.torch}: {self.torch_subset}")


LAST_RUN = CanaryRun(
    date="2026-11-28", keras="3.16.0.dev2026102704", tensorflow="2.21.0", jax="0.10.2",
    tensorflow_subset="279 passed, 8 skipped, 1 deselected", jax_subset="180 passed, 15 skipped",
    torch="2.13.0", torch_subset="67 passed",
)

_TRAINER = "it wraps the TensorFlow trainer, renamed Trainer there"
#: Per patch of `PATCHES`: (verdict, what the canary found) on `LAST_RUN`. The tests named
#: fail without the patch there (workarounds), or pass with it (features); the ones not in
#: the canary's subsets were run there by hand on the same day.
VERDICTS: dict[str, tuple[str, str]] = {
    "symbolic_build_per_replica_batch": ("needed", "keras-team/keras#20585 unfixed: 2 workers "
                                         f"fail naming PerReplica without it; {_TRAINER}"),
    "symbolic_build_from_element_spec": ("needed", "added after this run: keras-nightly's "
                                         "_maybe_symbolic_build still draws a batch (next(it)) "
                                         "and its _symbolic_build reads only each leaf's shape "
                                         "and dtype (its source read, the test not run there)"),
    "symbolic_build_without_call": ("needed", "keras-team/keras#21800: 'Unable to automatically "
                                    f"build the model' without it; {_TRAINER}"),
    "multi_worker_scalar_log_reduce": ("needed", "keras-team/keras#20585 unfixed: 'Invalid "
                                       "reduction dimension 0' on 2 workers without it"),
    "steps_per_execution_under_distribution": ("needed", "'You must feed a value for placeholder "
                                               "tensor' without it"),
    "loss_scale_global_finiteness": ("needed", "NaN weights without it"),
    "gradient_accumulation_under_distribution": ("needed", "merge_call error without it"),
    "clip_after_all_reduce": ("changed", "clipping still differs from one device without it; "
                              "Keras's TensorFlow optimizer now runs the EMA overwrite's cond "
                              "cross-replica itself, and the patch leaves that part to it"),
    "sum_duplicate_sparse_gradient_rows": ("needed", "a position embedding with Adam differs "
                                           "from one device without it"),
    "py_dataset_pool_default_sigterm": ("needed", "the pool's forked workers ignore SIGTERM "
                                        "without it"),
    "release_iterators_off_thread": ("needed", "Keras still drops the iterator on the training "
                                     "thread; tests/multi_worker/test_fit_settings.py passed"),
    "full_batch_executions_skip_input_check": ("needed", "TensorFlow 2.21's per-step check "
                                               "unchanged; tests/multi_worker/test_fit_settings.py "
                                               "passed"),
    "defer_epoch_end_iterator": ("needed", "added after this run: keras-nightly's "
                                 "EpochIterator._enumerate_iterator still makes the unread "
                                 "iterator (its source read, the test not run there)"),
    "one_multi_worker_strategy": ("needed", "added after this run: TensorFlow still makes a "
                                  "new collective strategy at each construction (its source "
                                  "read, the test not run there)"),
    "compile_in_model_strategy_scope": ("needed", "each worker logs its own loss without it "
                                        "(tests/multi_worker/test_fit_settings.py)"),
    "jit_compile_per_replica": ("needed", f"XLA device error without it; {_TRAINER}"),
    "uneven_batches_weighted_by_rows": ("needed", "read, not run by the canary (added after "
                                        "it): the nightly's loss.py still scales each "
                                        "replica's loss by 1/replicas"),
    "custom_step_logs_unscaled": ("needed", "a custom step's loss logged halved without it"),
    "numpy_function_owned_outputs": ("changed", "TensorFlow still writes into the user's arrays "
                                     "where the step fetches its batch inside its function "
                                     "(steps_per_execution > 1); Keras now fetches a "
                                     "steps_per_execution=1 batch eagerly, where it does not"),
    "chief_only_progress_bars": ("needed", "tests/multi_worker/test_launch_cli.py passed"),
    "same_callbacks_on_every_worker": ("needed", "tests/multi_worker/test_same_callbacks.py "
                                       "passed"),
    "stall_watchdog_on_every_fit": ("needed", "tests/unit/test_stall_watchdog.py passed"),
    "resume_skips_trained_batches": ("needed", "keras-nightly's fit still makes epoch_iterator "
                                     "before on_train_begin; tests/multi_worker/test_resume.py "
                                     "passed with it by hand"),
    "csv_logger_resumes": ("needed", "keras-nightly's CSVLogger still overwrites its file "
                           "(append=False); tests/multi_worker/test_resume.py passed with it "
                           "by hand"),
    "placed_model_clone_warning": ("needed", "tests/multi_device/test_model_parallel.py passed"),
    "placement_records_layer_calls": ("needed", "tests/multi_device/test_model_parallel.py "
                                      "passed"),
    "placed_graph_run": ("needed", "tests/multi_device/test_model_parallel.py passed"),
    "placed_layer_call": ("needed", "tests/multi_device/test_model_parallel.py passed"),
    "placed_train_step": ("needed", "tests/multi_device/test_model_parallel.py passed"),
    "placed_compile_keeps_placement": ("needed", "tests/multi_device/test_model_parallel.py "
                                       "passed"),
    "hybrid_compile_in_strategy_scope": ("needed", "tests/multi_worker/test_hybrid.py passed"),
    "placed_optimizer_slots": ("needed", "tests/multi_device/test_model_parallel.py passed"),
    "placement_report_on_first_fit": ("needed", "tests/multi_device/test_model_parallel.py "
                                      "passed"),
    "multi_gpu_parallel_methods": ("needed", "tests/multi_device/test_multi_gpu_model.py passed"),
    "multi_gpu_template_watch": ("needed", "tests/multi_device/test_multi_gpu_model.py passed"),
    "jax_inputs_as_on_one_device": ("needed", "the JAX lane's tests passed"),
    "progbar_hidden_keys": ("needed", "tests/multi_device/test_device_metrics_logger.py passed"),
    "compile_adopts_state_made_outside": ("needed", "keras-team/keras#17187 unfixed: without it a "
                                          "schedule decays twice as fast and Adam made outside "
                                          "fails in fit (tests/multi_device/test_fine_tuning.py "
                                          "passed)"),
    "overridden_compile_adopts_its_arguments": ("needed", "without it a second optimizer counts "
                                                "each replica's step "
                                                "(tests/multi_device/test_fine_tuning.py)"),
    "same_calls_on_every_worker": ("needed", "tests/multi_worker/test_calls.py passed"),
    "jax_partial_batches_replicated": ("changed", "Keras's _distribute_data takes is_super_batch "
                                       "(steps_per_execution's stacked batches): kmp passes it "
                                       "on and leaves a super batch to Keras; "
                                       "tests/jax/test_parity.py passed"),
    "jax_predict_outputs_gathered": ("needed", "tests/jax/test_parity.py passed"),
    "jax_compile_under_model_distribution": ("changed", "Keras's JAX variable moved to "
                                             "backend.jax.ops.core.Variable (the resolver "
                                             "follows); tests/jax/test_fine_tuning.py passed"),
    "parameter_server_methods": ("needed", "tests/multi_worker/test_parameter_server.py passed"),
    "atomic_variable_updates": ("needed", "2 workers still lose steps without it "
                                "(tests/multi_worker/test_parameter_server.py)"),
    "partitioned_initialization": ("needed", "without it the whole table is now drawn on each "
                                   "parameter server (847 MB each for a 256 MiB table) instead "
                                   "of the chief"),
    "sharded_embedding_lookup": ("needed", "without it the worker still reads the whole table "
                                 "(tests/multi_worker/test_parameter_server.py)"),
    "sharded_gradient_sources": ("needed", "tests/multi_worker/test_parameter_server.py passed"),
    "sharded_optimizer_updates": ("needed", "tests/multi_worker/test_parameter_server.py passed"),
    "sharded_optimizer_slots": ("needed", "tests/multi_worker/test_parameter_server.py passed"),
    "torch_one_model_per_job": ("changed", "keras-nightly runs DistributedDataParallel in fit "
                                "(keras-team/keras#23316): kmp uses it and checks it against "
                                "one device; tests/torch passed"),
    "torch_steps_as_one_device": ("needed", "tests/torch passed (global logs, BatchNormalization "
                                  "state from rank 0, predict gathered)"),
    "torch_gradients_averaged": ("changed", "upstream DDP averages the gradients without "
                                 "weighting an uneven last batch: kmp weights each process's "
                                 "loss by its rows and multiplies DDP's average back; "
                                 "tests/torch passed"),
    "torch_sync_batchnorm": ("needed", "BatchNormalization(synchronized=True) is still "
                             "TensorFlow's only; tests/torch passed"),
    # kmp-verify's two records came after the last canary run: not run on a nightly yet.
    "verify_records_calls": ("needed", "added after this canary run: not run on keras-nightly "
                             "yet (tests/verify)"),
    "verify_noise_rows_reversed": ("needed", "added after this canary run: not run on "
                                   "keras-nightly yet (tests/verify)"),
    "random_draws_as_one_device": ("needed", "added after this canary run: not run on "
                                   "keras-nightly yet (tests/verify)"),
    "random_layer_rows": ("needed", "added after this canary run: not run on keras-nightly "
                          "yet (tests/verify)"),
}


def verdict(name: str) -> str:
    """Patch `name`'s verdict on the last canary run, as one phrase."""
    kind, note = VERDICTS.get(name, ("not run", ""))
    return kind + (f" ({note})" if note else "")
