"""Fit settings run the same way on one device, 2 simulated devices and 2 workers.

Each scenario takes a `kmp.parallelize` strategy name and returns plain values
(weights, History, evaluate, predict, what callbacks saw), so a test compares
a distributed run with the `"default"` (one device) run of the same scenario.
SGD, no shuffle, seeded initialisers: weights must agree to 1e-5.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

ROWS, BATCH = 40, 4  # 10 steps an epoch: steps_per_execution=4 ends with a partial execution


def execution_batches(*begins: int, steps_per_execution: int = 4) -> list[int]:
    """The batch numbers `on_train_batch_end` gets for executions starting at `begins`.

    The installed Keras's numbering, the same on one device, 2 devices and 2 workers:
    Keras 3.15 passes an execution's last step (begin + steps_per_execution - 1, the
    partial last one included), Keras 3.10 its first (both run-tested; 3.11 taken as the
    first with the last step, keras-team/keras#21422).
    """
    import keras
    from packaging.version import Version

    last = Version(keras.__version__) >= Version("3.11")
    return [begin + steps_per_execution - 1 if last else begin for begin in begins]


def make_data(rows=ROWS, seed=7):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1)) + 0.1).astype("float32")
    return x, y


def model_factory(steps_per_execution=1, batchnorm=False, optimizer=None, probe=None, **compile_kwargs):
    """`probe`: a layer made lazily (a function returning it) put first."""
    import keras

    def build():
        layers = [keras.Input((5,)), *([probe()] if probe else []),
                  keras.layers.Dense(4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(3))]
        if batchnorm:
            layers.append(keras.layers.BatchNormalization())
        layers.append(keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(4),
                                         dtype="float32"))
        model = keras.Sequential(layers)
        model.compile(optimizer=optimizer() if optimizer else keras.optimizers.SGD(0.05), loss="mse",
                      metrics=["mae"], steps_per_execution=steps_per_execution, **compile_kwargs)
        return model

    return build


class BatchRecorder:
    """A Keras callback (made lazily) that records the batch indices its hooks see."""

    @staticmethod
    def make():
        import keras

        class Recorder(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.train, self.test, self.predict = [], [], []

            def on_train_batch_end(self, batch, logs=None):
                self.train.append(batch)

            def on_test_batch_end(self, batch, logs=None):
                self.test.append(batch)

            def on_predict_batch_end(self, batch, logs=None):
                self.predict.append(batch)

        return Recorder()


def steps_per_execution_run(strategy, steps_per_execution=4):
    """fit/evaluate/predict with steps_per_execution and batch-hook callbacks."""
    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.callbacks import ModelCheckpoint, WeightSyncVerifier

    x, y = make_data()
    model = kmp.parallelize(strategy=strategy)(model_factory(steps_per_execution))()
    recorder = BatchRecorder.make()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m-{epoch}-{batch}.weights.h5")
        callbacks = [recorder, ModelCheckpoint(path, save_weights_only=True, save_freq=4),
                     WeightSyncVerifier(check_freq=4)]
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                            validation_data=(x[:20], y[:20]), callbacks=callbacks)
        saved = sorted(os.listdir(tmp))
    evaluation = model.evaluate(x, y, batch_size=BATCH, verbose=0, callbacks=[recorder],
                                return_dict=True)
    predictions = model.predict(x, batch_size=BATCH, verbose=0, callbacks=[recorder])
    return {"weights": model.get_weights(), "history": history.history, "evaluate": evaluation,
            "predict": predictions, "train_batches": recorder.train, "saved": saved,
            "predict_batches": recorder.predict}


def sync_batchnorm_run(strategy, sync=True):
    import keras_mgpu_plugins as kmp

    x, y = make_data()
    model = kmp.parallelize(strategy=strategy, sync_batchnorm=sync)(model_factory(batchnorm=True))()
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return {"weights": model.get_weights(), "history": history.history}


#: y 3 times larger: one device's global-batch float16 kernel gradient overflows at 3 steps,
#: each replica's half-batch gradient (and their float32 sum) at 2 (see the tests).
OVERFLOW = {"scale_y": 3.0, "lr": 1e-4}


class ScaleRecorder:
    """A Keras callback (made lazily) that records the loss scale after each batch hook."""

    @staticmethod
    def make():
        import keras

        class Recorder(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.scales = []

            def on_train_batch_end(self, batch, logs=None):
                self.scales.append(float(keras.ops.convert_to_numpy(
                    self.model.optimizer.dynamic_scale)))

        return Recorder()


def mixed_precision_run(strategy, steps_per_execution=1, scale_y=1.0, lr=0.05, loud_half=1.0,
                        reverse_batches=False, batch_hooks=False):
    """`loud_half` scales the second half of every batch of 8 (replica 1's share on 2 devices);
    `reverse_batches` reverses the rows inside each batch (same batches, other summation order);
    `batch_hooks` adds kmp's ModelCheckpoint (integer save_freq) and WeightSyncVerifier
    (check_freq) and records the batch hooks. `scales`: the loss scale after each batch hook.
    With `OVERFLOW` one device's float16 gradient of the global batch overflows where each
    half-batch's does not."""
    import keras

    import keras_mgpu_plugins as kmp

    x, y = make_data(64)
    x.reshape(-1, 8, 5)[:, 4:] *= loud_half
    if reverse_batches:
        x, y = (a.reshape(-1, 8, a.shape[-1])[:, ::-1].reshape(a.shape).copy() for a in (x, y))
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = kmp.parallelize(strategy=strategy)(model_factory(
            steps_per_execution, optimizer=lambda: keras.optimizers.SGD(lr)))()
        callbacks, recorder, tmp = [ScaleRecorder.make()], BatchRecorder.make(), tempfile.mkdtemp()
        if batch_hooks:
            from keras_mgpu_plugins.callbacks import ModelCheckpoint, WeightSyncVerifier

            callbacks += [recorder, WeightSyncVerifier(check_freq=4),
                         ModelCheckpoint(os.path.join(tmp, "m-{epoch}-{batch}.weights.h5"),
                                         save_weights_only=True, save_freq=4)]
        history = model.fit(x, y * scale_y, batch_size=8, epochs=3, shuffle=False, verbose=0,
                            callbacks=callbacks)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    scale = float(np.asarray(model.optimizer.dynamic_scale))
    saved = sorted(os.listdir(tmp))
    shutil.rmtree(tmp, ignore_errors=True)
    return {"weights": model.get_weights(), "history": history.history, "scale": scale,
            "train_batches": recorder.train, "saved": saved, "scales": callbacks[0].scales}


def custom_train_step_factory(**compile_kwargs):
    """A subclassed model whose train_step follows Keras's guide (metrics of the updated weights)."""
    import keras
    import tensorflow as tf

    class Custom(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(4, activation="tanh",
                                             kernel_initializer=keras.initializers.GlorotUniform(3))
            self.out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(4))

        def call(self, x):
            return self.out(self.hidden(x))

        def train_step(self, data):
            x, y, weight = keras.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True),
                                         sample_weight=weight)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
            for metric in self.metrics:
                metric.update_state(loss) if metric.name == "loss" else metric.update_state(y, self(x))
            return {m.name: m.result() for m in self.metrics}

    def build():
        model = Custom()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"], **compile_kwargs)
        return model

    return build


