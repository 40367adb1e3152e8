"""Every private Keras, TensorFlow and JAX name kmp touches, with each name's known history.

kmp reaches no internal of Keras, TensorFlow or JAX but through `resolve(key)`: the
patches (`backends/tensorflow/patches/`), the checks (`compat._checks`) and the helpers
(`compat._private`) name what they need by the key of a `PrivateName` below, which
knows where that name lived in each version of its library (a module moved, a class
renamed). A name is looked up first where the installed version should have it, then at
its other known places (a nightly build from before or after a rename); each candidate
must hold the attributes the name is known by (`PrivateName.has`), so a namesake is not
taken for it. Where none is found, `resolve` raises `MissingNameError`, an
`UncheckedVersionError` naming the name, the installed version and every place tried:
never an `AttributeError` from inside kmp. The registry asks `missing()` for every
name a patch wraps before applying it (`compat._versions`), so a missing name is refused
when the strategy is set up (`@kmp.parallelize`, `patch_keras()`), before any training.

A `wraps` entry of a `Patch` is `"<key>.<attribute>"` (`"tensorflow trainer._make_function"`)
or a public dotted path (`"keras.Model.fit"`); `locate` turns either into the object
that owns the attribute and the attribute's name.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any

from packaging.version import Version

from keras_mgpu_plugins.errors import UncheckedVersionError

LIBRARIES = {"keras": "Keras", "tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}


class MissingNameError(UncheckedVersionError):
    """A private name kmp relies on is at none of the places known for it: the installed
    version's internals are not the ones kmp knows."""


@dataclasses.dataclass(frozen=True)
class PrivateName:
    """One private name: where it lived in each version of its library.

    Attributes:
        key: What kmp calls it (`resolve(key)`).
        library: "keras", "tensorflow" or "jax": whose versions `history` gives.
        history: `(first version, dotted path)` pairs, oldest first: from that version
            on (a pre-release counts as its release) the name is at that path.
        has: Attributes the object must have to be this name (a class's methods).
        note: Where a change in `history` was seen (upstream pull request, nightly build).
        needs: Another library its module imports ("jax" for Keras's JAX backend): where
            that one is not installed, the name is not looked for.
    """

    key: str
    library: str
    history: tuple[tuple[str, str], ...]
    has: tuple[str, ...] = ()
    note: str = ""
    needs: str = ""

    def expected_path(self, version: str) -> str:
        """The path `version` should have (the latest entry not newer than its release)."""
        release = Version(Version(version).base_version)
        path = self.history[0][1]
        for since, candidate in self.history:
            if Version(since) <= release:
                path = candidate
        return path

    def candidates(self, version: str) -> list[str]:
        """Where to look on `version`: its expected path, then the others, newest first."""
        first = self.expected_path(version)
        return [first] + [p for _, p in reversed(self.history) if p != first]


_TF_TRAINER = "keras.src.backend.tensorflow.trainer"
_PLUGGABLE = "keras-team/keras#23397 (backend ops moved to backend.<name>.ops), in keras-nightly 3.16.0.dev"
_RENAME = ("seen in keras-nightly 3.16.0.dev2026102704 (Trainer for TensorFlowTrainer, "
           "BaseTrainer for the base Trainer)")


def _k(key: str, path: str, since: str = "3.0.0", **kwargs: Any) -> PrivateName:
    return PrivateName(key, "keras", ((since, path),), **kwargs)


