"""Whether a fit's per-step logs are read (`methods._step_logs_read`): where nothing reads
them, kmp's training step runs no collective of its own and only the epoch's logs are
reduced (the 2-process tests with `verbose=0` check those against one device)."""

from __future__ import annotations

import keras

from keras_mgpu_plugins.backends.torch.methods import _step_logs_read


class EpochOnly(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        pass


class PerBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


class OwnStep(keras.Sequential):
    def train_step(self, data):
        return super().train_step(data)


def test_nothing_reads_them_without_a_progress_bar_batch_hook_or_own_step():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert not _step_logs_read(model, {"verbose": 0, "callbacks": None})
    assert not _step_logs_read(model, {"verbose": 0, "callbacks": [EpochOnly(),
                                                                   keras.callbacks.History()]})


def test_a_progress_bar_a_batch_hook_or_a_train_step_of_ones_own_reads_them():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert _step_logs_read(model, {"verbose": 1, "callbacks": []})
    assert _step_logs_read(model, {"verbose": "auto", "callbacks": []})
    assert _step_logs_read(model, {"verbose": 0, "callbacks": [EpochOnly(), PerBatch()]})
    assert _step_logs_read(model, {"verbose": 0, "callbacks": keras.callbacks.CallbackList(
        [PerBatch()])})
    assert not _step_logs_read(model, {"verbose": 0, "callbacks": keras.callbacks.CallbackList(
        [EpochOnly()])})
    own = OwnStep([keras.Input((2,)), keras.layers.Dense(1)])
    assert _step_logs_read(own, {"verbose": 0, "callbacks": []})