def keras_habits_run(strategy):
    """Subclassed train_step, fit twice, re-compile, validation_freq, initial_epoch, class_weight."""
    import keras

    import keras_mgpu_plugins as kmp

    x, y = make_data()
    model = kmp.parallelize(strategy=strategy)(custom_train_step_factory())()
    first = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                      validation_data=(x[:16], y[:16]), validation_freq=2)
    second = model.fit(x, y, batch_size=8, epochs=4, initial_epoch=2, shuffle=False, verbose=0)
    with model.distribute_strategy.scope():
        model.compile(optimizer=keras.optimizers.SGD(0.02), loss="mse", metrics=["mae"])
    labels = (y > 0).astype("float32")
    third = model.fit(x, labels, batch_size=8, epochs=1, shuffle=False, verbose=0,
                      class_weight={0: 1.0, 1: 3.0})
    return {"weights": model.get_weights(), "histories": [first.history, second.history, third.history],
            "evaluate": model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True),
            "predict": model.predict(x, batch_size=8, verbose=0)}


def xla_and_accumulation_run(strategy, jit_compile=True, accumulation=None, steps_per_execution=1,
                             **optimizer_kwargs):
    """fit (with validation) and evaluate with `jit_compile` and the optimizer's
    `gradient_accumulation_steps=accumulation` (and `optimizer_kwargs`: clipping, EMA); `xla`
    says, for each trace of the model's forward pass in training, whether XLA compiled it."""
    import keras
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    import keras_mgpu_plugins as kmp

    xla = []

    class XlaProbe(keras.layers.Layer):
        def call(self, inputs, training=None):
            if training and not isinstance(inputs, keras.KerasTensor):
                xla.append(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
            return inputs

    build = model_factory(steps_per_execution, probe=XlaProbe,
                          jit_compile=jit_compile, optimizer=lambda: keras.optimizers.SGD(
                              0.05, gradient_accumulation_steps=accumulation, **optimizer_kwargs))
    x, y = make_data(64)
    model = kmp.parallelize(strategy=strategy)(build)()
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                        validation_data=(x[:16], y[:16]))
    return {"weights": model.get_weights(), "history": history.history, "xla": xla,
            "evaluate": model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True),
            "iterations": int(keras.ops.convert_to_numpy(model.optimizer.iterations))}