NAMES: tuple[PrivateName, ...] = (
    _k("tensorflow trainer module", _TF_TRAINER, has=("reduce_per_replica",), needs="tensorflow"),
    PrivateName("tensorflow trainer", "keras", (
        ("3.0.0", f"{_TF_TRAINER}.TensorFlowTrainer"), ("3.16.0", f"{_TF_TRAINER}.Trainer")),
        has=("_make_function", "_maybe_symbolic_build", "train_step"), note=_RENAME,
        needs="tensorflow"),
    PrivateName("base trainer", "keras", (
        ("3.0.0", "keras.src.trainers.trainer.Trainer"),
        ("3.16.0", "keras.src.trainers.trainer.BaseTrainer")),
        has=("compile", "_symbolic_build"), note=_RENAME),
    _k("tensorflow epoch iterator", f"{_TF_TRAINER}.TFEpochIterator", has=("_get_iterator",), needs="tensorflow"),
    _k("collective_all_reduce_multi_worker", f"{_TF_TRAINER}._collective_all_reduce_multi_worker", needs="tensorflow"),
    _k("tensorflow optimizer", "keras.src.backend.tensorflow.optimizer.TFOptimizer",
       has=("_backend_apply_gradients", "_all_reduce_sum_gradients"), needs="tensorflow"),
    _k("base optimizer", "keras.src.optimizers.base_optimizer.BaseOptimizer",
       has=("apply_gradients", "_backend_apply_gradients")),
    _k("loss scale optimizer", "keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer",
       has=("_tf_apply",)),
    _k("loss module", "keras.src.losses.loss",
       has=("scale_loss_for_distribution", "unscale_loss_for_distribution", "reduce_values")),
    _k("reduction metrics module", "keras.src.metrics.reduction_metrics", has=("Mean",)),
    _k("tree", "keras.src.tree", has=("map_structure", "flatten")),
    _k("backend variable", "keras.src.backend.Variable"),
    PrivateName("tensorflow variable", "keras", (
        ("3.0.0", "keras.src.backend.tensorflow.core.Variable"),
        ("3.16.0", "keras.src.backend.tensorflow.ops.core.Variable")),
        has=("_initialize",), note=_PLUGGABLE, needs="tensorflow"),
    _k("stateless scope", "keras.src.backend.common.stateless_scope.StatelessScope"),
    _k("stateless scope module", "keras.src.backend.common.stateless_scope",
       has=("in_stateless_scope",)),
    _k("common variable", "keras.src.backend.common.variables.Variable", has=("assign_add",)),
    _k("epoch iterator", "keras.src.trainers.epoch_iterator.EpochIterator",
       has=("_enumerate_iterator",)),
    _k("array data adapter",
       "keras.src.trainers.data_adapters.array_data_adapter.ArrayDataAdapter"),
    _k("tf dataset adapter",
       "keras.src.trainers.data_adapters.tf_dataset_adapter.TFDatasetAdapter"),
    _k("py_dataset adapter module", "keras.src.trainers.data_adapters.py_dataset_adapter",
       has=("init_pool_generator", "OrderedEnqueuer")),
    _k("functional graph", "keras.src.ops.function.Function", has=("_run_through_graph",)),
    _k("saving_lib", "keras.src.saving.saving_lib"),
    _k("legacy h5 format", "keras.src.legacy.saving.legacy_h5_format"),
    _k("io_utils", "keras.src.utils.io_utils"),
    # The active backend's random functions (what Dropout and the random layers call).
    _k("backend random module", "keras.src.backend.random",
       has=("uniform", "normal", "truncated_normal", "randint", "dropout")),
    _k("jax distribution_lib", "keras.src.backend.jax.distribution_lib",
       has=("initialize_rng",), needs="jax"),
    _k("jax trainer module", "keras.src.backend.jax.trainer", has=("_distribute_data",),
       needs="jax"),
    _k("torch trainer module", "keras.src.backend.torch.trainer", has=("TorchEpochIterator",),
       needs="torch"),
    PrivateName("jax variable", "keras", (
        ("3.0.0", "keras.src.backend.jax.core.JaxVariable"),
        ("3.16.0", "keras.src.backend.jax.ops.core.Variable")),
        has=("_direct_assign", "_initialize_layout"), note=_PLUGGABLE, needs="jax"),
    PrivateName("eager context", "tensorflow", (("2.16.0", "tensorflow.python.eager.context"),),
                has=("context", "Context")),
    PrivateName("distributed iterator", "tensorflow", (
        ("2.16.0", "tensorflow.python.distribute.input_lib.DistributedIterator"),)),
    PrivateName("collective strategy", "tensorflow", (
        ("2.16.0", "tensorflow.python.distribute.collective_all_reduce_strategy."
                   "CollectiveAllReduceStrategy"),), has=("__init__",)),
    PrivateName("per replica spec", "tensorflow", (
        ("2.16.0", "tensorflow.python.distribute.values.PerReplicaSpec"),)),
    PrivateName("numpy_function registry", "tensorflow", (
        ("2.16.0", "tensorflow.python.ops.script_ops.FuncRegistry"),), has=("_convert",)),
    PrivateName("sharded variable", "tensorflow", (
        ("2.16.0", "tensorflow.python.distribute.sharded_variable.ShardedVariable"),),
        has=("variables",)),
    PrivateName("maybe_merge_call", "tensorflow", (
        ("2.16.0", "tensorflow.__internal__.distribute.interim.maybe_merge_call"),)),
    PrivateName("jax xla_bridge", "jax", (("0.4.30", "jax._src.xla_bridge"),),
                has=("backends_are_initialized",)),
    PrivateName("jax distributed", "jax", (("0.4.30", "jax._src.distributed"),),
                has=("global_state",)),
)
BY_KEY = {name.key: name for name in NAMES}


