"""From a topology to a `tf.distribute` strategy: one per process.

TensorFlow allows one collective (multi-worker) strategy per process, and it must
be created before the runtime starts. This module creates strategies on demand,
remembers the one it made, and hands the same object to every caller.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from keras_mgpu_plugins import _same_callbacks, _worker_output
from keras_mgpu_plugins.backends.tensorflow import collective, same_calls
from keras_mgpu_plugins.backends.tensorflow import local_devices as _local_devices
from keras_mgpu_plugins.backends.tensorflow import rank as _rank
from keras_mgpu_plugins.backends.tensorflow.patches import one_strategy
from keras_mgpu_plugins.backends.tensorflow.ports import check_own_port_free as _check_own_port_free
from keras_mgpu_plugins.cluster.topology import PS_REFUSAL, Topology, topology
from keras_mgpu_plugins.errors import StrategyError  # noqa: F401 - kmp.strategy.StrategyError

STRATEGY_NAMES = ("auto", "mirrored", "multi_worker", "default", "parameter_server")
#: What `@kmp.parallelize(strategy=...)` takes by name on TensorFlow: the names above, and
#: the two that place the model over devices (`backends.tensorflow.parallelize`).
PARALLELIZE_NAMES = (*STRATEGY_NAMES, "model_parallel", "hybrid")

_lock = threading.Lock()
_strategies: dict[tuple, Any] = {}


def resolve_name(spec: str, topo: Topology) -> str:
    """The concrete strategy name for `spec` (`"auto"` resolved) on `topo`.

    Args:
        spec: One of `STRATEGY_NAMES`.
        topo: The process's topology.

    Returns:
        `"parameter_server"`, `"multi_worker"`, `"mirrored"` or `"default"`.

    Raises:
        ValueError: If `spec` is not a known name; an all-reduce strategy on a cluster with
            parameter servers; `"parameter_server"` on a cluster without them.
    """
    if spec not in STRATEGY_NAMES:
        raise ValueError(
            f"strategy must be one of {list(STRATEGY_NAMES)} or a tf.distribute.Strategy "
            f"instance. Received: strategy={spec!r}"
        )
    if topo.is_parameter_server_cluster and spec in ("mirrored", "multi_worker"):
        raise ValueError(PS_REFUSAL.format(strategy=spec)
                         + f" Received: strategy={spec!r}, ps={list(topo.cluster_spec['ps'])!r}")
    if spec == "parameter_server" and not topo.is_parameter_server_cluster:
        from keras_mgpu_plugins.backends.tensorflow.parameter_server.cluster import no_cluster_error

        raise no_cluster_error(topo)
    if spec != "auto":
        return spec
    if topo.is_parameter_server_cluster:
        return "parameter_server"
    if topo.is_multi_worker:
        return "multi_worker"
    if topo.num_local_devices > 1:  # several GPUs, or a CPU split by simulate_devices
        return "mirrored"
    return "default"


def get_strategy(spec: Any = "auto", devices: Sequence[str] | None = None,
                 partition: Any = None) -> Any:
    """Returns the process's strategy for `spec`, creating it on first use.

    Args:
        spec: `"auto"`, `"mirrored"`, `"multi_worker"`, `"default"`,
            `"parameter_server"`, or a `tf.distribute.Strategy` (returned as is).
        devices: For `"mirrored"`, the devices to replicate on (default: every
            local GPU, else every logical CPU device).
        partition: For `"parameter_server"`: how variables are split over the
            parameter servers (`cluster.partition.Partition`; default: its defaults).

    Returns:
        A `tf.distribute.Strategy`.

    Raises:
        ValueError: For an unknown name or devices given to another strategy.
        StrategyError: If a multi-worker strategy is asked for after
            TensorFlow's runtime started, or beside another collective strategy.
    """
    import tensorflow as tf

    from keras_mgpu_plugins import compat

    if not isinstance(spec, str):
        check_instance(spec, devices)
        from keras_mgpu_plugins.backends.tensorflow.parameter_server import cluster

        if cluster.is_parameter_server(spec):
            cluster.adopt(spec)  # a coordinator, and kmp's fit for its models
            collective.note_strategy(spec)
            return spec
        multi_worker = isinstance(spec, tf.distribute.MultiWorkerMirroredStrategy)
        if multi_worker or compat.distributing(spec):  # even one worker: the fixes below
            compat.check_keras_for_distribution()
        if multi_worker:
            compat.patch_keras()  # the user's own strategy needs the same Keras fixes
            _worker_output.install()  # progress bars on the chief only
            _same_callbacks.install()
            same_calls.install()  # fit/evaluate/predict on one worker alone: an error, no hang
        collective.note_strategy(spec)  # the rank source now; raises if the env disagrees
        return spec
    name = resolve_name(spec, topology())
    if devices is not None and name != "mirrored":
        raise ValueError(
            f"devices only applies to the mirrored strategy, but strategy={spec!r} "
            f"resolves to {name!r}. Received: devices={list(devices)!r}"
        )
    if name != "default":
        compat.check_keras_for_distribution()
    if name == "parameter_server":
        from keras_mgpu_plugins.backends.tensorflow.parameter_server import cluster
        from keras_mgpu_plugins.cluster.partition import Partition

        partition = partition if partition is not None else Partition()
        with _lock:
            key = ("parameter_server", None)
            if key not in _strategies:
                _strategies[key] = cluster.create_strategy(topology(), partition)
        cluster.check_same_partition(_strategies[key], partition)
        collective.note_strategy(_strategies[key])
        return _strategies[key]
    with _lock:
        # One strategy per device set: two MirroredStrategy objects over the same
        # devices collide in TensorFlow's collective instance keys.
        key = (name, _canonical(_mirrored_devices(devices)) if name == "mirrored" else None)
        if key not in _strategies:
            _strategies[key] = _create(name, key[1])
    collective.note_strategy(_strategies[key])
    return _strategies[key]


def hybrid_strategy() -> Any:
    """The multi-worker strategy of `strategy="hybrid"`: one replica per worker.

    Its replica runs on the worker's first GPU (else its CPU); `kmp.parallelize` places
    the model's layers over the worker's devices itself. Created on first use (before
    TensorFlow's runtime starts) and then shared like `get_strategy("multi_worker")`.

    Raises:
        StrategyError: If this process already has a multi-worker strategy with several
            replicas per worker (e.g. made by `kmp.launch` on a machine with several GPUs).
    """
    import tensorflow as tf

    from keras_mgpu_plugins import compat

    compat.check_keras_for_distribution()
    with _lock:
        key = ("multi_worker", None)
        if key not in _strategies:
            own = collective.workers_strategy(None)
            if own is not None or compat.collective_ops_configured():
                raise StrategyError(
                    "strategy='hybrid' makes its own multi-worker strategy (one replica per "
                    "worker, the model placed over the worker's devices), but this process "
                    "already has a multi-worker strategy"
                    + (f" of your own ({type(own).__name__})" if own is not None else "")
                    + ". TensorFlow allows one per process: drop yours and let "
                    "@kmp.parallelize(strategy='hybrid') create it."
                )
            _strategies[key] = _create_multi_worker(tf, one_replica=True)
        strategy = _strategies[key]
    local = _rank.replicas_per_worker(strategy)
    if local != 1:
        raise StrategyError(
            "strategy='hybrid' needs a multi-worker strategy with one replica per worker, but "
            f"this process already has one with {local} replicas per worker "
            f"({list(strategy.extended.worker_devices)}), made before the factory was "
            "decorated. Launch with kmp.launch(..., create_strategy=False) or kmp-launch "
            "--no-strategy, so that @kmp.parallelize(strategy='hybrid') creates it."
        )
    collective.note_strategy(strategy)
    return strategy


def check_instance(spec: Any, devices: Sequence[str] | None,
                   names: Sequence[str] = STRATEGY_NAMES) -> None:
    """Raises unless `spec` is a `tf.distribute.Strategy` instance given without `devices`.

    The error lists `names` as the valid names (`PARALLELIZE_NAMES` for `kmp.parallelize`).
    """
    import tensorflow as tf

    if not isinstance(spec, tf.distribute.Strategy):
        hint = (f" Did you mean {spec.__name__}() (an instance)?"
                if isinstance(spec, type) and issubclass(spec, tf.distribute.Strategy) else "")
        raise ValueError(
            f"strategy must be one of {list(names)} or a tf.distribute.Strategy "
            f"instance. Received: strategy={spec!r} of type {type(spec).__name__}.{hint}"
        )
    if devices is not None:
        raise ValueError(
            "devices only applies to a strategy that parallelize creates (\"mirrored\"); "
            f"a {type(spec).__name__} instance already has its devices. Received: "
            f"devices={list(devices)!r}"
        )


def _create(name: str, devices: tuple[str, ...] | None) -> Any:
    import tensorflow as tf

    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(devices=list(devices))
    return _create_multi_worker(tf)


def _canonical(devices: Sequence[str]) -> tuple[str, ...]:
    """Device names in one spelling (`/cpu:0` → `/device:CPU:0`), in order."""
    return tuple(_local_devices.device_spec(device).to_string() for device in devices)


def _mirrored_devices(devices: Sequence[str] | None) -> list[str]:
    if devices is not None:
        devices = list(devices)
        if not devices:
            raise ValueError("devices must name at least one device. Received: devices=[]")
        return devices
    return _local_devices.replica_devices()


def _create_multi_worker(tf: Any, one_replica: bool = False) -> Any:
    from keras_mgpu_plugins import compat

    existing = [k for k in _strategies if k[0] == "multi_worker"]
    if existing:  # pragma: no cover - guarded by the cache key
        return _strategies[existing[0]]
    topo = topology()
    if topo.source == "keras":
        raise StrategyError(
            "KERAS_DISTRIBUTION_NUM_PROCESSES / _PROCESS_ID describe a JAX job (what "
            "keras.distribution.initialize reads); TensorFlow's multi-worker strategy reads "
            "TF_CONFIG or SLURM. On the TensorFlow backend start the job with kmp-launch, "
            "srun, or a TF_CONFIG per worker; or set KERAS_BACKEND=jax.")
    if one_replica and topo.is_multi_worker:  # hybrid: the first GPU (else the CPU) only
        gpus = tf.config.list_physical_devices("GPU")
        resolver = _slurm_resolver(tf, topo, {"GPU": 1} if gpus else None)
    elif topo.source == "slurm":
        resolver = _slurm_resolver(tf, topo)
    else:
        resolver = None  # TF_CONFIG, read by TF itself; or one worker.
    _check_own_port_free(topo)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    except RuntimeError as err:
        if "must be configured at program startup" in str(err) or "initialized" in str(err):
            raise StrategyError(
                "The multi-worker strategy must be created before TensorFlow runs its "
                "first operation (TensorFlow: 'Collective ops must be configured at "
                "program startup'), and this process already ran one (a tensor, a "
                "layer's adapt, an image resize, a tf.data pipeline) before "
                "@kmp.parallelize created it. Start each worker with "
                f"`python -m keras_mgpu_plugins.run {_script_hint()}` (under SLURM: "
                "`srun python -m keras_mgpu_plugins.run ...`): it creates the strategy "
                "before your script runs, as kmp-launch does, and the script stays as it "
                "is. Or apply @kmp.parallelize(...) to your model factory at module level, "
                "before any TensorFlow work."
            ) from err
        raise
    if not one_replica:  # the process's one: a script's own MultiWorkerMirroredStrategy()
        one_strategy.share(strategy)  # gets it (patches/one_strategy.py)
    compat.patch_keras()
    _worker_output.install()  # progress bars on the chief only (before: wrapped by the next)
    _same_callbacks.install()  # every worker's fit checks its kmp callbacks against the others'
    same_calls.install()  # then, outside it: every worker makes the same fit/evaluate/predict
    return strategy


def _script_hint() -> str:
    """`train.py args`: how this process's script was started, for the error message."""
    import os
    import shlex
    import sys

    if not sys.argv or sys.argv[0] in ("", "-c", "-"):
        return "train.py ..."
    return shlex.join([os.path.basename(sys.argv[0]), *sys.argv[1:]])


def _slurm_resolver(tf: Any, topo: Topology, accelerators: dict | None = None) -> Any:
    """A resolver of `topo`'s cluster (SLURM's, or TF_CONFIG's for `"hybrid"`)."""
    spec = tf.train.ClusterSpec({k: list(v) for k, v in topo.cluster_spec.items()})
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type=topo.task_type, task_id=topo.task_index, rpc_layer="grpc",
        num_accelerators=accelerators,
    )


def reset_for_tests() -> None:
    """Forgets the cached strategies (a collective one cannot really be undone)."""
    with _lock:
        _strategies.clear()
    collective.forget_for_tests()
    one_strategy.forget_for_tests()