def refused_settings(strategy):
    """The message each setting kmp cannot make equivalent raises at the first fit."""
    import keras

    import keras_mgpu_plugins as kmp

    x, y = make_data()
    messages = {}

    def float16_accumulation():
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            return kmp.parallelize(strategy=strategy)(model_factory(optimizer=lambda: keras.optimizers.SGD(
                0.05, gradient_accumulation_steps=2)))()
        finally:
            keras.mixed_precision.set_global_policy("float32")

    for name, build in {
        "jit_compile_custom_train_step": lambda: kmp.parallelize(strategy=strategy)(
            custom_train_step_factory(jit_compile=True))(),
        "jit_compile_sync_batchnorm": lambda: kmp.parallelize(strategy=strategy, sync_batchnorm=True)(
            model_factory(batchnorm=True, jit_compile=True))(),
        "mixed_float16_accumulation": float16_accumulation,
    }.items():
        try:
            build().fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
            messages[name] = None
        except ValueError as err:
            messages[name] = str(err)
    return messages


def assert_close(got, want, atol=1e-5, what=""):
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=atol, err_msg=what)


def aligned(array, alignment=64):
    """A copy of `array` whose data starts on an `alignment`-byte boundary.

    TensorFlow takes a 64-byte-aligned NumPy array without copying it; the
    input-type scenarios use such arrays so that the `numpy_function_owned_outputs`
    patch is always put to the test, not only when the allocator happens to align them."""
    buffer = np.empty(array.nbytes + alignment, dtype=np.uint8)
    start = -buffer.ctypes.data % alignment
    out = buffer[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def input_types_run(strategy, kinds=("generator", "py_dataset", "dict_multi_io"),
                    steps_per_execution=1):
    """A Python generator (steps_per_epoch shorter than it), a PyDataset with workers (threads;
    `py_dataset_processes`: forked processes), dict inputs to a two-input, two-output model: the
    weights after each, and under "data_changed" the largest change fit made to the user's
    arrays (64-byte aligned, see `aligned`).

    The generator and PyDataset yield views of x and y. Without the
    `numpy_function_owned_outputs` patch, on 2 devices TensorFlow wrote the loss's
    intermediate values into the first replica's rows of y (then 0.05-0.3 off one device)
    wherever the step fetches its batch inside the step's function: Keras 3.15 always, and
    kmp's loop for `steps_per_execution` > 1; keras-nightly 3.16.0.dev fetches a
    `steps_per_execution=1` batch eagerly (the caller holds it: TensorFlow writes nowhere)."""
    import keras

    import keras_mgpu_plugins as kmp

    x, y = (aligned(a) for a in make_data(64))
    before = x.copy(), y.copy()

    def cycle():  # 6 batches: what 2 epochs of 3 steps take (and nothing left prefetching)
        for step in range(6):
            i = 16 * (step % 4)
            yield x[i:i + 16], y[i:i + 16]

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return x[16 * i:16 * i + 16], y[16 * i:16 * i + 16]

    runs = {}
    if "generator" in kinds:
        model = kmp.parallelize(strategy=strategy)(model_factory(steps_per_execution))()
        model.fit(cycle(), steps_per_epoch=3, epochs=2, verbose=0)  # the epoch ends mid-generator
        runs["generator"] = model.get_weights()
    if "py_dataset" in kinds:
        model = kmp.parallelize(strategy=strategy)(model_factory())()
        model.fit(Batches(workers=2), epochs=2, verbose=0, shuffle=False)
        runs["py_dataset"] = model.get_weights()
    if "py_dataset_processes" in kinds:  # forked data workers (kmp's SIGTERM patch on 2 workers)
        model = kmp.parallelize(strategy=strategy)(model_factory())()
        model.fit(Batches(workers=2, use_multiprocessing=True), epochs=2, verbose=0, shuffle=False)
        runs["py_dataset_processes"] = model.get_weights()

    def two_in_two_out():
        a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
        h = keras.layers.Dense(4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(5))(
            keras.layers.Concatenate()([a, b]))
        out1 = keras.layers.Dense(1, name="out1", kernel_initializer=keras.initializers.GlorotUniform(6))(h)
        out2 = keras.layers.Dense(1, name="out2", kernel_initializer=keras.initializers.GlorotUniform(7))(h)
        model = keras.Model({"a": a, "b": b}, {"out1": out1, "out2": out2})
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss={"out1": "mse", "out2": "mae"})
        return model

    if "dict_multi_io" in kinds:
        model = kmp.parallelize(strategy=strategy)(two_in_two_out)()
        history = model.fit({"a": x[:, :3], "b": x[:, 3:]}, {"out1": y, "out2": -y}, batch_size=16,
                            epochs=2, shuffle=False, verbose=0)
        runs["dict_multi_io"] = model.get_weights()
        runs["dict_multi_io_history"] = history.history
    runs["data_changed"] = max(float(np.max(np.abs(a - b))) for a, b in zip((x, y), before, strict=True))
    return runs


