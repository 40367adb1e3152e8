"""WandbLogger (offline, real wandb) with a model placed by strategy="model_parallel"."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.integrations.wandb import WandbLogger
from tests.integration.test_wandb_logger import only_run, wandb_dir  # noqa: F401 (fixture)

pytest.importorskip("wandb")


@kmp.parallelize(strategy="model_parallel")
def placed():
    inp = keras.Input((3,))
    h = keras.layers.Dense(4, name="first")(inp)
    model = keras.Model(inp, keras.layers.Dense(1, name="second")(h))
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_wandb_logger_records_a_placed_model(wandb_dir):  # noqa: F811
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 3)).astype("float32")
    model = placed()
    history = model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0,
                        callbacks=[WandbLogger(project="kmp-test")])
    run = only_run(wandb_dir)
    assert (run.config["strategy"], run.config["num_workers"]) == ("default", 1)
    assert [r.device for r in kmp.placement_report(model).rows] == [
        "/device:CPU:0", "/device:CPU:1"]
    epochs = [row for row in run.history if "epoch" in row]
    assert [row["loss"] for row in epochs] == history.history["loss"] and run.finished
