"""The fit settings that matter for big models, under `strategy="model_parallel"` and
`"hybrid"` on JAX: the settings, the model, one run, and what each process of the
hybrid job (`kmp.launch`, 2 processes of 2 CPU devices each) runs.

`model_parallel_job.build`'s model (an Embedding sharded by rows, Dense kernels by
columns, a 5-column Dense replicated), 32 rows, global batch 8 (4 steps an epoch),
2 epochs, `validation_data` of 16 rows (2 steps): so `steps_per_execution=3` ends each
pass with a partial execution and `gradient_accumulation_steps=3` windows cross epochs.
Mixed precision sets the global dtype policy inside the factory (the output layer in
float32, as Keras recommends) and restores float32 after.

Noise scenarios (one device, plain Keras, the same setting): `"eager"`
(`jit_compile=False`: every op rounded on its own, not fused by XLA) and `"reversed"`
(each batch's rows in reverse order): equivalent computations in another order, whose
difference from the reference is what bfloat16's rounding alone makes.
"""

from __future__ import annotations

import json

import numpy as np

from tests.jax.model_parallel_job import BATCH, EPOCHS, LENGTH, VOCAB, data

#: name -> (optimizer, build options). SGD(0.05) and Adam(0.01), as model_parallel_job.
SETTINGS = {
    "sgd_gradient_accumulation_2": ("sgd", {"accumulate": 2}),
    "adam_gradient_accumulation_3": ("adam", {"accumulate": 3}),
    "sgd_steps_per_execution_3": ("sgd", {"steps_per_execution": 3}),
    "adam_steps_per_execution_2": ("adam", {"steps_per_execution": 2}),
    "sgd_no_jit": ("sgd", {"jit_compile": False}),
    "adam_no_jit_steps_per_execution_3": ("adam", {"jit_compile": False,
                                                   "steps_per_execution": 3}),
    "sgd_mixed_bfloat16": ("sgd", {"policy": "mixed_bfloat16"}),
    "adam_mixed_bfloat16": ("adam", {"policy": "mixed_bfloat16"}),
}
MIXED = [name for name in SETTINGS if "mixed" in name]


def factory(name: str, jit_compile: bool | None = None):
    """The model factory of setting `name` (`jit_compile` overrides the setting's)."""
    optimizer, options = SETTINGS[name]
    options = dict(options)
    if jit_compile is not None:
        options["jit_compile"] = jit_compile

    def build_model():
        return build(optimizer, **options)

    build_model.__qualname__ = f"build_{name}"
    return build_model


def build(optimizer: str, accumulate: int | None = None, steps_per_execution: int = 1,
          jit_compile: bool = True, policy: str | None = None):
    import keras

    keras.utils.set_random_seed(7)
    if policy:
        keras.mixed_precision.set_dtype_policy(policy)
    try:
        inputs = keras.Input((LENGTH,), dtype="int32")
        hidden = keras.layers.Flatten()(keras.layers.Embedding(VOCAB, 16, name="table")(inputs))
        hidden = keras.layers.Dense(32, activation="tanh", name="hidden")(hidden)
        hidden = keras.layers.Dense(5, name="narrow")(hidden)
        outputs = keras.layers.Dense(2, name="out", dtype="float32")(hidden)
        model = keras.Model(inputs, outputs)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    extra = {"gradient_accumulation_steps": accumulate} if accumulate else {}
    chosen = (keras.optimizers.Adam(0.01, **extra) if optimizer == "adam"
              else keras.optimizers.SGD(0.05, **extra))
    model.compile(chosen, "mse", metrics=["mae"], steps_per_execution=steps_per_execution,
                  jit_compile=jit_compile)
    return model


def train(model, reverse: bool = False) -> dict:
    """fit (History), evaluate, predict and the weights as host arrays."""
    from tests.jax.model_parallel_job import weights

    x, y = data()
    if reverse:  # each batch's rows in reverse order: the same batches, summed otherwise
        x, y = _reversed(x), _reversed(y)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        validation_data=(x[:16], y[:16]))
    predicted = np.asarray(model.predict(x, batch_size=BATCH, verbose=0), "float32")
    return {"history": json.dumps(history.history),
            "evaluate": np.asarray(model.evaluate(x, y, batch_size=BATCH, verbose=0)),
            "predict": _reversed(predicted) if reverse else predicted,
            "weights": weights(model)}