def library_version(library: str) -> str:
    """The installed version of "keras", "tensorflow", "jax" or "torch" (without a local
    build tag: torch's "2.13.0+cpu" is "2.13.0").

    Raises:
        ImportError: The library is not installed.
    """
    return str(importlib.import_module(library).__version__).split("+")[0]


def _installed(library: str) -> str | None:
    try:
        return library_version(library)
    except ImportError:
        return None


@functools.cache
def _split(path: str) -> tuple[str, tuple[str, ...]] | None:
    """`path` as (its longest importable module, the attributes after it); `None` if none."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return ".".join(parts[:cut]), tuple(parts[cut:])
    return None


def _walk(path: str) -> Any:
    """The object at dotted `path`, read afresh (a patch may have replaced it)."""
    split = _split(path)
    if split is None:
        raise AttributeError(f"nothing importable in {path!r}")
    obj = importlib.import_module(split[0])
    for attribute in split[1]:
        obj = getattr(obj, attribute)
    return obj


def find(key: str) -> tuple[str, Any] | None:
    """Where the name `key` is on the installed version, and what: `None` if at no known place."""
    name = BY_KEY[key]
    version = _installed(name.library)
    if version is None or not available(key):
        return None
    for path in name.candidates(version):
        try:
            found = _walk(path)
        except (AttributeError, ImportError):
            continue
        if all(hasattr(found, attribute) for attribute in name.has):
            return path, found
    return None


def available(key: str) -> bool:
    """Whether the libraries `key`'s module needs are installed (else it is not looked for)."""
    import importlib.util

    name = BY_KEY[key]
    return all(importlib.util.find_spec(lib) is not None for lib in (name.library, name.needs) if lib)


def resolve(key: str) -> Any:
    """The object the private name `key` is on the installed version.

    Raises:
        MissingNameError: It is at none of its known places (naming them and the version).
        KeyError: `key` is no registered name.
    """
    found = find(key)
    if found is None:
        raise MissingNameError(missing_message(key))
    return found[1]


def path_of(key: str) -> str | None:
    """The dotted path `key` resolves to on the installed version (`None`: missing)."""
    found = find(key)
    return None if found is None else found[0]


def missing_message(key: str) -> str:
    name = BY_KEY[key]
    library = LIBRARIES[name.library]
    version = _installed(name.library) or "(not installed)"
    tried = ", ".join(f"{path} ({library} {since}+)" for since, path in name.history)
    needs = f" with {', '.join(name.has)}" if name.has else ""
    return (f"keras_mgpu_plugins relies on private {library} API that {library} {version} does "
            f"not have: {key!r}{needs}, looked for at {tried}. kmp does not know this "
            f"{library}'s internals: install a {library} version kmp was checked for "
            "(python -m keras_mgpu_plugins.compat lists them), or report it with this message.")


def locate(entry: str) -> tuple[Any, str]:
    """The object owning the attribute a `wraps` entry names, and the attribute's name.

    Raises:
        MissingNameError: For a registered name that is missing, or an owner without it.
    """
    owner_path, attribute = entry.rsplit(".", 1)
    head, _, rest = owner_path.partition(".")
    try:
        if head in BY_KEY:
            owner = resolve(head)
            for part in rest.split(".") if rest else ():
                owner = getattr(owner, part)
        else:
            owner = _walk(owner_path)
    except (AttributeError, ImportError) as err:
        raise MissingNameError(f"keras_mgpu_plugins wraps {entry}, which is not there: "
                               f"{err}") from err
    if not hasattr(owner, attribute):
        raise MissingNameError(
            f"keras_mgpu_plugins wraps {entry}: {getattr(owner, '__name__', owner)} (at "
            f"{path_of(head) or owner_path if head in BY_KEY else owner_path}) has no attribute {attribute!r} on the "
            "installed versions.")
    return owner, attribute


def checkable(entry: str) -> bool:
    """Whether a `wraps` entry names a place (a registered name's, or a public path)."""
    head = entry.split(".", 1)[0]
    return head in BY_KEY or head in LIBRARIES


def missing(*entries: str) -> list[str]:
    """What of `entries` (keys, or `wraps` entries) the installed versions lack, said in full."""
    problems = []
    for entry in entries:
        try:
            resolve(entry) if entry in BY_KEY else locate(entry)
        except MissingNameError as err:
            problems.append(str(err))
    return problems
