"""The torch backend: one process per device, data parallel over torch's process group.

Keras 3.10 to 3.15 have no data parallelism in `fit` on torch; keras-nightly 3.16.0.dev
wraps the model in `DistributedDataParallel` where a process group exists
(keras-team/keras#23316). kmp joins the job's process group (torchrun's variables,
`kmp-launch`, SLURM), makes every callback rank-aware through `TorchRuntime`, and, for the
models `@kmp.parallelize` builds, feeds each process its part of every global batch and
keeps one model: upstream's DDP where Keras has it, kmp's own gradient averaging where it
does not (`backends.torch.parallelize`). A model it did not build, in a job whose Keras
would train one model per process, trains apart (`runtime.apart`: its `fit` is refused where
callbacks would act for the job).

The functions below are what the backend-free package asks of a backend
(`keras_mgpu_plugins.backends.current()`); each imports torch only when called.
"""

from __future__ import annotations

from typing import Any


def runtime_of(model: Any = None) -> Any:
    """The runtime of this torch process: its rank in the process group (or the environment's
    plan before one exists); local for a model that trains on this process alone."""
    from keras_mgpu_plugins.backends.torch.runtime import TorchRuntime

    return TorchRuntime.for_model(model)


def saving_in_a_job() -> str:
    """What saving the model takes in a job of several processes on this lane (messages)."""
    return ("every process holds the whole model (one copy per process of torch's process "
            "group), so one process must write it, and the others wait for that write")


def apart(model: Any) -> str | None:
    """Why `model` would train apart from the job's other processes, or `None` (`runtime.apart`)."""
    from keras_mgpu_plugins.backends.torch.runtime import apart as why

    return why(model)


def random_state() -> list[int]:
    """torch's global generators' state (what Keras's `DataLoader` shuffle and an unseeded
    Dropout draw from), as JSON values (`backends.torch.resume`)."""
    from keras_mgpu_plugins.backends.torch import resume

    return resume.random_state()


def set_random_state(state: list[int]) -> None:
    from keras_mgpu_plugins.backends.torch import resume

    resume.set_random_state(state)


def simulate_devices(n: int, memory_limit_mb: int | None = None) -> list[str]:
    """One device per process on torch: several devices are several processes."""
    if n == 1:
        return ["CPU:0"]
    raise NotImplementedError(
        f"kmp.simulate_devices({n}) splits one process's device, but Keras on torch trains on "
        f"one device per process: {n} devices are {n} processes. Run the script as "
        f"`kmp-launch -n {n} train.py` (or `torchrun --nproc-per-node {n} train.py`): on a "
        f"machine without GPUs each process trains on the CPU, over gloo, and @kmp.parallelize "
        "makes them one model.")


def local_device_names() -> tuple[str, ...]:
    """The device this process trains on (`GPU:<LOCAL_RANK>` in a job), or every GPU torch
    sees in one process, or `("CPU:0",)`."""
    from keras_mgpu_plugins.backends.torch.devices import local_device_names as names

    return names()


def gpu_memory() -> Any:
    """This process's GPU and `torch.cuda`'s allocator statistics (`samplers.gpu.GPUMemory`)."""
    from keras_mgpu_plugins.backends.torch.devices import gpu_memory as memory

    return memory()


def read_variable(variable: Any) -> Any:
    """A host copy of a Keras variable's values (torch updates variables in place)."""
    from keras_mgpu_plugins.backends.torch.replica_copies import host_value as read

    return read(variable)


def host_value(variable: Any) -> Any:
    """`variable`'s whole value as a NumPy array, as `get_weights()` gives it."""
    return variable.numpy()


def remote_files() -> Any:
    """Remote paths need TensorFlow's file systems, which the torch lane does not load."""
    from keras_mgpu_plugins.backends import single

    return single.remote_files()


def summary_writer(logdir: str) -> Any:
    """TensorBoard event files need TensorFlow's writer, which the torch lane does not load."""
    from keras_mgpu_plugins.backends import single

    return single.summary_writer(logdir)


def parallelize_factory(factory: Any, *, strategy: Any, devices: Any, require_compiled: bool,
                        micro_batches: Any, sync_batchnorm: bool, layout_map: Any = None,
                        partition: Any = None) -> Any:
    """`kmp.parallelize` over torch's process group (see `backends/torch/parallelize.py`)."""
    from keras_mgpu_plugins.backends.torch.parallelize import parallelize_torch

    return parallelize_torch(factory, strategy, devices, require_compiled, micro_batches,
                             sync_batchnorm, layout_map, partition)


def join_job() -> None:
    """Joins the job's process group before any user code (`kmp-launch` workers,
    `python -m keras_mgpu_plugins.run`)."""
    from keras_mgpu_plugins.backends.torch.group import initialize

    initialize()


def serve_parameter_server(topology: Any) -> None:
    """Parameter servers are TensorFlow's: refused on torch."""
    raise NotImplementedError(
        'TF_CONFIG describes a parameter-server cluster (task type "ps"), which Keras trains on '
        "the TensorFlow backend only; this is the 'torch' backend. Use KERAS_BACKEND=tensorflow, "
        'or remove the "ps" tasks (torch data parallelism: kmp-launch -n N, or torchrun).')


def joined() -> tuple[int, int] | None:
    """`(rank, world size)` of a torch process group of several processes, started by
    whoever (the script's own `init_process_group` included); `None` without one."""
    import sys

    if "torch.distributed" not in sys.modules:
        return None
    from keras_mgpu_plugins.backends.torch import collectives

    index, count = collectives.world()
    return (index, count) if count > 1 else None


def row_span(rows: Any) -> Any:
    """Where this process's `rows` of the global batch start, and the global batch's rows:
    `(offset, total)`, in a job of several processes, else `None` (the processes feed
    contiguous slices in rank order: `backends.torch.feeding`; one all-gather)."""
    import numpy as np

    from keras_mgpu_plugins.backends.torch import collectives

    rank, size = collectives.world()
    if size <= 1:
        return None
    sizes = collectives.gather_numpy(np.array([int(rows)], np.int64)).reshape(-1)
    return int(sizes[:rank].sum()), int(sizes.sum())


def count_step_flops(model: Any, original: Any, args: tuple) -> Any:
    """Runs one train step (`original(*args)`, Keras's train function) and counts its forward
    and backward FLOPs (`_flop_count.FlopCount`): see `backends/torch/flops.py`."""
    from keras_mgpu_plugins.backends.torch.flops import run_and_count

    return run_and_count(model, original, args)


def compute_devices() -> list[str]:
    """What each device of this process is, for its peak FLOP/s (`samplers.peaks`)."""
    from keras_mgpu_plugins.backends.torch.flops import compute_devices as kinds

    return kinds()


def float32_on_tensor_cores() -> bool:
    """Whether float32 matmuls may run on TF32 tensor cores here (their peak for MFU)."""
    from keras_mgpu_plugins.backends.torch.flops import float32_on_tensor_cores as tf32

    return tf32()


def step_pacer() -> None:
    """`None`: Keras's torch step runs eagerly on the host; on a GPU the CUDA queue bounds how far
    it runs ahead, so the mean over an epoch of many steps is the devices' pace."""
    return None


def drop_fed(model: Any, count: int) -> None:
    """`count` batches kmp fed `model` were drawn and not trained (a resumed epoch's first)."""
    from keras_mgpu_plugins.backends.torch import resume

    resume.drop_fed(model, count)
