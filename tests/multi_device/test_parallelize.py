"""@parallelize in one process, over the 2 logical CPU devices of tests/conftest.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.backends.tensorflow.strategy import StrategyError


def tiny_model(seed=1, compile=True):
    init = keras.initializers.GlorotUniform(seed=seed)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh", kernel_initializer=init),
            keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed + 1)),
        ]
    )
    if compile:
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def data(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, (x @ rng.normal(size=(6, 1))).astype("float32")


def test_bare_decorator_keeps_name_doc_and_arguments():
    @kmp.parallelize
    def build_model(seed, compile=True):
        """Builds the tiny model."""
        return tiny_model(seed, compile)

    model = build_model(3)
    assert build_model.__name__ == "build_model"
    assert build_model.__doc__ == "Builds the tiny model."
    # auto + 2 logical devices → mirrored over both
    assert isinstance(model.distribute_strategy, tf.distribute.MirroredStrategy)
    assert model.distribute_strategy.num_replicas_in_sync == 2


@pytest.mark.parametrize(
    "decorate",
    [
        lambda f: kmp.parallelize()(f),
        lambda f: kmp.parallelize(strategy="mirrored")(f),
        lambda f: kmp.parallelize(strategy="mirrored", devices=["/cpu:0", "/cpu:1"])(f),
    ],
)
def test_forms_build_mirrored_variables(decorate):
    model = decorate(tiny_model)()
    kernel = model.layers[0].kernel.value
    assert len(model.distribute_strategy.experimental_local_results(kernel)) == 2
    assert model.optimizer is not None and model.compiled


def test_default_strategy_and_instance():
    model = kmp.parallelize(strategy="default")(tiny_model)()
    assert model.distribute_strategy.num_replicas_in_sync == 1
    mine = tf.distribute.OneDeviceStrategy("/cpu:0")
    model = kmp.parallelize(strategy=mine)(tiny_model)()
    assert model.distribute_strategy is mine


def test_two_factories_share_one_strategy():
    a = kmp.parallelize(strategy="mirrored")(tiny_model)
    b = kmp.parallelize(strategy="mirrored")(lambda: tiny_model(5))
    assert a().distribute_strategy is b().distribute_strategy
    assert a.strategy() is b.strategy()


def test_unknown_strategy_name_fails_at_decoration():
    with pytest.raises(ValueError) as info:
        kmp.parallelize(strategy="mirror")
    assert str(info.value) == (
        "strategy must be one of ['auto', 'mirrored', 'multi_worker', 'default', "
        "'parameter_server', 'model_parallel', 'hybrid'] or a tf.distribute.Strategy instance. "
        "Received: strategy='mirror'")
    with pytest.raises(TypeError, match="Did you mean parallelize"):
        kmp.parallelize("mirrored")


def test_devices_only_with_mirrored():
    with pytest.raises(ValueError, match="devices only applies"):
        kmp.parallelize(strategy="default", devices=["/cpu:0"])
    mine = tf.distribute.OneDeviceStrategy("/cpu:0")
    with pytest.raises(ValueError, match=r"OneDeviceStrategy instance already has its devices. "
                                         r"Received: devices=\['/cpu:1'\]"):
        kmp.parallelize(strategy=mine, devices=["/cpu:1"])


def test_a_strategy_class_or_other_object_fails_at_decoration():
    with pytest.raises(ValueError, match=r"Received: strategy=<class .*MirroredStrategy'> of type "
                                         r"type\. Did you mean MirroredStrategy\(\)"):
        kmp.parallelize(strategy=tf.distribute.MirroredStrategy)
    with pytest.raises(ValueError, match=r"one of \['auto', 'mirrored', 'multi_worker', "
                                         r"'default', 'parameter_server', 'model_parallel', "
                                         r"'hybrid'\] .* "
                                         r"Received: strategy=2 of type int"):
        kmp.parallelize(strategy=2)


def test_factory_must_return_a_model():
    @kmp.parallelize
    def not_a_model():
        return {"model": 1}

    with pytest.raises(TypeError, match="must return a keras.Model.*dict"):
        not_a_model()


def test_uncompiled_model_is_an_error_unless_allowed():
    with pytest.raises(ValueError, match="uncompiled model"):
        kmp.parallelize(tiny_model)(compile=False)
    model = kmp.parallelize(require_compiled=False)(tiny_model)(compile=False)
    assert not model.compiled


def test_mirrored_fit_matches_one_device_fit():
    """Numerical truth: 2 replicas on the same global batches = one device."""
    x, y = data()
    single = tiny_model()
    single.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    parallel = kmp.parallelize(strategy="mirrored")(tiny_model)()
    history = parallel.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    for a, b in zip(single.get_weights(), parallel.get_weights(), strict=True):
        assert np.max(np.abs(a - b)) < 1e-5
    # every replica holds the same value, to the bit
    for var in parallel.trainable_variables:
        copies = parallel.distribute_strategy.experimental_local_results(var.value)
        assert all(np.array_equal(copies[0].numpy(), c.numpy()) for c in copies[1:])
    assert len(history.history["loss"]) == 3


@pytest.mark.parametrize("version, says", [
    ("3.7.0", "sums gradients across replicas: N replicas train with N times the learning rate"),
    ("3.9.0", "logs metrics across workers that differ from one process's"),
])
def test_keras_that_trains_or_logs_wrongly_when_distributed_is_refused(monkeypatch, version, says):
    import keras

    mirrored = kmp.strategy.get_strategy("mirrored")  # the process's (a second one would collide)
    monkeypatch.setattr(keras, "__version__", version)
    expected = rf"Keras {version} {says}.*pip install \"keras>=3\.10,<3\.16\""
    with pytest.raises(RuntimeError, match=expected):
        kmp.parallelize(strategy="mirrored")(tiny_model)()
    with pytest.raises(RuntimeError, match=expected):
        kmp.parallelize(strategy=mirrored)(tiny_model)()
    assert kmp.parallelize(strategy="default")(tiny_model)().distribute_strategy is not None
    monkeypatch.setattr(keras, "__version__", "3.10.0")
    assert kmp.parallelize(strategy="mirrored")(tiny_model)().distribute_strategy.num_replicas_in_sync == 2


def test_an_unchecked_keras_is_refused_before_the_first_distributed_fit(monkeypatch):
    """An unchecked Keras (a pre-release here) is refused where kmp distributes, by the
    version policy of every lane (`compat._policy`, `tests/lanes/test_versions.py`); with
    the switch set it trains, after one warning."""
    import warnings

    import keras

    from keras_mgpu_plugins.compat import _policy
    from keras_mgpu_plugins.compat import _registry as _compat_patches

    kmp.compat.unpatch_keras()
    monkeypatch.setattr(_compat_patches, "_warned_patches", set())
    monkeypatch.setattr(_policy, "_announced", [])
    monkeypatch.setattr(keras, "__version__", "3.16.0rc0")
    monkeypatch.delenv(kmp.compat.ALLOW_UNCHECKED_ENV, raising=False)
    try:
        with pytest.raises(kmp.compat.UncheckedVersionError,
                           match=r"not checked with Keras 3\.16\.0rc0 on the TensorFlow lane.*"
                                 r"KMP_ALLOW_UNCHECKED_VERSIONS=1"):
            kmp.parallelize(strategy="mirrored")(tiny_model)()
        monkeypatch.setenv(kmp.compat.ALLOW_UNCHECKED_ENV, "1")
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            model = kmp.parallelize(strategy="mirrored")(tiny_model)()
        assert len(said) == 1 and str(said[0].message).startswith(
            "keras_mgpu_plugins was not checked with Keras 3.16.0rc0 (a pre-release"), [
            str(w.message) for w in said]
        assert model.distribute_strategy.num_replicas_in_sync == 2
    finally:
        monkeypatch.undo()
        kmp.compat.unpatch_keras()
        kmp.compat.patch_keras()


def test_simulate_devices_validates_and_is_idempotent():
    with pytest.raises(ValueError, match="Received: n=0"):
        kmp.simulate_devices(0)
    tf.constant(1.0)  # the runtime runs (conftest split the CPU in 2 before it started)
    assert kmp.simulate_devices(2) == ["/device:CPU:0", "/device:CPU:1"]
    assert [d.name for d in tf.config.list_logical_devices("CPU")] == kmp.simulate_devices(2)
    with pytest.raises(kmp.devices.RuntimeAlreadyStartedError, match="before TensorFlow starts"):
        kmp.simulate_devices(3)


def test_simulate_devices_leaves_the_runtime_unstarted():
    """What must precede the runtime (a multi-worker strategy) may still follow it."""
    result = run_python(
        """
        import tensorflow as tf
        import keras_mgpu_plugins as kmp
        assert kmp.simulate_devices(2) == ["/device:CPU:0", "/device:CPU:1"]
        assert kmp.simulate_devices(3) == ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]
        assert kmp.topology().local_devices == ("CPU:0", "CPU:1", "CPU:2")
        print([d.name for d in tf.config.list_logical_devices("CPU")])
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == str(
        ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"])


def run_python(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120, env=env,
    )


@pytest.mark.slow
def test_multi_worker_strategy_too_late_says_what_to_move():
    import json

    tf_config = {"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 0}}
    result = run_python(
        """
        import tensorflow as tf
        tf.constant(1.0) + 1.0   # the runtime starts here
        import keras_mgpu_plugins as kmp
        kmp.parallelize(strategy="multi_worker")
        """,
        {"TF_CONFIG": json.dumps(tf_config)},
    )
    assert result.returncode != 0
    assert "StrategyError" in result.stderr
    assert "before TensorFlow runs its first operation" in result.stderr


@pytest.mark.slow
def test_port_in_use_is_named():
    import json
    import socket

    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        tf_config = {
            "cluster": {"worker": [f"localhost:{port}", "localhost:1"]},
            "task": {"type": "worker", "index": 0},
        }
        result = run_python(
            "import keras_mgpu_plugins as kmp\nkmp.parallelize(strategy='multi_worker')\n",
            {"TF_CONFIG": json.dumps(tf_config)},
        )
    assert result.returncode != 0
    assert f"Port {port} of this worker" in result.stderr
    assert "already in use" in result.stderr


def test_strategy_error_is_public():
    assert issubclass(StrategyError, RuntimeError)


def test_one_mirrored_strategy_per_device_set_whatever_the_spelling():
    """Two MirroredStrategy objects over the same devices collide in TF's collectives."""
    from keras_mgpu_plugins.backends.tensorflow.strategy import get_strategy

    a = get_strategy("mirrored")
    b = get_strategy("mirrored", ["/cpu:0", "/cpu:1"])
    c = get_strategy("mirrored", ["/device:CPU:0", "/device:CPU:1"])
    assert a is b is c
    assert get_strategy("mirrored", ["/cpu:1", "/cpu:0"]) is not a  # order is replica order
