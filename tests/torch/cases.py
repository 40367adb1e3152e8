"""What the torch tests run in each process (`tests/torch/job.py`): each returns what it measured.

Run alone (no `WORLD_SIZE`), `@kmp.parallelize` runs the factory as is: the one-device
reference; run as rank `r` of 2 processes, kmp's data parallelism.
"""

from __future__ import annotations

import json
import os

import numpy as np

FEATURES = 4


def data(rows: int = 23, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1)) + 0.1).astype("float32")
    return x, y


def factory(optimizer: str = "sgd", batchnorm: bool = False, sync_batchnorm: bool = False,
            dropout: bool = False, metrics: tuple = ("mae",), loss: str = "mse", **compile_args):
    import keras

    import keras_mgpu_plugins as kmp

    @kmp.parallelize(sync_batchnorm=sync_batchnorm)
    def build():
        keras.utils.set_random_seed(7)
        layers = [keras.Input((FEATURES,)), keras.layers.Dense(6, activation="tanh")]
        if batchnorm:
            layers.append(keras.layers.BatchNormalization())
        if dropout:
            layers.append(keras.layers.Dropout(0.3))
        model = keras.Sequential([*layers, keras.layers.Dense(1)])
        chosen = {"sgd": lambda: keras.optimizers.SGD(0.05),
                  "adam": lambda: keras.optimizers.Adam(0.01),
                  "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05)}[optimizer]
        chosen_loss = (keras.losses.BinaryCrossentropy(from_logits=True) if loss == "bce_logits"
                       else loss)
        model.compile(optimizer=chosen(), loss=chosen_loss, metrics=list(metrics),
                      **compile_args)
        return model

    return build()


def measured(model, history=None, **more) -> dict:
    out = {f"w{i}": w for i, w in enumerate(model.get_weights())}
    ddp = vars(model).get("ddp_model")  # keras-nightly's own DistributedDataParallel, if made
    out["engine"] = type(ddp).__name__ if ddp is not None else "kmp"
    if history is not None:
        out["history"] = json.dumps(history.history)
    return {**out, **more}


def topology() -> dict:
    import keras_mgpu_plugins as kmp

    t = kmp.topology()
    return {"topology": (t.worker_index, t.num_workers, t.is_chief, t.source)}


def parity(optimizer: str = "sgd", rows: int = 23, batch: int = 4, epochs: int = 2,
           batchnorm: bool = False, sync_batchnorm: bool = False) -> dict:
    """fit with validation, evaluate, predict; rows and batch sizes that leave partial and
    uneven batches (23 rows, batch 4: a last batch of 3; validation 9 rows; predict 5)."""
    x, y = data(rows)
    model = factory(optimizer, batchnorm, sync_batchnorm)
    history = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0,
                        validation_data=(x[:9], y[:9]))
    evaluated = model.evaluate(x, y, batch_size=batch, verbose=0)
    predicted = model.predict(x[:5], batch_size=batch, verbose=0)
    predicted_small = model.predict(x[:1], verbose=0)  # one row on two processes
    return measured(model, history, evaluate=np.asarray(evaluated), predict=predicted,
                    predict_small=predicted_small)


def shuffled(mode="true", rows: int = 22, batch: int = 4, epochs: int = 3) -> dict:
    """fit(shuffle=...), with the global order of each pass kmp fed (on several processes;
    none on one device, where Keras shuffles itself)."""
    from keras_mgpu_plugins.inputs import shuffle

    mode = True if mode == "true" else mode
    x, y = data(rows)
    model = factory("adam")
    drawn, real = [], shuffle.agreed

    def agreed(order, runtime):
        drawn.append(real(order, runtime))
        return drawn[-1]

    shuffle.agreed = agreed
    try:
        history = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=mode, verbose=0)
    finally:
        shuffle.agreed = real
    return measured(model, history,
                    orders=np.stack(drawn[-epochs:]) if drawn else np.zeros((0, rows)))


def replayed(orders: list, batch: int = 4) -> dict:
    """One device trained on the given global order of each epoch (shuffle=False)."""
    orders = np.asarray(orders)
    x, y = data(orders.shape[1])
    model = factory("adam")
    logs = [model.fit(x[order], y[order], batch_size=batch, epochs=1, shuffle=False,
                      verbose=0).history for order in orders]
    return {**measured(model), "history": json.dumps({k: [log[k][0] for log in logs]
                                                      for k in logs[0]})}