def device_metrics_per_batch_run(strategy, steps_per_execution=4, log_freq=4):
    """DeviceMetricsLogger taking a record every `log_freq` batches: the CSV rows (epoch, batches
    done, kind) and the batches its published records name."""
    import csv

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.callbacks import DeviceMetricsLogger

    x, y = make_data()
    model = kmp.parallelize(strategy=strategy)(model_factory(steps_per_execution))()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "metrics.csv")
        logger = DeviceMetricsLogger(log_freq=log_freq, csv_path=path, summary=False,
                                     sample_interval=None)
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                            callbacks=[logger])
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    return {"rows": [(r["epoch"], r["batch"], r["kind"]) for r in rows],
            "records": len(logger.records), "history": history.history,
            "weights": model.get_weights()}


def step_loop_collectives(strategy, steps_per_execution=4):
    """The collective ops one execution's traced loop runs per step, and outside its loop.

    Counted in the graph of each `steps_per_execution` loop (the function library,
    nested calls followed): `{"checked" | "full_batches": {"per_step": n, "per_execution": m}}`,
    for the loop with TensorFlow's per-step input check and the one without it.
    """
    import tensorflow as tf

    import keras_mgpu_plugins as kmp

    x, y = make_data()
    model = kmp.parallelize(strategy=strategy)(model_factory(steps_per_execution))()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    iterator = iter(model.distribute_strategy.experimental_distribute_dataset(dataset))
    library = {}

    def count(nodes, seen=()):
        total = 0
        for node in nodes:
            total += node.op.startswith("Collective")
            for attr in node.attr.values():
                names = [attr.func.name] + [f.name for f in attr.list.func]
                for name in names:
                    if name in library and name not in seen:
                        total += count(library[name].node_def, (*seen, name))
        return total

    def counted(loop_function):
        graph = loop_function.get_concrete_function(iterator).graph.as_graph_def()
        library.update({f.signature.name: f for f in graph.library.function})
        loops = [n for n in graph.node if n.op in ("While", "StatelessWhile")]
        assert len(loops) == 1, [n.op for n in graph.node]
        per_step = sum(count(library[loops[0].attr[a].func.name].node_def) for a in ("cond", "body"))
        return {"per_step": per_step, "per_execution": count(graph.node) - per_step}

    found = {"checked": counted(model.train_function._kmp_step_loop),
             "full_batches": counted(model.train_function._kmp_full_batch_loop)}
    single = kmp.parallelize(strategy=strategy)(model_factory(1))()
    single.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    step = single.train_function._kmp_single_step.get_concrete_function(iterator, tf.constant(True))
    graph = step.graph.as_graph_def()
    library.update({f.signature.name: f for f in graph.library.function})
    fetch = [n for n in graph.node if n.op in ("If", "StatelessIf")]  # full batch, or checked
    assert len(fetch) == 1, [n.op for n in graph.node]
    found["single"] = {"step": count([n for n in graph.node if n is not fetch[0]]),
                       **{k: count(library[fetch[0].attr[b].func.name].node_def)
                          for k, b in (("full_fetch", "then_branch"), ("checked_fetch", "else_branch"))}}
    return found