def _reversed(rows):
    return rows.reshape(-1, BATCH, rows.shape[-1])[:, ::-1].reshape(rows.shape)


def worst(got: dict, want: dict) -> dict:
    """The largest absolute differences: weights, History, evaluate, predict."""
    history, wanted = json.loads(got["history"]), json.loads(want["history"])
    return {
        "weights": max(float(np.max(np.abs(np.asarray(a, "float64") - np.asarray(b, "float64"))))
                       for a, b in zip(got["weights"], want["weights"], strict=True)),
        "history": max(float(np.max(np.abs(np.subtract(history[k], wanted[k]))))
                       for k in wanted),
        "evaluate": float(np.max(np.abs(np.subtract(got["evaluate"], want["evaluate"])))),
        "predict": float(np.max(np.abs(np.subtract(got["predict"], want["predict"])))),
    }


def hybrid_job(cases: list) -> dict:
    """Each `(name, strategy)` of `cases` on this process (one of 2, 2 devices each): what it
    trained, and the layout and dtypes it trained with, or the error it raised."""
    import jax

    import keras_mgpu_plugins as kmp

    found = {"processes": jax.process_count(), "local_devices": len(jax.local_devices())}
    for name, strategy in cases:
        try:
            model = kmp.parallelize(factory(name), strategy=strategy)()
            results = train(model)
            results.update(facts(model))
        except Exception as err:  # noqa: BLE001 - a refusal is a result too
            results = {"error": f"{type(err).__name__}: {err}"}
        found[f"{strategy}:{name}"] = results
    return found


def facts(model) -> dict:
    """How `model` was laid out and computed: the hidden kernel's shards and mesh, its
    dtype and the layer's compute dtype, the optimizer's slot shards."""
    kernel = next(v for v in model.weights if v.path == "hidden/kernel")
    slots = [v for v in model.optimizer.variables if "hidden_kernel" in v.path]
    return {"shards": [tuple(s.data.shape) for s in kernel.value.addressable_shards],
            "mesh": dict(kernel.value.sharding.mesh.shape),
            "dtypes": (str(kernel.value.dtype), model.get_layer("hidden").compute_dtype),
            "slot_shards": sorted({tuple(s.data.shape) for v in slots
                                   for s in v.value.addressable_shards}),
            "slots": len(slots)}


def main() -> None:
    """Prints the figures of docs/model_parallelism.md: `python -m tests.jax.model_parallel_settings`
    (KERAS_BACKEND=jax): each setting's largest difference from one device under
    "model_parallel" (2 simulated devices) and "hybrid" (2 processes of 2), and the noise."""
    import keras

    import keras_mgpu_plugins as kmp

    kmp.simulate_devices(2)
    cases = [(name, "hybrid") for name in SETTINGS if "no_jit" not in name]
    env = {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    hybrid = kmp.launch(hybrid_job, num_workers=2, args=(cases,), timeout=400, env=env)[0]
    for name in SETTINGS:
        with keras.device("cpu:0"):
            runs = {"reference": train(factory(name)())}
            if name in MIXED:
                runs["eager"] = train(factory(name, jit_compile=False)())
                runs["reversed"] = train(factory(name)(), reverse=True)
        model = kmp.parallelize(factory(name), strategy="model_parallel")()
        runs["model_parallel"] = train(model)
        keras.distribution.set_distribution(None)
        runs["hybrid"] = hybrid.get(f"hybrid:{name}", {"error": "refused"})
        for lane, results in runs.items():
            if lane != "reference":
                shown = (results["error"] if "error" in results else "  ".join(
                    f"{k} {v:.1e}" for k, v in worst(results, runs["reference"]).items()))
                print(f"{name:36s} {lane:15s} {shown}")


if __name__ == "__main__":
    main()
