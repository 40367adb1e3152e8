"""What a `fit` does besides training, under a distributing strategy (2 simulated devices).

Mechanism tests, no timings (`benchmarks/workers_throughput.py` measures the cost).
"""

from __future__ import annotations

import pytest

from keras_mgpu_plugins import compat
from tests import fit_settings_scenarios as s

pytestmark = pytest.mark.timeout(300)


def iterators_per_fit(monkeypatch, fits=2, epochs=1, validation=False):
    """The distributed iterators each of `fits` calls of `fit` creates."""
    from tensorflow.python.distribute import input_lib

    import keras_mgpu_plugins as kmp

    made = []
    original = input_lib.DistributedDataset.__iter__

    def counting_iter(self):
        made.append(1)
        return original(self)

    monkeypatch.setattr(input_lib.DistributedDataset, "__iter__", counting_iter)
    x, y = s.make_data()
    model = kmp.parallelize(strategy="mirrored")(s.model_factory())()
    counts = []
    for _ in range(fits):
        made.clear()
        model.fit(x, y, batch_size=s.BATCH, epochs=epochs, shuffle=False, verbose=0,
                  validation_data=(x, y) if validation else None)
        counts.append(len(made))
    return counts


def test_no_fit_draws_a_batch_for_the_build(monkeypatch):
    """The first fit builds the model from its input's element spec
    (`symbolic_build_from_element_spec`), later fits build nothing: neither makes an
    iterator of its own (under MultiWorkerMirroredStrategy each costs tf.functions traced
    for its devices and a prefetch thread): one each, the epoch's."""
    assert iterators_per_fit(monkeypatch) == [1, 1]


def test_upstream_draws_a_batch_on_every_fit(monkeypatch):
    """Without kmp's `_maybe_symbolic_build` every fit makes the build's iterator (Keras as
    released): the patch's saving is real. Fails once upstream skips it for a built model."""
    from keras_mgpu_plugins.compat import _registry as _compat_patches
    from keras_mgpu_plugins.compat._names import resolve

    assert "symbolic_build_per_replica_batch" in compat.patch_keras()
    undo = _compat_patches._applied["symbolic_build_per_replica_batch"]  # and the ones around it
    trainer = resolve("tensorflow trainer")  # TensorFlowTrainer; Trainer in keras-nightly
    patched = trainer._maybe_symbolic_build
    undo()
    try:
        first, second = iterators_per_fit(monkeypatch)
    finally:
        trainer._maybe_symbolic_build = patched
    assert second == first



def test_each_epoch_makes_one_iterator_for_its_data(monkeypatch):
    """Keras makes an iterator at each epoch's start, and one after its last batch that the
    next epoch replaces unread; kmp does not make that one (`defer_epoch_end_iterator`): a
    built model's 3-epoch fit makes 3 iterators of its data, and 3 of its validation data."""
    assert iterators_per_fit(monkeypatch, epochs=3)[1] == 3
    assert iterators_per_fit(monkeypatch, epochs=3, validation=True)[1] == 6


def test_upstream_makes_an_unread_iterator_at_each_epoch_end(monkeypatch):
    """Without the patch (Keras as released): twice as many. Fails once upstream stops."""
    from keras_mgpu_plugins.compat import _registry as _compat_patches
    from keras_mgpu_plugins.compat._names import resolve

    assert "defer_epoch_end_iterator" in compat.patch_keras()
    iterator_class = resolve("tensorflow epoch iterator")
    patched = iterator_class._get_iterator
    _compat_patches._applied["defer_epoch_end_iterator"]()
    try:
        assert iterators_per_fit(monkeypatch, epochs=3)[1] == 6
    finally:
        iterator_class._get_iterator = patched
