"""strategy="model_parallel" on 4 simulated devices (a subprocess: conftest.py's process has 2).

One launched script checks several things, to keep the suite lean: the Keras 2 era recipe
(a shared LSTM called under two tf.device scopes, a concatenate on cpu:0) unchanged inside
the decorated factory, on 3 devices; and 8 equal layers balanced 2 per device on 4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = textwrap.dedent(
    """
    import json
    import keras_mgpu_plugins as kmp
    kmp.simulate_devices(4)
    import keras, numpy as np, tensorflow as tf
    from keras_mgpu_plugins.backends.tensorflow.model_parallel.pipeline import TRACED

    out = {}

    @kmp.parallelize(strategy="model_parallel", devices=["/cpu:1", "/cpu:2", "/cpu:0"])
    def recipe():
        tweet_a = keras.Input(shape=(5, 8))
        tweet_b = keras.Input(shape=(5, 8))
        # the recipe, unchanged but for device names this machine has
        shared_lstm = keras.layers.LSTM(16)
        with tf.device('/cpu:1'):
            encoded_a = shared_lstm(tweet_a)
        with tf.device('/cpu:2'):
            encoded_b = shared_lstm(tweet_b)
        with tf.device('/cpu:0'):
            merged_vector = keras.layers.concatenate([encoded_a, encoded_b], axis=-1)
        predictions = keras.layers.Dense(1, activation='sigmoid')(merged_vector)
        model = keras.Model(inputs=[tweet_a, tweet_b], outputs=predictions)
        model.compile(optimizer='rmsprop', loss='binary_crossentropy')
        return model

    model = recipe()
    rng = np.random.default_rng(0)
    x = [rng.normal(size=(16, 5, 8)).astype("float32") for _ in range(2)]
    y = (rng.random((16, 1)) > 0.5).astype("float32")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    graph = TRACED[model]
    out["recipe_ops"] = sorted({(op.name, op.device.split("device:")[-1])
                                for op in graph.get_operations()
                                if op.type in ("While", "ConcatV2", "StatelessWhile")})
    out["recipe_vars"] = {v.path: v.value.device.split("device:")[-1] for v in model.weights}
    out["recipe_slots"] = {v.path: v.value.device.split("device:")[-1]
                           for v in model.optimizer.variables if len(v.shape)}
    out["recipe_report"] = {r.device: list(r.layers)
                            for r in kmp.placement_report(model).rows}

    @kmp.parallelize(strategy="model_parallel")
    def eight():
        inp = keras.Input((16,))
        h = inp
        for i in range(8):
            h = keras.layers.Dense(16, name=f"layer_{i}")(h)
        model = keras.Model(inp, h)
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = eight()
    model.fit(rng.normal(size=(8, 16)), rng.normal(size=(8, 16)), batch_size=4, verbose=0)
    out["eight_report"] = {r.device: list(r.layers) for r in kmp.placement_report(model).rows}
    out["eight_vars"] = {v.path: v.value.device.split("device:")[-1] for v in model.weights}
    print("RESULT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def result():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_recipe_runs_each_call_on_its_scope_in_the_traced_train_step(result):
    ops = dict(map(tuple, result["recipe_ops"]))
    whiles = sorted(device for name, device in ops.items() if "while" in name
                    and "gradients" not in name)
    assert whiles == ["CPU:1", "CPU:2"]  # the shared LSTM's loop, once per call and device
    grad_whiles = sorted(device for name, device in ops.items() if "while" in name
                         and "gradients" in name)
    assert grad_whiles == ["CPU:1", "CPU:2"]  # and its backward loop beside it
    concat = [device for name, device in ops.items() if "concatenate" in name
              and "gradients" not in name]
    assert concat == ["CPU:0"]
    lstm = {p: d for p, d in result["recipe_vars"].items() if p.startswith("lstm")}
    assert set(lstm.values()) == {"CPU:1"} and len(lstm) == 3  # built at its first call
    assert result["recipe_vars"]["dense/kernel"] == "CPU:0"  # auto: after the concat
    assert {d for p, d in result["recipe_slots"].items() if "lstm" in p} == {"CPU:1"}
    assert result["recipe_report"] == {
        "/device:CPU:1": ["lstm"], "/device:CPU:2": ["lstm#2"],
        "/device:CPU:0": ["concatenate", "dense"]}


def test_eight_equal_layers_two_per_device_in_order(result):
    assert result["eight_report"] == {
        f"/device:CPU:{k}": [f"layer_{2 * k}", f"layer_{2 * k + 1}"] for k in range(4)}
    for i in range(8):
        assert result["eight_vars"][f"layer_{i}/kernel"] == f"CPU:{i // 2}"
