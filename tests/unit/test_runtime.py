"""`kmp.runtime`: the one object callbacks ask; one process is the identity."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from keras_mgpu_plugins import runtime

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "keras_mgpu_plugins"


def test_one_process_answers_every_collective_locally():
    alone = runtime.SingleProcess()
    assert alone.rank() == runtime.Rank(0, 1, True)
    assert (alone.is_chief, alone.worker_index, alone.num_workers) == (True, 0, 1)
    assert not alone.spans_workers
    assert alone.all_gather(np.array([1.5, 2.0])).tolist() == [[1.5, 2.0]]
    assert alone.all_gather(np.array([True])).dtype == np.bool_
    assert alone.agree(False) is False and alone.agree(True, how="all") is True
    assert alone.broadcast(np.array([3])).tolist() == [3]
    alone.barrier()
    assert alone.together(lambda: "done", "a step") == "done"
    with pytest.raises(KeyError):
        alone.together(lambda: {}["only here"], "a step")
    assert alone.gather_errors(None) is None
    assert alone.gather_errors(KeyError("x")) == "KeyError: 'x'"
    assert alone.same_settings({"patience": object()}, "Stopper") is None  # nothing to compare
    assert alone.replicas_in_sync == 1 and alone.across_workers() is alone
    with alone.scope():
        pass


def test_how_must_be_a_known_rule():
    with pytest.raises(ValueError, match=r'how must be "any", "all" or "chief". Received: how=\'most\''):
        runtime.SingleProcess().agree(True, how="most")


def test_errors_travel_as_fixed_width_vectors():
    vector = runtime.encode_error(ValueError("é" * 300))
    assert vector.shape == (runtime.ERROR_WIDTH,)
    assert runtime.decode_error(vector).startswith("ValueError: é")
    assert runtime.decode_error(runtime.encode_error(None)) is None


def test_the_tensorflow_backend_gives_the_models_strategy():
    import keras

    from keras_mgpu_plugins.backends.tensorflow.runtime import TensorFlowRuntime

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    here = runtime.of(model)
    assert isinstance(here, TensorFlowRuntime) and here.strategy is model.distribute_strategy
    assert not here.spans_workers and here.is_chief
    assert here.describe()["strategy"] == "default"


def _names_used(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


@pytest.mark.parametrize("folder", ["callbacks", "integrations", "runtime"])
def test_callbacks_never_hold_a_backends_strategy(folder):
    """They ask `runtime.of(model)`; `model.distribute_strategy` exists on TensorFlow only."""
    for path in sorted((PACKAGE / folder).glob("*.py")):
        used = _names_used(path)
        assert "distribute_strategy" not in used, path.name
        assert "keras_mgpu_plugins.collective" not in used and "collective" not in {
            n.rsplit(".", 1)[-1] for n in used if n.startswith("keras_mgpu_plugins")}, path.name


def test_the_runtime_imports_no_backend():
    for path in sorted((PACKAGE / "runtime").glob("*.py")):
        used = _names_used(path)
        assert not {"tensorflow", "jax", "torch"} & used, path.name