def recompile_outside_scope_run(strategy):
    """Trained, then compiled again outside the strategy's scope (as when fine-tuning), with
    the optimizer given as a string and as an instance made outside the scope too."""
    import keras

    import keras_mgpu_plugins as kmp

    x, y = make_data()
    histories, weights = [], []
    for optimizer in ("sgd", lambda: keras.optimizers.SGD(0.01)):
        model = kmp.parallelize(strategy=strategy)(model_factory(2))()
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        model.compile(optimizer=optimizer if isinstance(optimizer, str) else optimizer(),
                      loss="mse", metrics=["mae"], steps_per_execution=2)
        histories.append(model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                                   verbose=0).history)
        weights.append(model.get_weights())
    return {"histories": histories, "weights": weights}


def full_batch_executions_run(strategy):
    """Executions of full batches fetch without TensorFlow's per-step input check.

    A partial last batch (42 rows, batch 4), then `steps_per_epoch` keeping one iterator
    over several epochs, then one step per execution (`single`: 10 full batches, a partial). `claims`: for each execution, whether it went the way without
    the check (recorded where kmp's loop runs: under a distributing strategy).
    `uneven`: then arrays of 40 rows on worker 0 and 38 on the others (10 full batches
    against 9 and a partial one: as many steps), whose claims must agree.
    """
    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.backends.tensorflow.patches import input_check as _compat_input
    from keras_mgpu_plugins.backends.tensorflow.patches import trainer as _compat_trainer

    claims = []
    claim = _compat_trainer.claim_full_batches

    def recording(iterator, n, strategy):
        claims.append(claim(iterator, n, strategy))
        return claims[-1]

    _compat_trainer.claim_full_batches = _compat_input.claim_full_batches = recording
    try:
        x, y = make_data(rows=42)
        model = kmp.parallelize(strategy=strategy)(model_factory(4))()
        partial = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        with model.distribute_strategy.scope():
            model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
        kept = model.fit(x[:40], y[:40], batch_size=BATCH, epochs=3, steps_per_epoch=4,
                         shuffle=False, verbose=0)
        result = {"weights": model.get_weights(), "histories": [partial.history, kept.history],
                  "claims": list(claims)}
        claims.clear()
        with model.distribute_strategy.scope():  # one step per execution: 10 full, a partial
            model.compile(optimizer="sgd", loss="mse", steps_per_execution=1)
        single = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        result["single"] = {"claims": list(claims), "weights": model.get_weights(),
                            "history": single.history}
        claims.clear()
        with model.distribute_strategy.scope():
            model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
        rows = 40 if kmp.topology().worker_index == 0 else 38
        model.fit(x[:rows], y[:rows], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        result["uneven"] = {"claims": list(claims), "weights": model.get_weights()}
    finally:
        _compat_trainer.claim_full_batches = _compat_input.claim_full_batches = claim
    return result


def iterator_release(strategy):
    """The threads that destroy the distributed iterators of a first `fit`, once a second ran.

    Returns `(thread names, iterators the first fit made, the release thread's state)`; waits
    first for iterators made before to be destroyed (under load each can take seconds), then
    for every one of this fit's (at most 120 s each).
    """
    import gc
    import threading
    import weakref

    from tensorflow.python.distribute import input_lib

    import keras_mgpu_plugins as kmp

    threads: list[str] = []
    all_destroyed = threading.Event()
    made = []
    original = input_lib.DistributedDataset.__iter__

    def on_destroy():
        threads.append(threading.current_thread().name)
        if len(threads) >= len(made):
            all_destroyed.set()

    def watched_iter(self):
        iterator = original(self)
        made.append(1)
        weakref.finalize(iterator, on_destroy)
        return iterator

    from keras_mgpu_plugins.backends.tensorflow.patches import iterators

    iterators.wait_released(120)  # earlier scenarios' iterators, destroyed one by one
    x, y = make_data()
    model = kmp.parallelize(strategy=strategy)(model_factory())()
    input_lib.DistributedDataset.__iter__ = watched_iter
    try:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    finally:
        input_lib.DistributedDataset.__iter__ = original
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    gc.collect()  # Keras's epoch iterator may sit in a reference cycle
    model.evaluate(x, y, batch_size=BATCH, verbose=0)  # its iterator releases the rest
    all_destroyed.wait(120)
    return threads, len(made), iterators.release_state()


def release_state():
    """What kmp's iterator release thread is doing now (`release_state()`)."""
    from keras_mgpu_plugins.backends.tensorflow.patches import iterators

    state = iterators.release_state()
    state.pop("stack")  # long; the rest says enough
    return state


MAXLEN, VOCAB = 6, 10


def sparse_gradients_run(strategy, optimizer="adam", kind="position", dense=False):
    """Embedding lookups trained with `optimizer` ("sgd", "adam", "adamw", "rmsprop").

    `kind="position"`: one lookup of `arange(maxlen)` added to every row of the batch (the
    keras.io text transformer's position embedding; its gradient has one slice per position
    on one device, one per position and replica on N). `kind="tokens"`: a lookup per token,
    10 tokens in 48 per batch, so rows repeat within a batch on one device already.
    `strategy=None`: plain Keras, no kmp. `dense=True`: the optimizer is given dense
    gradients (what the update should be)."""
    import keras
    import tensorflow as tf

    import keras_mgpu_plugins as kmp

    init = keras.initializers.RandomNormal(seed=1)

    class PositionEmbedding(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.positions = keras.layers.Embedding(MAXLEN, 4, embeddings_initializer=init)
            self.project = keras.layers.Dense(4, kernel_initializer=keras.initializers.GlorotUniform(2))

        def call(self, x):
            return self.project(x) + self.positions(keras.ops.arange(MAXLEN))

    base = {"sgd": keras.optimizers.SGD, "adam": keras.optimizers.Adam,
            "adamw": keras.optimizers.AdamW, "rmsprop": keras.optimizers.RMSprop}[optimizer]

    class Dense(base):
        def apply(self, grads, trainable_variables=None):
            return super().apply([tf.convert_to_tensor(g) for g in grads], trainable_variables)

    def build():
        if kind == "position":
            inputs = keras.Input((MAXLEN, 3))
            h = PositionEmbedding()(inputs)
        else:
            inputs = keras.Input((MAXLEN,), dtype="int32")
            h = keras.layers.Embedding(VOCAB, 4, embeddings_initializer=init)(inputs)
        h = keras.layers.GlobalAveragePooling1D()(h)
        h = keras.layers.Dense(4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(3))(h)
        outputs = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(4))(h)
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=(Dense if dense else base)(0.05 if optimizer == "sgd" else 0.01),
                      loss="mse")
        return model

    rng = np.random.default_rng(0)
    x = (rng.normal(size=(32, MAXLEN, 3)).astype("float32") if kind == "position"
         else rng.integers(0, VOCAB, size=(32, MAXLEN)).astype("int32"))
    y = rng.normal(size=(32, 1)).astype("float32")
    model = build() if strategy is None else kmp.parallelize(strategy=strategy)(build)()
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return {"weights": model.get_weights(), "history": history.history}


