"""Three models whose training-step FLOPs are known in closed form, for every lane's test of
DeviceMetricsLogger's counted FLOPs (`tests/unit/test_flops.py`, `tests/jax/test_flops.py`,
`tests/torch/test_flops.py`).

The analytic count is the model's matrix products and convolutions at 2 FLOPs per
multiply-add: the forward pass, then the backward pass's gradient of every weight (one more
product of the same size) and of every layer's input that depends on a weight (one more;
not for a layer whose input is the data itself). Elementwise ops (activations, biases,
softmax, normalisation) are left out of it: the counters that see them (XLA, TensorFlow's
profiler) count a few percent more, well inside the tests' 5%.
"""

from __future__ import annotations

import numpy as np

BATCH = 16
MLP = (256, 512, 512, 10)  # in, hidden, hidden, out
CNN = (16, 16, 3, 32, 64, 10)  # height, width, channels, filters 1, filters 2, classes
SEQ, VOCAB, DIM, HEADS, FFN = 32, 256, 64, 4, 256


def mlp():
    import keras

    sizes = MLP
    return keras.Sequential([keras.Input((sizes[0],)),
                             keras.layers.Dense(sizes[1], activation="relu"),
                             keras.layers.Dense(sizes[2], activation="relu"),
                             keras.layers.Dense(sizes[3])])


def mlp_flops(batch: int = BATCH) -> float:
    a, b, c, d = MLP
    first, hidden, out = 2 * batch * a * b, 2 * batch * b * c, 2 * batch * c * d
    return 2 * first + 3 * (hidden + out)  # the first layer's input is the data


def cnn():
    import keras

    h, w, c, f1, f2, classes = CNN
    return keras.Sequential([keras.Input((h, w, c)),
                             keras.layers.Conv2D(f1, 3, activation="relu"),
                             keras.layers.Conv2D(f2, 3, activation="relu"),
                             keras.layers.GlobalAveragePooling2D(),
                             keras.layers.Dense(classes)])


def cnn_flops(batch: int = BATCH) -> float:
    h, w, c, f1, f2, classes = CNN
    conv1 = 2 * (h - 2) * (w - 2) * f1 * 3 * 3 * c  # "valid" padding: every tap is real
    conv2 = 2 * (h - 4) * (w - 4) * f2 * 3 * 3 * f1
    dense = 2 * f2 * classes
    return batch * (2 * conv1 + 3 * (conv2 + dense))


def transformer():
    import keras

    tokens = keras.Input((SEQ,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, DIM)(tokens)
    x = keras.layers.LayerNormalization()(x + keras.layers.MultiHeadAttention(
        HEADS, DIM // HEADS)(x, x))
    ffn = keras.layers.Dense(DIM)(keras.layers.Dense(FFN, activation="relu")(x))
    x = keras.layers.LayerNormalization()(x + ffn)
    return keras.Model(tokens, keras.layers.Dense(VOCAB)(x))


def transformer_flops(batch: int = BATCH) -> float:
    projections = 4 * 2 * SEQ * DIM * DIM  # query, key, value, output
    attention = 2 * 2 * SEQ * SEQ * DIM  # scores and the weighted sum, over the heads
    ffn = 2 * 2 * SEQ * DIM * FFN
    head = 2 * SEQ * DIM * VOCAB
    return batch * 3 * (projections + attention + ffn + head)  # every input depends on a weight


MODELS = {"mlp": (mlp, mlp_flops), "cnn": (cnn, cnn_flops),
          "transformer": (transformer, transformer_flops)}


def data(name: str, batch: int = BATCH, steps: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets for `steps` batches of model `name`."""
    rng = np.random.default_rng(0)
    rows = batch * steps
    if name == "mlp":
        return (rng.normal(size=(rows, MLP[0])).astype("float32"),
                rng.normal(size=(rows, MLP[-1])).astype("float32"))
    if name == "cnn":
        return (rng.normal(size=(rows, *CNN[:3])).astype("float32"),
                rng.normal(size=(rows, CNN[-1])).astype("float32"))
    return (rng.integers(0, VOCAB, size=(rows, SEQ)).astype("int32"),
            rng.integers(0, VOCAB, size=(rows, SEQ)).astype("int32"))


def counted(name: str, batch: int = BATCH) -> dict:
    """Trains model `name` for one epoch with DeviceMetricsLogger; what it logged and the
    analytic count."""
    import keras

    import keras_mgpu_plugins as kmp

    build, analytic = MODELS[name]
    model = build()
    loss = "sparse_categorical_crossentropy" if name == "transformer" else "mse"
    model.compile(optimizer="sgd", loss=loss)
    x, y = data(name, batch, steps=8)  # 6 steps timed: the steady pace, not the first
    logger = kmp.callbacks.DeviceMetricsLogger(batch_size=batch, summary=False,
                                               sample_interval=None)
    history = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
                        callbacks=[logger])
    logged = {k: v[-1] for k, v in history.history.items()}
    return {"logged": logged, "analytic": analytic(batch), "backend": keras.backend.backend()}
