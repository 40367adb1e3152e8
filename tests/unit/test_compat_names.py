"""The private-name registry (`compat._names`) and what kmp does where a name is missing.

Each private name is looked for where the installed version keeps it, then at its other
known places (a nightly from before or after a rename), and a namesake without the name's
attributes is not taken. Where a name is at none of its places, setting up a strategy
raises `UncheckedVersionError` naming it, the version and the places tried, before any
training (never an `AttributeError` from inside kmp); with `KMP_ALLOW_UNCHECKED_VERSIONS=1`
the patches that wrap it are skipped with one warning. A check that raises cannot tell:
a results-changing patch then fails closed, a private use reports what it raised.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins import compat
from keras_mgpu_plugins.compat import _names, _private_uses
from keras_mgpu_plugins.compat import _registry as _compat_patches

TRAINER = _names.BY_KEY["tensorflow trainer"]
MODULE = "keras.src.backend.tensorflow.trainer"
#: The workarounds that wrap a method of the TensorFlow trainer class.
ON_THE_TRAINER = {"symbolic_build_per_replica_batch", "symbolic_build_from_element_spec",
                  "symbolic_build_without_call",
                  "steps_per_execution_under_distribution", "jit_compile_per_replica",
                  "uneven_batches_weighted_by_rows", "custom_step_logs_unscaled"}


@pytest.fixture
def unpatched(monkeypatch):
    """No patch applied and no patch warning given; the suite's state is restored after."""
    compat.unpatch_keras()
    monkeypatch.setattr(_compat_patches, "_warned_patches", set())
    yield
    compat.unpatch_keras()
    monkeypatch.undo()
    compat.patch_keras()


@pytest.fixture
def no_trainer(monkeypatch):
    """A Keras whose TensorFlow trainer class is at none of its known places."""
    module = _names.resolve("tensorflow trainer module")
    for attribute in ("TensorFlowTrainer", "Trainer"):
        monkeypatch.delattr(module, attribute, raising=False)
    monkeypatch.setattr(keras, "__version__", "3.17.0")


def test_a_name_is_looked_for_first_where_its_version_keeps_it():
    assert TRAINER.expected_path("3.4.0") == f"{MODULE}.TensorFlowTrainer"
    assert TRAINER.expected_path("3.15.1") == f"{MODULE}.TensorFlowTrainer"
    assert TRAINER.expected_path("3.16.0.dev2026102704") == f"{MODULE}.Trainer"  # as 3.16.0
    assert TRAINER.expected_path("3.16.0") == f"{MODULE}.Trainer"
    assert TRAINER.candidates("3.15.1") == [f"{MODULE}.TensorFlowTrainer", f"{MODULE}.Trainer"]
    assert TRAINER.candidates("3.16.0rc0") == [f"{MODULE}.Trainer", f"{MODULE}.TensorFlowTrainer"]
    variable = _names.BY_KEY["tensorflow variable"]
    assert variable.expected_path("3.16.0.dev2026102704") == (
        "keras.src.backend.tensorflow.ops.core.Variable")


@pytest.mark.parametrize("pretend", ["3.10.0", "3.15.1", "3.16.0.dev2026102704", "3.17.0"])
def test_the_renamed_trainer_is_found_whichever_version_is_installed(monkeypatch, pretend):
    """A nightly from before the rename has 3.16.0.dev's version and the old names (and a
    release may keep an old name): each known place is tried, and the same class is found."""
    real = _names.resolve("tensorflow trainer")
    base = _names.resolve("base trainer")
    monkeypatch.setattr(keras, "__version__", pretend)
    assert _names.resolve("tensorflow trainer") is real
    assert _names.resolve("base trainer") is base
    assert issubclass(keras.Model, real) and issubclass(real, base) and real is not base
    assert real.__name__ in ("TensorFlowTrainer", "Trainer")
    assert base.__name__ in ("Trainer", "BaseTrainer")


def test_a_namesake_without_the_names_attributes_is_not_taken(monkeypatch):
    """Were a class without `_make_function` called `Trainer` in the module (the base class,
    imported under that name), it would not be taken for the TensorFlow trainer."""
    module = _names.resolve("tensorflow trainer module")
    real = _names.resolve("tensorflow trainer")
    monkeypatch.setattr(module, "Trainer", type("Trainer", (), {}), raising=False)
    monkeypatch.setattr(module, "TensorFlowTrainer", real, raising=False)
    monkeypatch.setattr(keras, "__version__", "3.16.0.dev2026102704")
    assert _names.path_of("tensorflow trainer") == f"{MODULE}.TensorFlowTrainer"
    assert _names.resolve("tensorflow trainer") is real