def inputs(kind: str, rows: int = 21, batch: int = 4) -> dict:
    """The same global input as a dict, a PyDataset, a generator or a DataLoader; sample and
    class weights."""
    import keras

    x, y = data(rows)
    weights = np.linspace(0.5, 1.5, rows).astype("float32")
    if kind == "dict":
        model = _dict_model()
        history = model.fit({"a": x[:, :2], "b": x[:, 2:]}, y, batch_size=batch, epochs=2,
                            shuffle=False, verbose=0, sample_weight=weights)
        predicted = model.predict({"a": x[:, :2], "b": x[:, 2:]}, batch_size=batch, verbose=0)
        return measured(model, history, predict=predicted)
    model = factory("adam")
    if kind == "pydataset":
        class Batches(keras.utils.PyDataset):
            def __len__(self):
                return -(-rows // batch)

            def __getitem__(self, i):
                part = slice(i * batch, (i + 1) * batch)
                return x[part], y[part], weights[part]

        history = model.fit(Batches(), epochs=2, shuffle=False, verbose=0)
        predicted = model.predict(Batches(), verbose=0)
    elif kind == "generator":
        def batches():
            for start in range(0, rows, batch):
                yield x[start:start + batch], y[start:start + batch]

        history = model.fit(batches(), epochs=1, verbose=0)
        predicted = model.predict(batches(), verbose=0)
    elif kind == "dataloader":
        import torch

        dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=False)
        history = model.fit(loader, epochs=2, verbose=0, validation_data=loader)
        predicted = model.predict(loader, verbose=0)
    elif kind == "four_parts":  # a GAN's batches: (x, y, noise, weights), its own train_step
        import torch

        model = _four_part_model()
        noise = np.random.default_rng(1).normal(size=x.shape).astype("float32") * 0.1
        parts = [torch.from_numpy(a) for a in (x, y, noise, weights[:, None])]
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*parts),
                                             batch_size=batch, shuffle=False)
        history = model.fit(loader, epochs=2, verbose=0)
        predicted = model.predict(x, batch_size=batch, verbose=0)
    elif kind == "class_weight":
        labels = (y > 0).astype("int32")
        model = factory("sgd", loss="bce_logits", metrics=("accuracy",))
        history = model.fit(x, labels.astype("float32"), batch_size=batch, epochs=2,
                            shuffle=False, verbose=0, class_weight={0: 0.3, 1: 1.7})
        predicted = model.predict(x, batch_size=batch, verbose=0)
    else:
        raise ValueError(kind)
    return measured(model, history, predict=predicted)


def _dict_model():
    import keras

    import keras_mgpu_plugins as kmp

    @kmp.parallelize
    def build():
        keras.utils.set_random_seed(7)
        a, b = keras.Input((2,), name="a"), keras.Input((2,), name="b")
        hidden = keras.layers.Dense(5, activation="tanh")(keras.layers.Concatenate()([a, b]))
        model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(hidden))
        model.compile(keras.optimizers.SGD(0.05), "mse", weighted_metrics=["mae"])
        return model

    return build()


def _four_part_model():
    """A model whose own train_step unpacks 4 tensors (Keras's `fit` passes a DataLoader's
    batches to it as they are), trained with public API only."""
    import keras
    import torch

    import keras_mgpu_plugins as kmp

    class FourParts(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1)
            self.tracker = keras.metrics.Mean(name="loss")

        @property
        def metrics(self) -> list:
            return [self.tracker]

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, y, noise, weight = data
            self.zero_grad()
            loss = keras.ops.mean(weight * keras.ops.square(self(x + noise, training=True) - y))
            loss.backward()
            with torch.no_grad():
                self.optimizer.apply([v.value.grad for v in self.trainable_weights],
                                     self.trainable_weights)
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

    @kmp.parallelize
    def build():
        keras.utils.set_random_seed(7)
        model = FourParts()
        model(np.zeros((1, FEATURES), "float32"))  # built: fit needs no symbolic batch
        model.compile(keras.optimizers.SGD(0.05))
        model.optimizer.build(model.trainable_variables)
        return model

    return build()


def refused_loader() -> dict:
    """A DataLoader with a DistributedSampler: refused, naming what to pass."""
    import torch

    x, y = data(8)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler)
    model = factory("sgd")
    try:
        model.fit(loader, epochs=1, verbose=0)
    except ValueError as err:
        return {"error_text": str(err)}
    return {"error_text": "no error"}


def plain_keras(callbacks: str = "", folder: str = "") -> dict:
    """A model kmp did not build, fit in every process (the refusal where Keras would train
    one model per process); with `callbacks`, kmp's callbacks given to that fit."""
    import keras

    import keras_mgpu_plugins as kmp

    x, y = data(16)
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    given = []
    if callbacks:
        given = [kmp.callbacks.EarlyStopping(monitor="loss", patience=1)]
    runtime = kmp.runtime.of()
    found = {"rank": tuple(runtime.rank()), "topology": topology()["topology"]}
    try:
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=given)
        found["fit"] = "trained"
    except RuntimeError as err:
        found["fit"] = f"{type(err).__name__}: {err}"
    return found


def upstream_fit(folder: str) -> dict:
    """keras.distribution.initialize() (keras-nightly: the process group) and Keras's own fit of
    a plain model, with kmp's ModelCheckpoint; the files this process wrote."""
    import keras

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.io import atomic

    try:
        keras.distribution.initialize()
    except Exception as err:  # noqa: BLE001 - Keras 3.15 on torch has none
        return {"fit": f"{type(err).__name__}: {err}"}
    writes, real = [], atomic.atomic_write

    def recording(path, write, suffix=""):
        writes.append(os.path.basename(path))
        return real(path, write, suffix)

    atomic.atomic_write = recording
    x, y = data(16)
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[
        kmp.callbacks.ModelCheckpoint(os.path.join(folder, "plain.keras"))])
    rank = kmp.runtime.of(model).rank()
    return {"fit": "trained", "topology": list(rank), "writes": sorted(set(writes)),
            "weights": model.get_weights()}


def suite(scenarios: list) -> dict:
    """Several scenarios in one process (each a `[function name, kwargs]`), by
    `"name(kwargs)"`: one start of torch and Keras for all (a start costs seconds)."""
    found = {}
    for name, kwargs in scenarios:
        key = f"{name}({json.dumps(kwargs, sort_keys=True)})"
        try:
            if name not in globals():  # the settings matrix's scenarios
                from tests.torch import matrix

                found[key] = getattr(matrix, name)(**kwargs)
            else:
                found[key] = globals()[name](**kwargs)
        except Exception as err:  # noqa: BLE001 - recorded; the test names it
            found[key] = {"error": f"{type(err).__name__}: {err}"}
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                raise  # the other process may be waiting in a collective: stop the job
    return found
