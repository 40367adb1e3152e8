"""The parameter-server cluster: the chief's strategy and coordinator, the servers' loop.

In a cluster with `"ps"` tasks (`TF_CONFIG`, `kmp-launch --ps`), each task plays one part:

- the `"chief"` runs the user's script. `create_strategy` connects it to the cluster as
  TensorFlow's coordinator (`ParameterServerStrategy`, then a `ClusterCoordinator`): the
  variables a factory creates in the strategy's scope live on the parameter servers, and
  kmp's `fit` sends the model's steps to the workers (`parameter_server.fit`);
- every `"worker"` and `"ps"` task runs TensorFlow's server and nothing else (`serve`):
  the workers run the steps the coordinator sends them, the parameter servers hold the
  variables (on their CPU: TensorFlow's advice). They never run user code, so the same
  script serves every task of a TFJob: `@kmp.parallelize` (or `python -m
  keras_mgpu_plugins.run`) on such a task serves and never returns.

The chief waits for the servers while it connects (TensorFlow retries), so the tasks
may start in any order.
"""

from __future__ import annotations

import sys
from typing import Any

from keras_mgpu_plugins.cluster.topology import Topology


def is_parameter_server(strategy: Any) -> bool:
    """Whether `strategy` is TensorFlow's `tf.distribute.experimental.ParameterServerStrategy`."""
    if "tensorflow" not in sys.modules:
        return False
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def no_cluster_error(topo: Topology) -> ValueError:
    """The error for `strategy="parameter_server"` where the job has no parameter servers."""
    where = (f"TF_CONFIG lists {sorted(topo.cluster_spec)}" if topo.cluster_spec
             else "this process is not part of a cluster (no TF_CONFIG)")
    return ValueError(
        'strategy="parameter_server" needs a cluster with parameter servers: a "chief" that '
        'coordinates, "worker" tasks that run the steps and "ps" tasks that hold the variables, '
        f"but {where}. Received: strategy='parameter_server'. Start the job with "
        "`kmp-launch -n 2 --ps 1 train.py` (or kmp.launch(fn, num_workers=2, num_ps=1)), or "
        'give every task a TF_CONFIG with "chief", "worker" and "ps" tasks (docs/'
        "parameter_server.md); on one machine without a cluster, use strategy=\"auto\".")


def create_strategy(topo: Topology, partition: Any) -> Any:
    """Connects this chief to the cluster: its `ParameterServerStrategy` and coordinator.

    Raises:
        ValueError: If this task is not the chief (workers and parameter servers serve).
    """
    import tensorflow as tf

    if topo.task_type != "chief":
        raise ValueError(
            f'Only the "chief" task of a parameter-server cluster creates the strategy; this is '
            f"task {topo.task_type!r} {topo.task_index}, which serves (kmp.parallelize and "
            "python -m keras_mgpu_plugins.run start its server). Received: TF_CONFIG task "
            f"{{'type': {topo.task_type!r}, 'index': {topo.task_index}}}")
    spec = tf.train.ClusterSpec({k: list(v) for k, v in topo.cluster_spec.items()})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=make_partitioner(partition, topo.num_ps))
    strategy._kmp_partition = partition  # what check_same_partition compares
    adopt(strategy)
    return strategy


def make_partitioner(partition: Any, num_ps: int) -> Any:
    """TensorFlow's partitioner for `partition` (`cluster.partition.Partition`) over `num_ps`
    parameter servers, or `None` (no variable split)."""
    import tensorflow as tf

    from keras_mgpu_plugins.cluster.partition import DEFAULT_MIN_SHARD_BYTES

    if partition.variable_partitioner is None:
        return None
    if partition.variable_partitioner != "auto":
        return partition.variable_partitioner
    return tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=partition.min_shard_bytes or DEFAULT_MIN_SHARD_BYTES,
        max_shards=partition.max_shards or num_ps)


