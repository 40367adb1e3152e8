"""The TensorFlow backend: `tf.distribute` strategies, their collectives, devices, replica
copies, `multi_gpu_model`, model parallel placement and the Keras-on-TensorFlow patches.

The functions below are what the backend-free package asks of a backend
(`keras_mgpu_plugins.backends.current()`); each imports TensorFlow only when called.
"""

from __future__ import annotations

from typing import Any


def runtime_of(model: Any = None) -> Any:
    """The runtime of `model`'s strategy (default: the current strategy)."""
    from keras_mgpu_plugins.backends.tensorflow.runtime import TensorFlowRuntime

    return TensorFlowRuntime.for_model(model)


def saving_in_a_job() -> str:
    """What saving the model takes in a job of several processes on this lane (messages)."""
    return "saving a model under MultiWorkerMirroredStrategy needs every worker"


def apart(model: Any) -> str | None:
    """Why `model` would train apart from the job's other workers, or `None` (`runtime.apart`)."""
    from keras_mgpu_plugins.backends.tensorflow.runtime import apart as why

    return why(model)


def simulate_devices(n: int, memory_limit_mb: int | None = None) -> list[str]:
    """Splits the first GPU (else the CPU) into `n` logical devices."""
    from keras_mgpu_plugins.backends.tensorflow.devices import simulate_devices as split

    return split(n, memory_limit_mb)


def local_device_names() -> tuple[str, ...]:
    """This process's visible GPUs (as split), else its logical CPUs."""
    from keras_mgpu_plugins.backends.tensorflow.local_devices import local_device_names as names

    return names()


def gpu_memory() -> Any:
    """This process's logical GPUs and their allocators (`samplers.gpu.GPUMemory`)."""
    from keras_mgpu_plugins.backends.tensorflow.gpu_allocator import TensorFlowGPUMemory

    return TensorFlowGPUMemory()


def read_variable(variable: Any) -> Any:
    """A snapshot read of a Keras variable: shares its buffer until its next update
    (copy-on-write), so it keeps the values of this moment at no copy."""
    import tensorflow as tf

    return tf.identity(variable.value)  # (keras.ops.convert_to_tensor does not read)


def host_value(variable: Any) -> Any:
    """`variable`'s whole value as a NumPy array, as `get_weights()` gives it."""
    return variable.numpy()


def remote_files() -> Any:
    """`tf.io.gfile`: the file functions that serve `gs://`, `s3://`, `hdfs://` paths."""
    import tensorflow as tf

    return tf.io.gfile


def summary_writer(logdir: str) -> Any:
    """TensorBoard scalars in `logdir`: `write(step, {tag: value})`, `close()` (`tf.summary`)."""
    from keras_mgpu_plugins.backends.tensorflow.tensorboard import ScalarWriter

    return ScalarWriter(logdir)


def parallelize_factory(factory: Any, layout_map: Any = None, **options: Any) -> Any:
    """`kmp.parallelize` under a `tf.distribute` strategy (`layout_map` is JAX's only)."""
    if layout_map is not None:
        raise ValueError(
            "layout_map applies on the JAX backend only (keras.distribution.ModelParallel "
            "shards variables there); TensorFlow's strategy='model_parallel' places whole layer "
            f"calls on devices instead. Received: layout_map={layout_map!r}. Leave layout_map="
            "None and pass devices= (a list, or a mapping of layer-name patterns to devices), "
            "or use KERAS_BACKEND=jax.")
    from keras_mgpu_plugins.backends.tensorflow.parallelize import parallelize as decorate

    return decorate(factory, **options)


def join_job() -> None:
    """Joins the multi-worker job before any user code: creates the process's
    `MultiWorkerMirroredStrategy` (TensorFlow configures collectives only before its
    runtime starts); `kmp.parallelize` then gets this object.

    In a parameter-server cluster a worker or parameter server serves (never returns),
    and the chief joins when its factory is decorated (`ParameterServerStrategy` connects
    at any time, and needs the factory's partitioning)."""
    from keras_mgpu_plugins.backends.tensorflow.strategy import get_strategy
    from keras_mgpu_plugins.cluster.topology import topology

    topo = topology()
    if topo.is_parameter_server_cluster:
        if topo.serves:
            serve_parameter_server(topo)
        return
    get_strategy("multi_worker")


def serve_parameter_server(topo: Any) -> None:
    """Runs this worker's or parameter server's TensorFlow server; never returns."""
    from keras_mgpu_plugins.backends.tensorflow.parameter_server.cluster import serve

    serve(topo)


def joined() -> None:
    """The job this process joined by the script's own means, `(rank, count)` (torch's process
    group only: on this backend the environment and the strategy say it, `None`)."""
    return None


def random_state() -> None:
    """No global generator of this backend's own that Keras's input pipeline draws from."""
    return None


def set_random_state(state: object) -> None:
    """Nothing to give back (`random_state`)."""
    return None


def row_span(rows: Any) -> Any:
    """Where this replica's `rows` of the global batch start, and the global batch's rows:
    `(offset, total)` (tensors), in a replica context of several replicas, else `None`
    (`kmp.parallelize(random_layers="one_device")`; one all-gather of the row counts)."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync <= 1:
        return None
    sizes = context.all_gather(tf.reshape(tf.cast(rows, tf.int32), [1]), axis=0)
    index = context.replica_id_in_sync_group
    return tf.reduce_sum(sizes[:index]), tf.reduce_sum(sizes)


def count_step_flops(model: Any, original: Any, args: tuple) -> Any:
    """Runs one train step (`original(*args)`, Keras's train function) and counts its forward
    and backward FLOPs (`_flop_count.FlopCount`): see `backends/tensorflow/flops.py`."""
    from keras_mgpu_plugins.backends.tensorflow.flops import run_and_count

    return run_and_count(model, original, args)


def compute_devices() -> list[str]:
    """What each device of this process is, for its peak FLOP/s (`samplers.peaks`)."""
    from keras_mgpu_plugins.backends.tensorflow.flops import compute_devices as kinds

    return kinds()


def float32_on_tensor_cores() -> bool:
    """Whether float32 matmuls may run on TF32 tensor cores here (their peak for MFU)."""
    from keras_mgpu_plugins.backends.tensorflow.flops import float32_on_tensor_cores as tf32

    return tf32()


def step_pacer() -> None:
    """`None`: a step of Keras's train function returns when TensorFlow has run it (its host
    executor), the time between steps is the step's own."""
    return None


def drop_fed(model: Any, count: int) -> None:
    """kmp keeps nothing per batch it feeds on this backend."""
