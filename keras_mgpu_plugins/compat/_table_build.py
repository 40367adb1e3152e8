"""The workarounds of the TensorFlow trainer's symbolic build under a strategy: `BUILD`.

Keras builds a model under a `tf.distribute` strategy before the first step, from a batch it
draws (`_maybe_symbolic_build`, first in Keras 3.5.0). The three records here change that
build in turn, each wrapping the ones before it; `compat._table.WORKAROUNDS` starts with them.
"""

from __future__ import annotations

from keras_mgpu_plugins.compat._checks import CHECKED_BELOW
from keras_mgpu_plugins.compat._record import Patch, lazy

_KERAS_MAX = CHECKED_BELOW["keras"]

BUILD: tuple[Patch, ...] = (
    Patch(
        name="symbolic_build_per_replica_batch",
        upstream="https://github.com/keras-team/keras/issues/20585",
        min_version="3.5.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.trainer", "patch_symbolic_build"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.trainer", "symbolic_build_reduces_batch"),
        changes_results=False,
        symptom="model.fit / evaluate / predict under MultiWorkerMirroredStrategy fail before the first step with an error naming PerReplica",
        wraps=("tensorflow trainer._maybe_symbolic_build",),
    ),
    # Wraps the patch above. No upstream issue found (keras-team/keras searched for the
    # symbolic build drawing a batch, or changing a reshuffling dataset's order): the upstream
    # field names the code. Read in the sources of Keras 3.10.0 and 3.15.1 (the same draw,
    # `next(it)`, and `_symbolic_build` reading only each leaf's shape and dtype); run-tested
    # on Keras 3.15.1 + TensorFlow 2.21.
    Patch(
        name="symbolic_build_from_element_spec",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/backend/tensorflow/trainer.py",
        min_version="3.10.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.element_spec", "patch_build_from_element_spec"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.element_spec", "symbolic_build_draws_a_batch"),
        symptom="a tf.data input shuffled with reshuffle_each_iteration=True (the default) trains on another order under a strategy than on one device: every epoch sees the order one device sees an epoch later (fit, evaluate)",
        wraps=("tensorflow trainer._maybe_symbolic_build",),
        after=("symbolic_build_per_replica_batch",),
    ),
    # Wraps the patches above. keras-team/keras#21800 (open): the distributed symbolic build calls
    # the model, which a custom test_step does not need; a Model subclass without call() (the
    # knowledge-distillation example) fails the same way. Checked on Keras 3.15.
    Patch(
        name="symbolic_build_without_call",
        upstream="https://github.com/keras-team/keras/issues/21800",
        min_version="3.5.0",
        max_version=_KERAS_MAX,
        apply=lazy("keras_mgpu_plugins.backends.tensorflow.patches.custom_step", "patch_build_without_call"),
        present=lazy("keras_mgpu_plugins.backends.tensorflow.patches.custom_step", "symbolic_build_calls_the_model"),
        changes_results=False,
        symptom="fit under a strategy fails with 'Unable to automatically build the model' for a Model subclass without call() (a custom train_step/test_step, keras.io's Distiller)",
        wraps=("tensorflow trainer._maybe_symbolic_build",),
        after=("symbolic_build_per_replica_batch", "symbolic_build_from_element_spec"),
    ),
)