#: The `kmp.compat` records a parameter-server strategy needs (`patches.parameter_server`,
#: `patches.sharded`).
RECORDS = ("atomic_variable_updates", "parameter_server_methods", "partitioned_initialization",
           "sharded_embedding_lookup", "sharded_gradient_sources", "sharded_optimizer_updates",
           "sharded_optimizer_slots")


def adopt(strategy: Any) -> Any:
    """Makes `strategy` kmp's: its coordinator, and kmp's `fit`/`evaluate`/`predict` for the
    models built in its scope, with their partitioned variables (`RECORDS`). Returns the
    coordinator."""
    from keras_mgpu_plugins.compat import _registry

    for name in RECORDS:
        _registry.apply(name)
    return coordinator_of(strategy)


def coordinator_of(strategy: Any) -> Any:
    """The `ClusterCoordinator` of `strategy` (TensorFlow keeps one per strategy)."""
    import tensorflow as tf

    return tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)


def num_workers() -> int:
    """The workers of the cluster this chief is connected to (their devices, as TensorFlow
    lists them once connected)."""
    return max(1, _tasks_of("worker"))


def num_ps() -> int:
    """The parameter servers of the cluster this chief is connected to."""
    return _tasks_of("ps")


def _tasks_of(job: str) -> int:
    import tensorflow as tf

    return len({d.name.split("/device:")[0] for d in tf.config.list_logical_devices()
                if f"/job:{job}/" in d.name})


def check_same_partition(strategy: Any, partition: Any) -> None:
    """Raises if a second factory asks for other shards than the strategy was made with."""
    made = getattr(strategy, "_kmp_partition", None)
    if made is not None and made.key() != partition.key():
        raise ValueError(
            "This process's ParameterServerStrategy was created by a first factory with "
            f"{made.describe()}; TensorFlow allows one per process (it connects the process to "
            f"the cluster), so another factory cannot ask for {partition.describe()}. Received: "
            f"{partition.describe()}. Give every @kmp.parallelize(strategy='parameter_server') "
            "of the script the same variable_partitioner, min_shard_bytes and max_shards.")


def serve(topo: Topology) -> None:
    """Runs this worker's or parameter server's TensorFlow server until the process ends.

    A worker gets at least 2 inter-op threads (`TF_NUM_INTEROP_THREADS=1` makes its first
    step wait forever). A parameter server hides its GPUs (variables stay in host memory, as TensorFlow
    advises); a worker lets its GPU memory grow, so that several workers can share one
    GPU. Never returns: the launcher (or the cluster manager) ends the process.
    """
    import os

    import tensorflow as tf

    from keras_mgpu_plugins.backends.tensorflow.ports import check_own_port_free
    from keras_mgpu_plugins.launch._tuning import MIN_PARAMETER_SERVER_INTEROP

    check_own_port_free(topo, force=True)
    interop = os.environ.get("TF_NUM_INTEROP_THREADS", "").strip()
    if topo.task_type == "worker" and interop.isdigit() and 0 < int(interop) < 2:
        # One inter-op thread: the first step sent here would wait forever (measured).
        tf.config.threading.set_inter_op_parallelism_threads(MIN_PARAMETER_SERVER_INTEROP)
    gpus = tf.config.list_physical_devices("GPU")
    if topo.task_type == "ps" and gpus:
        tf.config.set_visible_devices([], "GPU")
    else:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
    spec = tf.train.ClusterSpec({k: list(v) for k, v in topo.cluster_spec.items()})
    server = tf.distribute.Server(spec, job_name=topo.task_type, task_index=topo.task_index,
                                  protocol="grpc", start=True)
    print(f"kmp: {topo.task_type} {topo.task_index} of the parameter-server cluster serves at "
          f"{topo.cluster_spec[topo.task_type][topo.task_index]}", file=sys.stderr, flush=True)
    server.join()
    sys.exit(0)  # pragma: no cover - join returns only when TensorFlow stops the server