def distiller_factory(optimizer="sgd", with_call=False, steps_per_execution=1):
    """keras.io's knowledge-distillation example, small: its `Distiller(keras.Model)`
    (`tests/programs/knowledge_distillation.py`: own `compile`, `train_step` and `test_step`,
    logging its losses) over small seeded Sequential CNNs. As on keras.io the Distiller has no
    `call()` unless `with_call`."""
    import keras
    from keras import layers

    from tests.programs.knowledge_distillation import Distiller  # the program's, as keras.io

    class DistillerWithCall(Distiller):
        def call(self, x):
            return self.student(x)

    def cnn(name, filters, seed):
        init = keras.initializers.GlorotUniform
        return keras.Sequential([
            keras.Input((8, 8, 1)),
            layers.Conv2D(filters, 3, strides=2, padding="same", kernel_initializer=init(seed)),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(filters, 3, strides=2, padding="same", kernel_initializer=init(seed + 1)),
            layers.Flatten(),
            layers.Dense(3, kernel_initializer=init(seed + 2)),
        ], name=name)

    def build():
        distiller = (DistillerWithCall if with_call else Distiller)(
            student=cnn("student", 4, 20), teacher=cnn("teacher", 8, 10))
        distiller.compile(
            optimizer=keras.optimizers.Adam(0.01) if optimizer == "adam" else keras.optimizers.SGD(0.1),
            metrics=[keras.metrics.SparseCategoricalAccuracy()],
            student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            distillation_loss_fn=keras.losses.KLDivergence(),
            alpha=0.1, temperature=10, steps_per_execution=steps_per_execution)
        return distiller

    return build


