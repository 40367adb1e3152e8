"""The fit-settings matrix on JAX: `python -m tests.jax.matrix CASE OUT`.

CASE "reference" (plain Keras, one device), "devices" (`kmp.simulate_devices(2)`,
`@kmp.parallelize`) or "processes" (one of the 2 processes `kmp-launch -n 2` starts,
`@kmp.parallelize`; OUT gets the process index). Every scenario runs in this one
process (tiny models, few steps) and writes its weights, History, evaluate and
predict under its name to OUT (an .npz); `test_matrix.py` compares them.
The data and model shapes are `tests/fit_settings_scenarios.py`'s.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from tests.fit_settings_scenarios import make_data, model_factory

BATCH = 8


def sgd():
    import keras

    return keras.optimizers.SGD(0.05)


def adam():
    import keras

    return keras.optimizers.Adam(0.01)


def classify_factory(optimizer=sgd):
    import keras

    def build():
        model = keras.Sequential([
            keras.Input((5,)),
            keras.layers.Dense(4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(3)),
            keras.layers.Dense(1, activation="sigmoid", kernel_initializer=keras.initializers.GlorotUniform(4))])
        model.compile(optimizer(), loss="binary_crossentropy", metrics=["accuracy"])
        return model

    return build


def stateless_factory(optimizer=sgd):
    """A subclassed model with its own JAX-style (stateless) `train_step`, as Keras's guide."""
    import jax
    import keras

    class Custom(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(4, activation="tanh",
                                             kernel_initializer=keras.initializers.GlorotUniform(3))
            self.out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(4))

        def call(self, x, training=False):
            return self.out(self.hidden(x))

        def loss_and_updates(self, trainable, non_trainable, x, y, training=False):
            y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x,
                                                        training=training)
            return keras.ops.mean((y - y_pred) ** 2), (y_pred, non_trainable)

        def train_step(self, state, data):
            trainable, non_trainable, optimizer_vars, metrics_vars = state
            x, y = data
            grad_fn = jax.value_and_grad(self.loss_and_updates, has_aux=True)
            (loss, (y_pred, non_trainable)), grads = grad_fn(trainable, non_trainable, x, y,
                                                             training=True)
            trainable, optimizer_vars = self.optimizer.stateless_apply(optimizer_vars, grads,
                                                                       trainable)
            new_metrics = []
            logs = {}
            for metric in self.metrics:
                count = len(metric.variables)
                these, metrics_vars = metrics_vars[:count], metrics_vars[count:]
                if metric.name == "loss":
                    these = metric.stateless_update_state(these, loss)
                else:
                    these = metric.stateless_update_state(these, y, y_pred)
                logs[metric.name] = metric.stateless_result(these)
                new_metrics += list(these)
            return logs, (trainable, non_trainable, optimizer_vars, new_metrics)

    def build():
        model = Custom()
        model(np.zeros((2, 5), "float32"))  # builds its layers
        model.compile(optimizer(), loss="mse", metrics=["mae"])
        return model

    return build


def policy(name):
    def build_with(factory):
        def build():
            import keras

            keras.mixed_precision.set_global_policy(name)
            try:
                return factory()
            finally:
                keras.mixed_precision.set_global_policy("float32")

        return build

    return build_with


def fit_kwargs(**extra):
    return {"batch_size": BATCH, "epochs": 2, "shuffle": False, "verbose": 0, **extra}


