"""TensorFlow patch: one multi-worker strategy per process, the one kmp made.

`kmp-launch` and the scheduler runner (`python -m keras_mgpu_plugins.run`) make each
worker's `MultiWorkerMirroredStrategy` before the user's script runs (TensorFlow needs it
before the first operation). A script written for TensorFlow's tutorial then makes its
own, `tf.distribute.MultiWorkerMirroredStrategy()`: a second collective strategy in the
process, whose group and instance keys start where the first's did. Its first all-reduce
then hangs now and then on every worker (1 run in 4 to 6 on 2 workers here, TensorFlow
2.16 and 2.21), as two MirroredStrategy objects over the same devices collide.

Patched, constructing `MultiWorkerMirroredStrategy` in a process where kmp already made
its multi-worker strategy returns that strategy, when the arguments ask for the same
thing: no arguments, or a cluster resolver describing the same cluster and task, and
communication options equal to kmp's. Other arguments are refused (`StrategyError`),
naming them and what works instead. Before kmp made one, construction is TensorFlow's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.errors import StrategyError

_shared: list[Any] = []  # the multi-worker strategy kmp made in this process (`share`)


def patch_one_multi_worker_strategy() -> Callable[[], None]:
    cls = resolve("collective strategy")  # tf.distribute.MultiWorkerMirroredStrategy
    original_new, original_init = cls.__dict__.get("__new__"), cls.__init__

    def __new__(klass, *args, **kwargs):
        if klass is cls:
            shared = _kmp_strategy(cls)
            if shared is not None:
                _check_same(shared, args, kwargs)
                return shared
        if original_new is not None:
            return original_new(klass, *args, **kwargs)
        return super(cls, klass).__new__(klass)

    def __init__(self, *args, **kwargs):
        if any(self is made for made in _shared):
            return  # kmp's, already made: returned as it is
        original_init(self, *args, **kwargs)

    __new__._kmp_one_strategy = True
    cls.__new__, cls.__init__ = __new__, __init__

    def undo() -> None:
        cls.__init__ = original_init
        if original_new is None:
            del cls.__new__
        else:
            cls.__new__ = original_new

    return undo


def constructs_anew() -> bool:
    """Whether TensorFlow makes a new collective strategy at every construction (it does:
    nothing in it looks for one the process already has)."""
    new = resolve("collective strategy").__dict__.get("__new__")
    return new is None or getattr(new, "_kmp_one_strategy", False)  # none, or this patch's


def share(strategy: Any) -> None:
    """Makes `strategy`, the multi-worker strategy kmp made, the process's one."""
    _shared[:] = [strategy]


def forget_for_tests() -> None:
    """Forgets the process's strategy (as `strategy.reset_for_tests` forgets its cache)."""
    _shared.clear()


def _kmp_strategy(cls: type) -> Any | None:
    return next((made for made in _shared if type(made) is cls), None)


def _check_same(shared: Any, args: tuple, kwargs: dict) -> None:
    """Raises `StrategyError` unless the arguments ask for `shared`'s cluster and options."""
    names = ("cluster_resolver", "communication_options")
    given = {**dict(zip(names, args, strict=False)), **kwargs}
    unknown = sorted(set(given) - set(names)) + (["(more positional arguments)"]
                                                 if len(args) > len(names) else [])
    differs = list(unknown)
    resolver = given.get("cluster_resolver")
    if resolver is not None and not _same_cluster(resolver, shared.cluster_resolver):
        differs.append("cluster_resolver")
    options = given.get("communication_options")
    if options is not None and options.__dict__ != shared.extended._communication_options.__dict__:
        differs.append("communication_options")
    if differs:
        raise StrategyError(
            "This worker already has its tf.distribute.MultiWorkerMirroredStrategy, made by "
            "kmp-launch (or `python -m keras_mgpu_plugins.run`) before your script ran, and "
            "TensorFlow cannot run a second one in the process (its first all-reduce can "
            f"hang). MultiWorkerMirroredStrategy() with these arguments asks for another: "
            f"{', '.join(differs)}. Make it without them to get the worker's strategy, or "
            "start the job with `kmp-launch --no-strategy` (`kmp.launch(..., "
            "create_strategy=False)`) to make your own.")


def _same_cluster(resolver: Any, shared: Any) -> bool:
    try:
        return (resolver.cluster_spec().as_dict() == shared.cluster_spec().as_dict()
                and (resolver.task_type, resolver.task_id) == (shared.task_type,
                                                               shared.task_id))
    except (AttributeError, ValueError, RuntimeError):
        return False