def distiller_run(strategy, optimizer="sgd", with_call=False, steps_per_execution=1):
    """fit (with validation) and evaluate of the knowledge-distillation example."""
    import keras_mgpu_plugins as kmp

    rng = np.random.default_rng(11)
    x = rng.normal(size=(64, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 3, size=(64,)).astype("int32")
    model = kmp.parallelize(strategy=strategy)(
        distiller_factory(optimizer, with_call, steps_per_execution))()
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                        validation_data=(x[:32], y[:32]))
    return {"weights": model.get_weights(), "history": history.history,
            "evaluate": model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)}


def unclassified_log_run(strategy):
    """A custom train_step that logs `exp(loss)` of a scaled loss (not a sum of losses times
    constants) beside the loss: the History and the warnings the first fit gave."""
    import warnings

    import keras
    import tensorflow as tf

    import keras_mgpu_plugins as kmp

    class Perplexity(keras.Model):
        def __init__(self):
            super().__init__()
            self.out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(4))

        def call(self, x):
            return self.out(x)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
            return {"mse": loss, "perplexity": keras.ops.exp(loss)}

    def build():
        model = Perplexity()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model

    x, y = make_data()
    model = kmp.parallelize(strategy=strategy)(build)()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return {"history": history.history, "weights": model.get_weights(),
            "warnings": [str(w.message) for w in caught if "keras_mgpu_plugins" in str(w.message)]}
