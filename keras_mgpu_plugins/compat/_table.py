"""The workarounds of upstream Keras/TensorFlow bugs: `WORKAROUNDS`, applied by `patch_keras()`.

Each names the upstream issue it works around and the Keras (or, for a
TensorFlow bug, TensorFlow) versions it is known for (it is applied only
there), the symptom it fixes, what it replaces and which patch it must wrap,
and is tested by a real run that fails without it (`tests/multi_worker/test_fit.py`,
`tests/multi_device/test_fit_settings.py`). The patches themselves live in
`patches.trainer`, `patches.element_spec`, `patches.loss_scale`, `patches.compile_settings`, `patches.optimizer`,
`patches.data`, `patches.iterators`, `patches.input_check`, `patches.row_weights`,
`patches.custom_step` and `patches.outside_scope`.
"""

from __future__ import annotations

from keras_mgpu_plugins.compat._checks import CHECKED_BELOW
from keras_mgpu_plugins.compat._record import Patch, lazy
from keras_mgpu_plugins.compat._table_build import BUILD

_KERAS_MAX, _TF_MAX = CHECKED_BELOW["keras"], CHECKED_BELOW["tensorflow"]

# Versions read from the released sources: `_maybe_symbolic_build` first appears
# in 3.5.0; the multi-worker "mean" branch with axis=0 in 3.3.0 (before it,
# "auto" meant a sum with axis=None, which works). Older Keras is refused for distribution
# anyway (`check_keras_for_distribution`). Every patch below is run-tested on Keras 3.10 +
# TensorFlow 2.16 and Keras 3.15 + TensorFlow 2.21: CI runs on both pairs (README.md, "Tested
# versions") the tests that exercise each one and, for most, fail without it; those of the
# multi-worker-only patches (py_dataset_pool_default_sigterm, release_iterators_off_thread,
# full_batch_executions_skip_input_check: tests/multi_worker/test_fit_settings.py) run on the
# oldest pair by hand, not in CI (there release_iterators_off_thread's test passed 2 runs of
# 4: in the others no released iterator was destroyed within its 60 s wait, under a load
# average of ~5 on 2 cores; not root-caused). The 2-worker fit tests also passed by hand
# with Keras 3.10 on TensorFlow 2.17 to 2.19.
WORKAROUNDS: tuple[Patch, ...] = (
    *BUILD,  # the symbolic build's (compat._table_build), first
    Patch(
        name="multi_worker_scalar_log_reduce",
        upstream="https://github.com/keras-team/keras/issues/20585",
        min_version="3.3.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.trainer", "patch_reduce_per_replica"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.trainer", "reduce_per_replica_uses_axis_0"),
        changes_results=False,
        symptom="ValueError: Invalid reduction dimension 0 for input with 0 dimensions in model.fit under MultiWorkerMirroredStrategy",
        wraps=("tensorflow trainer module.reduce_per_replica",),
    ),
    # The tf.cond around each step of a tf.while_loop: from 3.7.0 (3.3-3.6 loop in Python
    # over single steps); still there in 3.15.
    Patch(
        name="steps_per_execution_under_distribution",
        upstream="https://github.com/keras-team/keras/issues/19246",
        min_version="3.7.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.trainer", "patch_steps_per_execution"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.trainer", "multi_step_conds_the_step"),
        changes_results=False,
        symptom="steps_per_execution > 1 under MirroredStrategy / MultiWorkerMirroredStrategy fails: You must feed a value for placeholder tensor 'while/cond/Placeholder_1'",
        wraps=("tensorflow trainer._make_function",),
    ),
    # _tf_apply takes the first replica's `finite`: in 3.0.0 already, still in 3.15. No
    # upstream issue found: the upstream field names the code.
    Patch(
        name="loss_scale_global_finiteness",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/optimizers/loss_scale_optimizer.py",
        min_version="3.0.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.loss_scale", "patch_loss_scale_finiteness"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.loss_scale", "loss_scale_takes_first_replica"),
        symptom="mixed_float16 (LossScaleOptimizer) under a strategy: the loss scale collapses or weights become NaN when another replica's gradients overflow",
        wraps=("loss scale optimizer._tf_apply", "tensorflow optimizer._all_reduce_sum_gradients"),
    ),
    # Both run-tested on Keras 3.10 and 3.15; applied from the first Keras kmp distributes
    # with (MIN_KERAS_FOR_DISTRIBUTION). `jit_compile_per_replica` wraps whatever `_make_function`
    # is in force, so it comes after `steps_per_execution_under_distribution`.
    Patch(
        name="gradient_accumulation_under_distribution",
        upstream="https://github.com/keras-team/keras/issues/20582",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.compile_settings", "patch_gradient_accumulation"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.compile_settings", "accumulation_merges_inside_cond"),
        changes_results=False,
        symptom="gradient_accumulation_steps under a strategy fails: `merge_call` called while defining a new graph or a tf.function",
        wraps=("tensorflow optimizer._backend_apply_gradients",),
    ),
    # Wraps the accumulation patch's `_backend_apply_gradients` (it handles accumulation itself).
    # Clipping: no keras-team/keras issue found; tensorflow/tensorflow#33929 is the closest
    # (tf.keras refused clipping under a strategy for this reason). It also runs the EMA
    # overwrite's cond cross-replica (no upstream issue found). Run-tested on 3.10 and 3.15.
    Patch(
        name="clip_after_all_reduce",
        upstream="https://github.com/tensorflow/tensorflow/issues/33929",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.optimizer", "patch_clip_after_all_reduce"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.optimizer", "clips_before_all_reduce"),
        symptom="clipnorm / global_clipnorm / clipvalue (or use_ema) under a strategy train other weights than one device: each replica's gradient is clipped",
        wraps=("tensorflow optimizer._backend_apply_gradients",),
        after=("gradient_accumulation_under_distribution",),
    ),
    # Sparse gradients with duplicate rows: no keras-team/keras issue found. The code is
    # keras-team/keras#18692 (3.0.0: optimizers take tf.IndexedSlices as they are, `ops.square`
    # squares each slice); keras-team/keras#19992 discusses the same code (speed). Also applied
    # on one device, to the optimizers of the models kmp.parallelize builds. Keras 3.15.
    Patch(
        name="sum_duplicate_sparse_gradient_rows",
        upstream="https://github.com/keras-team/keras/pull/18692",
        min_version="3.0.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.optimizer", "patch_sum_duplicate_slices"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.optimizer", "keeps_duplicate_slices"),
        symptom="an Embedding trained with Adam / RMSprop gives other weights than tf.keras or than the same batch split over devices (repeated token ids)",
        wraps=("tensorflow optimizer._all_reduce_sum_gradients",),
        after=("loss_scale_global_finiteness",),
    ),
    # No upstream issue found (TensorFlow's preemption notifier's SIGTERM handler, inherited by
    # Keras's forked PyDataset workers); the upstream field names the code. Keras 3.10, 3.15.
    Patch(
        name="py_dataset_pool_default_sigterm",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/data_adapters/py_dataset_adapter.py",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.data", "patch_py_dataset_pool_sigterm"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.data", "pool_initializer_keeps_sigterm"),
        changes_results=False,
        symptom="a worker with PyDataset(use_multiprocessing=True) under MultiWorkerMirroredStrategy never exits after training (hangs at exit)",
        wraps=("py_dataset adapter module.init_pool_generator",),
    ),
    # No upstream issue found: destroying a used distributed iterator blocks the training
    # thread for 0.16-5 s (up to 15 s) per fit under MultiWorkerMirroredStrategy (5-10 ms on
    # another thread); the upstream field names the code that drops it there. Keras 3.10, 3.15.
    Patch(
        name="release_iterators_off_thread",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/epoch_iterator.py",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.iterators", "patch_release_iterators_off_thread"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.iterators", "keeps_iterator_on_training_thread"),
        changes_results=False,
        symptom="each model.fit under MultiWorkerMirroredStrategy ends with a pause of seconds while the other workers wait",
        wraps=("tensorflow epoch iterator._get_iterator",),
    ),
    # No upstream issue found: TensorFlow's distributed iterators check across workers at
    # every fetch whether each still has input (one all-reduce per step), unless the dataset
    # is infinite; the upstream field names that code. Run-tested on TensorFlow 2.16 (Keras
    # 3.10) and 2.21 (Keras 3.15); `present` also checks the Keras side
    # (`TFEpochIterator._get_iterator`).
    Patch(
        name="full_batch_executions_skip_input_check",
        upstream="https://github.com/tensorflow/tensorflow/blob/v2.21.0/tensorflow/python/distribute/input_lib.py",
        min_version="2.16.0",
        max_version=_TF_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.input_check", "patch_full_batch_executions"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.input_check", "checks_input_every_step"),
        library="tensorflow",
        changes_results=False,
        symptom="multi-worker training is slower than it should be: one extra all-reduce per step to check every worker still has input",
        wraps=("tensorflow epoch iterator._get_iterator",),
        after=("release_iterators_off_thread",),
    ),
    # No upstream issue found: TensorFlow makes a new collective strategy at each
    # construction, its collective keys starting where the process's first one's did; a
    # script's own MultiWorkerMirroredStrategy() after the one kmp-launch made hung in its first
    # all-reduce in 1 run of 4 to 6 (2 workers, TensorFlow 2.21). Applied while the class
    # still constructs anew; the test: tests/multi_worker/test_launch_cli.py's tutorial script.
    Patch(
        name="one_multi_worker_strategy",
        upstream="https://github.com/tensorflow/tensorflow/blob/v2.21.0/tensorflow/python/distribute/collective_all_reduce_strategy.py",
        min_version="2.16.0",
        max_version=_TF_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.one_strategy", "patch_one_multi_worker_strategy"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.one_strategy", "constructs_anew"),
        library="tensorflow",
        changes_results=False,
        symptom="a script that makes its own tf.distribute.MultiWorkerMirroredStrategy() under kmp-launch hangs in its first all-reduce now and then",
        wraps=("collective strategy.__init__", "collective strategy.__new__"),
    ),
    # No upstream issue found: Keras's `compile` makes the loss tracker in the current scope;
    # outside the model's MultiWorkerMirroredStrategy each worker logs its own loss. Keras
    # 3.10 and 3.15.
    Patch(
        name="compile_in_model_strategy_scope",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/trainer.py",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.compile_settings", "patch_compile_in_model_scope"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.compile_settings", "compile_makes_loss_tracker_in_current_scope"),
        symptom="after compiling again outside the strategy's scope (fine-tuning), each worker logs a different loss",
        wraps=("base trainer.compile",),
    ),
    # keras-team/keras#17187 (open): the optimizers of Keras 2.11, and Keras 3's, make their
    # variables and take the strategy when constructed; tf.keras's made them at the first use, in
    # the model's strategy. Metrics made outside count one worker's rows. Keras 3.10 and 3.15.
    Patch(
        name="compile_adopts_state_made_outside",
        upstream="https://github.com/keras-team/keras/issues/17187",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.outside_scope", "patch_adopt_outside_state"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.outside_scope", "optimizer_takes_strategy_at_construction"),
        symptom="fine-tuning (compile again with keras.optimizers.X(...) made outside the strategy's scope): iterations counts every replica's step (16 for 8 on 2 GPUs), a learning-rate schedule decays N times faster, with no warning; Adam fails in fit: Mixing different tf.distribute.Strategy objects; on several workers a metric made outside logs each worker's own value",
        wraps=("base trainer.compile",),
        after=("compile_in_model_strategy_scope",),
    ),
    Patch(
        name="jit_compile_per_replica",
        upstream="https://github.com/keras-team/keras/issues/19005",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.compile_settings", "patch_jit_compile"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.compile_settings", "jit_compiles_the_distributed_step"),
        changes_results=False,
        symptom="compile(jit_compile=True) under a strategy fails: Trying to access resource ... located in device CPU:1 from device CPU:0 (UnimplementedError on several workers)",
        wraps=("tensorflow trainer._make_function", "base optimizer.apply_gradients"),
        after=("steps_per_execution_under_distribution",),
    ),
    # No keras-team/keras issue found (keras-team/keras#20609 made Keras 3 scale by 1/replicas;
    # tensorflow/tensorflow#36153 is the closest: MultiWorkerMirroredStrategy and the partial
    # last batch): a replica's loss is its own rows' mean times 1/replicas, so a global batch
    # that does not split evenly trains on the mean of the replicas' means. Wraps
    # `_make_function` after the XLA patch (which computes the weight outside XLA) and inside
    # `custom_step_logs_unscaled` (which marks what the scaling here returns); it tags the
    # iterators whatever the other `_get_iterator` patches return. Keras 3.10 and 3.15.
    Patch(
        name="uneven_batches_weighted_by_rows",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/losses/loss.py",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.row_weights", "patch_row_weighted_losses"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.row_weights", "scales_by_replicas"),
        symptom="a global batch that does not split evenly over the replicas (batch_size=31 on 2 GPUs, a partial last batch, 1 row on 2 workers) trains other weights than one device, with no warning (a data set of 1 row on 2 workers: half the gradient)",
        wraps=("tensorflow trainer._make_function", "tensorflow epoch iterator._get_iterator",
               "loss module.scale_loss_for_distribution", "loss module.unscale_loss_for_distribution"),
        after=("jit_compile_per_replica", "full_batch_executions_skip_input_check"),
    ),
    # No upstream issue found: Keras's epoch iterator makes an iterator after each epoch's
    # last batch that the next epoch replaces unread (no `steps_per_epoch`); a distributed one
    # costs 70-250 ms on 2 workers sharing 2 cores. The upstream field names that code. Keras
    # 3.10 and 3.15. Outermost of the `_get_iterator` wrappers: nothing is made or kept. Not for
    # tf.data inputs: each iterator of a reshuffling dataset draws the next order, so skipping
    # one would shift every later epoch's (tests/multi_device/test_reshuffled_input.py).
    Patch(
        name="defer_epoch_end_iterator",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/epoch_iterator.py",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.iterators", "patch_defer_epoch_end_iterator"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.iterators", "makes_unread_epoch_end_iterator"),
        changes_results=False,
        symptom="each epoch of a distributed fit ends with a pause (70-250 ms on 2 workers) making an iterator the next epoch does not use",
        wraps=("tensorflow epoch iterator._get_iterator",),
        after=("release_iterators_off_thread", "full_batch_executions_skip_input_check",
               "uneven_batches_weighted_by_rows"),
    ),
    # No upstream issue found: Keras scales a Loss's value by 1/replicas in the replica context
    # and only its own train_step unscales what it logs; a custom step's logged losses are
    # divided by the replicas. Wraps `_make_function` last (the step function each of the
    # patches above runs). Checked on Keras 3.15.
    Patch(
        name="custom_step_logs_unscaled",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/losses/loss.py",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.custom_step", "patch_scaled_loss_logs"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.custom_step", "losses_scaled_for_distribution"),
        symptom="a custom train_step / test_step logs its loss divided by the number of replicas (halved on 2 GPUs)",
        wraps=("tensorflow trainer._make_function", "loss module.scale_loss_for_distribution", "loss module.unscale_loss_for_distribution", "reduction metrics module.Mean.update_state"),
        after=("uneven_batches_weighted_by_rows",),
    ),
    # A TensorFlow bug (found by this package's fit-settings tests; no upstream issue found,
    # tensorflow/tensorflow#59729 is the closest: a CPU tensor made from a NumPy array shares
    # its memory). Run-tested on TensorFlow 2.16 and 2.21 (fails without it on both); applied
    # from the oldest TensorFlow this package supports while `FuncRegistry` still hands the
    # caller's arrays over.
    Patch(
        name="numpy_function_owned_outputs",
        upstream="https://github.com/tensorflow/tensorflow/issues/59729",
        min_version="2.16.0",
        max_version=_TF_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.data", "patch_numpy_function_owned_outputs"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.data", "numpy_function_aliases_outputs"),
        library="tensorflow",
        symptom="fit(generator) or fit(PyDataset) on several devices trains on overwritten batches: other weights than one device",
        wraps=("numpy_function registry.__call__",),
    ),
    # No upstream issue found: Keras's Variable.assign_add / assign_sub are
    # `self.assign(self + value)`, a read then a write. Under parameter servers, workers that
    # update one variable at once overwrite each other's updates (measured on Keras 3.15 +
    # TensorFlow 2.21: 1248 of 2000 steps counted by optimizer.iterations, 2 workers). kmp
    # applies it with a parameter-server strategy (and patch_keras applies it with the rest:
    # the same values, one atomic operation).
    Patch(
        name="atomic_variable_updates",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/backend/common/variables.py",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.parameter_server", "patch_atomic_updates"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.parameter_server", "updates_read_then_write"),
        symptom="parameter servers: optimizer.iterations and the metrics count fewer steps than ran (1248 of 2000 on 2 workers): two workers' assign_add overwrite each other; a learning-rate schedule and Adam's bias correction see a wrong step",
        wraps=("tensorflow variable.assign_add", "tensorflow variable.assign_sub"),
    ),
)