def scenarios():
    """name -> (factory, fit arguments, how: "fit" / "twice" / "recompile")."""
    x, y = make_data()
    weights = np.linspace(0.5, 1.5, len(x)).astype("float32")
    labels = (y > 0).astype("float32")
    cases = {}
    for tag, opt in (("sgd", sgd), ("adam", adam)):
        cases[f"{tag}"] = (model_factory(optimizer=opt), {}, "fit")
        cases[f"{tag}_steps_per_execution"] = (model_factory(steps_per_execution=2, optimizer=opt),
                                               {}, "fit")
        cases[f"{tag}_no_jit"] = (model_factory(optimizer=opt, jit_compile=False), {}, "fit")
        cases[f"{tag}_sample_weight"] = (model_factory(optimizer=opt), {"sample_weight": weights},
                                         "fit")
        cases[f"{tag}_class_weight"] = (classify_factory(opt), {"class_weight": {0: 0.5, 1: 2.0},
                                                                "y": labels}, "fit")
        cases[f"{tag}_validation_split"] = (model_factory(optimizer=opt),
                                            {"validation_split": 0.2}, "fit")
        cases[f"{tag}_validation_data"] = (model_factory(optimizer=opt),
                                           {"validation_data": (x[:16], y[:16])}, "fit")
        cases[f"{tag}_batchnorm"] = (model_factory(batchnorm=True, optimizer=opt), {}, "fit")
        cases[f"{tag}_custom_train_step"] = (stateless_factory(opt), {}, "fit")
        cases[f"{tag}_fit_twice"] = (model_factory(optimizer=opt), {}, "twice")
        cases[f"{tag}_recompile"] = (model_factory(optimizer=opt), {}, "recompile")
        for mixed in ("mixed_float16", "mixed_bfloat16"):
            cases[f"{tag}_{mixed}"] = (policy(mixed)(model_factory(optimizer=opt)), {}, "fit")
            # The noise: one device, the same batches, each batch's rows in reverse order.
            cases[f"{tag}_{mixed}_reversed"] = (policy(mixed)(model_factory(optimizer=opt)),
                                                {"reverse": True}, "fit")
    import keras

    cases["sgd_gradient_accumulation"] = (model_factory(optimizer=lambda: keras.optimizers.SGD(
        0.05, gradient_accumulation_steps=2)), {}, "fit")
    cases["adam_gradient_accumulation"] = (model_factory(optimizer=lambda: keras.optimizers.Adam(
        0.01, gradient_accumulation_steps=2)), {}, "fit")
    cases["sgd_ema"] = (model_factory(optimizer=lambda: keras.optimizers.SGD(
        0.05, use_ema=True, ema_overwrite_frequency=3)), {}, "fit")
    cases["adam_ema"] = (model_factory(optimizer=lambda: keras.optimizers.Adam(
        0.01, use_ema=True, ema_overwrite_frequency=3)), {}, "fit")
    cases["adamw"] = (model_factory(optimizer=lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1)),
                      {}, "fit")
    return x, y, cases


def run(name, factory, extra, how, x, y, wrap):
    import keras

    model = wrap(factory)()
    data_y = extra.pop("y", y)
    if extra.pop("reverse", False):
        x, data_y = (a.reshape(-1, BATCH, a.shape[-1])[:, ::-1].reshape(a.shape) for a in (x, data_y))
    history = model.fit(x, data_y, **fit_kwargs(**extra))
    logs = dict(history.history)
    if how == "twice":  # a second fit continues; initial_epoch numbers its epochs
        second = model.fit(x, data_y, **fit_kwargs(initial_epoch=2, epochs=3))
        logs.update({f"second_{k}": v for k, v in second.history.items()})
    elif how == "recompile":
        model.compile(keras.optimizers.SGD(0.02), loss="mae", metrics=["mse"])
        second = model.fit(x, data_y, **fit_kwargs(epochs=1))
        logs.update({f"second_{k}": v for k, v in second.history.items()})
    evaluated = model.evaluate(x, data_y, batch_size=BATCH, verbose=0, return_dict=True)
    predicted = model.predict(x, batch_size=BATCH, verbose=0)
    out = {f"{name}:history": json.dumps(logs), f"{name}:evaluate": json.dumps(evaluated),
           f"{name}:predict": np.asarray(predicted, "float32")}
    out.update({f"{name}:w{i}": np.asarray(w, "float32") for i, w in enumerate(model.get_weights())})
    return out


def main(case, out):
    os.environ["KERAS_BACKEND"] = "jax"
    import keras_mgpu_plugins as kmp

    if case == "devices":
        kmp.simulate_devices(2)
    wrap = (lambda f: f) if case == "reference" else kmp.parallelize
    x, y, cases = scenarios()
    only = os.environ.get("KMP_MATRIX_ONLY")
    results = {}
    for name, (factory, extra, how) in cases.items():
        if only and name not in only.split(","):
            continue
        try:
            results.update(run(name, factory, dict(extra), how, x, y, wrap))
        except Exception as err:  # a refusal (or a failure) is a result too
            results[f"{name}:error"] = f"{type(err).__name__}: {err}"
    if case == "processes":
        out = f"{out}.{os.environ['KMP_WORKER_INDEX']}.npz"
    np.savez(out, **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