def test_a_name_at_no_known_place_is_named_with_the_version_and_the_places(no_trainer):
    with pytest.raises(compat.UncheckedVersionError) as raised:
        _names.resolve("tensorflow trainer")
    message = str(raised.value)
    assert isinstance(raised.value, compat.MissingNameError)
    assert "Keras 3.17.0 does not have: 'tensorflow trainer'" in message
    assert f"{MODULE}.TensorFlowTrainer (Keras 3.0.0+)" in message
    assert f"{MODULE}.Trainer (Keras 3.16.0+)" in message
    assert _names.path_of("tensorflow trainer") is None
    owner, attribute = _names.locate("tensorflow trainer module.reduce_per_replica")
    assert attribute == "reduce_per_replica" and callable(getattr(owner, attribute))
    assert _names.missing("tensorflow trainer._make_function", "tree") == [message]


def tiny_factory(built):
    def build():
        built.append(1)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    return build


def test_parallelize_refuses_a_missing_name_by_name_before_any_training(monkeypatch, unpatched,
                                                                       no_trainer):
    """Without the switch: UncheckedVersionError naming the name, nothing half-applied. The
    version is a checked one (an install whose Keras lacks a name of its own version): an
    unchecked version is refused before any name is looked for (`compat._policy`)."""
    monkeypatch.delenv(compat.ALLOW_UNCHECKED_ENV, raising=False)
    monkeypatch.setattr(keras, "__version__", "3.15.1")
    built = []
    with pytest.raises(compat.UncheckedVersionError) as raised:
        kmp.parallelize(strategy="mirrored")(tiny_factory(built))()
    message = str(raised.value)
    for name in ON_THE_TRAINER:
        assert f"  - {name} (" in message
    assert "'tensorflow trainer'" in message and "Keras 3.15.1" in message
    assert _compat_patches._applied == {}


def test_with_the_switch_the_patches_on_a_missing_name_are_skipped_with_one_warning(
        monkeypatch, unpatched, no_trainer):
    monkeypatch.setenv(compat.ALLOW_UNCHECKED_ENV, "1")
    monkeypatch.setattr(keras, "__version__", "3.15.1")  # checked: the names' warning alone
    with pytest.warns(UserWarning, match="'tensorflow trainer'") as caught:
        applied = compat.patch_keras()
    assert len([w for w in caught if "kmp.compat" in str(w.message)]) == 1
    workarounds = {p.name for p in compat.PATCHES if p.kind == "workaround"}
    assert set(applied) == workarounds - ON_THE_TRAINER
    x = np.ones((8, 3), "float32")
    model = kmp.parallelize(strategy="mirrored")(tiny_factory([]))()
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0)  # Keras's own code runs


def test_a_check_that_raises_cannot_tell_and_fails_closed(monkeypatch, unpatched):
    def broken():
        raise AttributeError("module 'keras.src.x' has no attribute 'Y'")

    patches = tuple(dataclasses.replace(p, present=broken) for p in compat.PATCHES
                    if p.kind == "workaround" and p.library == "keras")
    monkeypatch.setattr(_compat_patches, "PATCHES", patches)
    monkeypatch.delenv(compat.ALLOW_UNCHECKED_ENV, raising=False)
    with pytest.raises(compat.UncheckedVersionError) as raised:
        compat.patch_keras()
    message = str(raised.value)
    for patch in patches:  # in the checked range too: a check that raises cannot tell
        assert (f"  - {patch.name} (" in message) is patch.changes_results, patch.name
    assert "its check raised AttributeError: module 'keras.src.x' has no attribute 'Y'" in message
    assert _compat_patches._applied == {}
    monkeypatch.setenv(compat.ALLOW_UNCHECKED_ENV, "1")
    with pytest.warns(UserWarning, match="its check raised AttributeError"):
        assert compat.patch_keras() == []  # cannot tell: nothing is applied


def test_a_private_use_whose_check_raises_is_a_problem_not_an_error(monkeypatch):
    use = _private_uses._BY_NAME["flatten_layers"]
    broken = dataclasses.replace(use, check=lambda: 1 / 0)
    monkeypatch.setitem(_private_uses._BY_NAME, use.name, broken)
    monkeypatch.setattr(_private_uses, "PRIVATE_USES", tuple(
        broken if u.name == use.name else u for u in _private_uses.PRIVATE_USES))
    monkeypatch.setattr(_private_uses, "_checked", {})
    found = compat.check_private_uses()
    assert found["flatten_layers"] == ["its check raised ZeroDivisionError: division by zero"]
    assert found["model_checkpoint_hooks"] == []
    with pytest.raises(compat.UncheckedVersionError, match="its check raised ZeroDivisionError"):
        compat.require("flatten_layers")
