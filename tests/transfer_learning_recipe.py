"""keras.io's "Transfer learning & fine-tuning" guide, its end-to-end recipe rewritten small.

The guide's steps, on synthetic 8x8 RGB images: a "pretrained" base (a seeded
convolution and a BatchNormalization with set statistics, standing in for
Xception's ImageNet weights), frozen (`base.trainable = False`); a new head
(`Rescaling`, `base(x, training=False)`, `GlobalAveragePooling2D`, `Dense(1)`)
compiled with `Adam()`, `BinaryCrossentropy(from_logits=True)` and
`metrics=[BinaryAccuracy()]`, trained; then the base unfrozen, the model
compiled again with a new optimizer made in the `compile(...)` call (the
guide's `Adam(1e-5)`, or SGD with a decaying learning-rate schedule), and
trained again. The phase-2 compile is outside any strategy scope, as in the
guide; with `require_compiled=False` the phase-1 compile is outside too.

Left out: the guide's `RandomFlip`/`RandomRotation` and `Dropout` (random per
replica, so not comparable with one device). The base's BatchNormalization
stays frozen in phase 2: Keras 3.15 runs it in training mode under `fit` despite
`training=False` (its moving statistics move on one device too), and a
replica's statistics are those of its share of the batch (`sync_batchnorm`).
"""

from __future__ import annotations

import numpy as np

ROWS, BATCH, EPOCHS = 64, 16, 2  # 4 steps an epoch: 8 optimizer iterations per phase


def make_images(rows: int = ROWS, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """Pixel values in [0, 255] and a binary label that depends on the red/blue contrast."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 255, size=(rows, 8, 8, 3)).astype("float32")
    y = (x[..., 0].mean(axis=(1, 2)) > x[..., 2].mean(axis=(1, 2))).astype("float32")[:, None]
    return x, y


def pretrained_base():
    """The stand-in for `keras.applications.Xception(weights="imagenet", include_top=False)`."""
    import keras

    base = keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(6, 3, activation="relu",
                            kernel_initializer=keras.initializers.GlorotUniform(21)),
        keras.layers.BatchNormalization(),
        keras.layers.Conv2D(4, 3, activation="relu",
                            kernel_initializer=keras.initializers.GlorotUniform(22)),
    ], name="base")
    bn = base.layers[1]
    rng = np.random.default_rng(23)
    gamma, beta, mean, variance = (w.shape for w in bn.get_weights())
    bn.set_weights([rng.uniform(0.5, 1.5, gamma), rng.normal(0, 0.1, beta),
                    rng.uniform(0, 0.5, mean), rng.uniform(0.5, 2, variance)])
    return base


def phase_1_compile(model) -> None:
    import keras

    model.compile(optimizer=keras.optimizers.Adam(),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.BinaryAccuracy()])


def factory(compiled: bool):
    """The user's model factory: base frozen, new head; compiled (phase 1) when `compiled`."""
    import keras

    def build():
        base = pretrained_base()
        base.trainable = False
        inputs = keras.Input((8, 8, 3))
        x = keras.layers.Rescaling(scale=1 / 127.5, offset=-1)(inputs)
        x = base(x, training=False)
        x = keras.layers.GlobalAveragePooling2D()(x)
        outputs = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(24))(x)
        model = keras.Model(inputs, outputs)
        if compiled:
            phase_1_compile(model)
        return model

    return build


def fine_tune_optimizer(kind: str):
    import keras

    if kind == "adam":
        return keras.optimizers.Adam(1e-5)  # the guide's "very low learning rate"
    if kind == "schedule":
        return keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(
            0.05, decay_steps=2, decay_rate=0.5))
    raise ValueError(f"Received: kind={kind!r}")


def run(strategy: str, fine_tune: str = "schedule", require_compiled: bool = True,
        without: str | None = None) -> dict:
    """The recipe under `kmp.parallelize(strategy=...)`; plain values to compare.

    `without`: a `kmp.compat` patch undone once the model is made (Keras's behaviour).

    Returns:
        `iterations` (the optimizer's after each phase), `weights`, `histories` (of
        both phases), `same_optimizer` (whether the model trained with the very
        optimizer object the user made for phase 2).
    """
    import keras

    import keras_mgpu_plugins as kmp

    x, y = make_images()
    model = kmp.parallelize(strategy=strategy, require_compiled=require_compiled)(
        factory(compiled=require_compiled))()
    if without:
        kmp.compat.remove(without)
    if not require_compiled:
        phase_1_compile(model)  # outside the factory, outside any scope
    first = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    iterations = [int(model.optimizer.iterations.numpy())]

    base = model.get_layer("base")
    base.trainable = True
    for layer in base.layers:  # see the module's docstring
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False
    optimizer = fine_tune_optimizer(fine_tune)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.BinaryAccuracy()])
    second = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    iterations.append(int(model.optimizer.iterations.numpy()))
    return {"iterations": iterations, "weights": model.get_weights(),
            "histories": [first.history, second.history],
            "same_optimizer": model.optimizer is optimizer}


def max_difference(a: list, b: list) -> float:
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b, strict=True))
