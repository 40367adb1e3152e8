"""Ray Train: who the worker is, and Ray's preemption notice as a stop request. No backend import.

Ray Train runs the training function in a thread of each worker actor, where Python cannot
install a signal handler. From Ray 2.60 a worker learns that a node of its group is being
preempted (a spot node reclaimed, a drained node) from `ray.train.get_preemption_info()`:
`BackupAndRestore` asks it at each of its checks (every worker at the same step: Ray's call is
a barrier over the group and answers rank 0's view, so every worker gets the same answer; the
question's time counts in the check's cost, which spaces the checks so that they take at most
0.5% of training, at most `stop_check_interval` apart), and a notice is taken as a SIGTERM is
elsewhere: every worker stops at one agreed step, the backup holds it, `fit` raises
`TrainingStopped` (exit code 75), and Ray starts the group again (`FailureConfig`), which
resumes from the backup.

`world()` says whether this process is a Ray Train worker of several, for the checks of
`kmp.parallelize` (a Ray trainer whose workers kmp would not see as one job).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

#: Ray is asked at every n-th of `BackupAndRestore`'s checks (default 1: each; they are at most
#: `stop_check_interval` apart, spaced by their measured cost).
CHECK_EVERY_ENV = "KMP_RAY_PREEMPTION_CHECK_EVERY"


def check_every(environ: Any = None) -> int:
    """`KMP_RAY_PREEMPTION_CHECK_EVERY` (default 1), refused unless a whole number >= 1."""
    raw = (os.environ if environ is None else environ).get(CHECK_EVERY_ENV, "1")
    try:
        every = int(raw)
    except ValueError:
        every = 0
    if every < 1:
        raise ValueError(f"{CHECK_EVERY_ENV} must be a whole number >= 1 (1: Ray's preemption "
                         f"notice is asked at each of BackupAndRestore's checks). Received: "
                         f"{CHECK_EVERY_ENV}={raw!r}")
    return every


def world() -> tuple[int, int] | None:
    """`(world size, rank)` of this Ray Train worker; `None` outside one (Ray is never imported
    here: a process that has not imported Ray Train is none)."""
    if "ray.train" not in sys.modules:
        return None
    try:
        import ray.train

        context = ray.train.get_context()
        return int(context.get_world_size()), int(context.get_world_rank())
    except Exception:  # noqa: BLE001 - not in a Ray Train worker (Ray raises RuntimeError)
        return None


def watch_preemption() -> Callable[[], None] | None:
    """In a Ray Train worker thread with Ray's preemption notice (Ray >= 2.60): asks it from now
    on at `BackupAndRestore`'s checks (`_stop_signals.watch`); returns the undo. `None` elsewhere."""
    if threading.current_thread() is threading.main_thread() or world() is None:
        return None
    import ray.train

    ask = getattr(ray.train, "get_preemption_info", None)
    if ask is None:
        return None
    from keras_mgpu_plugins import _stop_signals

    every = check_every()
    checks = [0]

    def notice() -> str | None:
        checks[0] += 1
        if checks[0] % every:
            return None
        info = ask()
        if info is None:
            return None
        return (f"Ray's preemption notice (ranks {info.preempted_ranks} on the preempted "
                f"node(s), deadline {info.deadline_ms} ms)")

    return _stop_signals.watch(notice)


def refusal(world_size: int, rank: int, num_workers: int, backend: str,
            torch_group: bool) -> str | None:
    """Why `kmp.parallelize` must not go on in this Ray Train worker (a pure decision), or None.

    Args:
        world_size: Ray Train's world size; rank: this worker's.
        num_workers: The workers kmp sees (`kmp.topology()`).
        backend: Keras's backend.
        torch_group: Whether a torch process group is initialised (Ray's TorchTrainer's).
    """
    if world_size <= 1:
        return None
    where = f"This is worker {rank} of a Ray Train group of {world_size}"
    if torch_group and backend != "torch":
        return (f"{where} whose workers Ray's TorchTrainer joined in a torch process group, but "
                f"Keras runs on {backend}: kmp would not train one model over them. Set "
                "KERAS_BACKEND=torch for the workers (ray.init(runtime_env={'env_vars': "
                "{'KERAS_BACKEND': 'torch'}}), with torch installed: pip install -e "
                "\".[torch,ray]\"), or use TensorflowTrainer (TF_CONFIG) for Keras on "
                "TensorFlow or JAX.")
    if num_workers != world_size:
        return (f"{where}, but kmp sees {num_workers} worker(s): nothing tells it the job (no "
                "TF_CONFIG, no WORLD_SIZE/RANK, no torch process group), so each worker would "
                "train a model of its own. Ray's TensorflowTrainer sets TF_CONFIG (Keras on "
                "TensorFlow, or JAX: pip install -e \".[tensorflow,ray]\"); its TorchTrainer a "
                "torch process group (KERAS_BACKEND=torch: pip install -e \".[torch,ray]\"). "
                "Ray 2.60's JaxTrainer starts jax.distributed on TPUs and GPUs only "
                "(JaxConfig(use_tpu=True) or ScalingConfig(use_gpu=True)), not on CPUs.")
    return None


def check_job(num_workers: int, backend: str) -> None:
    """Raises `ValueError` in a Ray Train worker whose group kmp would not train as one job."""
    found = world()
    if found is None:
        return
    distributed = sys.modules.get("torch.distributed")
    torch_group = bool(distributed is not None and distributed.is_available()
                       and distributed.is_initialized())
    reason = refusal(*found, num_workers, backend, torch_group)
    if reason is not None:
        raise ValueError(f"kmp.parallelize: {reason}")
