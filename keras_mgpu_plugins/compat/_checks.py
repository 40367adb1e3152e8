"""The checks behind `PRIVATE_USES` and `PATCHES`: what Keras still has, by name, signature, source.

Each function returns what is missing or changed (an empty list when all is
there), so `compat._private_uses.require` can name it; private names are looked up
through `compat._names` (a missing one is named, with where it was looked for).
`KERAS_PRIVATE_HOOKS` and
`KERAS_HOOK_CALLS` declare the private methods our Keras subclasses override
or call; `tests/unit/test_compat.py` checks no subclass uses any other.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from typing import Any

from packaging.version import Version

from keras_mgpu_plugins.compat import _names

#: Keras internals the workarounds use inside the methods they patch (beside what they
#: replace), as `compat._names` keys.
PATCH_INTERNALS = ("tree", "backend variable", "stateless scope", "epoch iterator",
                   "array data adapter", "tf dataset adapter", "tensorflow trainer module",
                   "reduction metrics module")
LIBRARY_NAMES = {"keras": "Keras", "tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}
#: Per library, the first version kmp's records were not checked for (exclusive upper bound
#: of their ranges): the first release CI has not run. pyproject.toml caps Keras and
#: TensorFlow below these (a test keeps them equal), so a fresh install resolves a checked
#: pair on the day a new release comes out; `.ci/run canary` runs the next one ahead.
CHECKED_BELOW = {"keras": "3.16.0", "tensorflow": "2.22.0", "jax": "0.12.0", "torch": "2.14.0"}

#: Private methods of Keras classes that our subclasses override or call, with their parameters.
KERAS_PRIVATE_HOOKS: dict[str, dict[str, tuple[str, ...]]] = {
    "keras.callbacks.ModelCheckpoint": {
        "_save_model": ("self", "epoch", "batch", "logs"),  # overridden
        "_get_file_path": ("self", "epoch", "batch", "logs"),  # called
        "_should_save_model": ("self", "epoch", "batch", "logs", "filepath"),  # called
    },
}
#: Public Keras hooks that must call a private one for an override of it to run.
KERAS_HOOK_CALLS: dict[str, tuple[tuple[str, str], ...]] = {
    "keras.callbacks.ModelCheckpoint": (
        ("on_epoch_end", "_save_model"), ("on_train_batch_end", "_save_model"),
    ),
}


def version_checked(version: str, min_version: str, max_version: str) -> bool:
    """Whether `version` is one a range `[min_version, max_version)` was checked for.

    A pre-release or development build (`3.16.0rc0`, `3.16.0.dev2026...`,
    `2.22.0-dev2026...`) is never a checked version, even where it sorts inside
    the range: nobody ran the tests on it.
    """
    v = Version(version)
    return not v.is_prerelease and Version(min_version) <= v < Version(max_version)


def version_predates(version: str, min_version: str) -> bool:
    """Whether `version` (a pre-release counts as its release) is older than `min_version`."""
    return Version(Version(version).base_version) < Version(min_version)


def source_has(obj: Any, *needles: str) -> bool | None:
    """Whether `obj`'s source holds every needle; `None` if the source cannot be read."""
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return None
    return all(needle in source for needle in needles)


def resolve(path: str) -> Any:
    """The object at dotted `path`: the longest importable module, then attributes; or at a
    `wraps` entry whose head is a private name of `compat._names` (`"tensorflow trainer.fit"`)."""
    if path.split(".", 1)[0] in _names.BY_KEY:
        owner, attribute = _names.locate(path)
        return getattr(owner, attribute)
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(f"nothing importable in {path!r}")


def params(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def names_used(fn: Any) -> set[str]:
    """Attribute and global names, and string constants (`getattr(x, "name")`), in `fn`'s code."""
    code = inspect.unwrap(fn).__code__
    return set(code.co_names) | {c for c in code.co_consts if isinstance(c, str)}


def check_hooks(class_path: str) -> list[str]:
    cls, problems = resolve(class_path), []
    for method, expected in KERAS_PRIVATE_HOOKS[class_path].items():
        fn = getattr(cls, method, None)
        if fn is None:
            problems.append(f"{class_path}.{method} is missing")
        elif params(fn) != expected:
            problems.append(f"{class_path}.{method}{params(fn)} is not {method}{expected}")
    for hook, callee in KERAS_HOOK_CALLS.get(class_path, ()):
        if callee not in names_used(getattr(cls, hook)):
            problems.append(f"{class_path}.{hook} no longer calls self.{callee}")
    return problems


def check_names(key: str, names: Iterable[str]) -> list[str]:
    """What of `names` the private name `key` (a module or class of `compat._names`) lacks."""
    found = _names.find(key)
    if found is None:
        return [_names.missing_message(key)]
    path, owner = found
    return [f"{path}.{n} is missing" for n in names if not hasattr(owner, n)]


def check_saving() -> list[str]:
    problems = check_names("saving_lib", ("_save_state", "H5IOStore", "DiskIOStore",
                                          "_serialize_model_as_json", "_CONFIG_FILENAME",
                                          "_METADATA_FILENAME", "_VARS_FNAME_H5", "_ASSETS_DIRNAME"))
    problems += check_names("legacy h5 format", ("save_model_to_hdf5",))
    if problems:
        return problems
    sl = _names.resolve("saving_lib")
    if len(params(sl._save_state)) != 5:
        problems.append(f"saving_lib._save_state{params(sl._save_state)} does not take 5 arguments")
    if params(sl.H5IOStore.make) != ("self", "path", "metadata"):
        problems.append(f"saving_lib.H5IOStore.make{params(sl.H5IOStore.make)} takes no metadata")
    return problems


def check_initial_epoch() -> list[str]:
    import keras

    if "_initial_epoch" not in names_used(keras.Model.fit):
        return ["keras.Model.fit no longer reads self._initial_epoch"]
    return []


#: How each backend's `fit` calls its train function, for `compat.watch_steps`.
WATCHED_TRAIN_FUNCTION_CALLS = {"tensorflow": "self.train_function(iterator)",
                                "jax": "self.train_function(state, iterator)",
                                "torch": "self.train_function(data)"}
TRAIN_FUNCTION_CALLS = WATCHED_TRAIN_FUNCTION_CALLS
#: The trainer modules `check_train_function` reads (by the backend's name).
TRAINER_MODULES = tuple(f"{backend} trainer module" for backend in WATCHED_TRAIN_FUNCTION_CALLS)


def check_train_function(calls: dict[str, str] | None = None) -> list[str]:
    """`fit` makes its train function before `on_train_begin`, then calls it as known
    (`calls`: how, per backend; default `TRAIN_FUNCTION_CALLS`)."""
    import inspect

    import keras

    backend = keras.backend.backend()
    call = (TRAIN_FUNCTION_CALLS if calls is None else calls).get(backend)
    if call is None:
        return [f"the {backend} backend's fit is not known"]
    problems = _names.missing(f"{backend} trainer module")
    if problems:
        return problems
    trainer = _names.resolve(f"{backend} trainer module")
    fit = next((c.fit for c in vars(trainer).values()
                if inspect.isclass(c) and "fit" in vars(c)), None)
    try:
        source = inspect.getsource(fit) if fit is not None else ""
    except (OSError, TypeError):
        return [f"the source of the {backend} trainer's fit cannot be read"]
    made, begun = (source.index(text) if text in source else -1
                   for text in ("self.make_train_function()", "on_train_begin("))
    problems = [] if call in source else [f"fit no longer calls {call}"]
    if made < 0 or begun < 0 or made > begun:
        problems.append("fit no longer makes its train function before on_train_begin")
    return problems


def check_print_msg() -> list[str]:
    problems = check_names("io_utils", ("print_msg",))
    return problems or ([] if params(_names.resolve("io_utils").print_msg)[:1] == ("message",)
                        else ["io_utils.print_msg does not take a message first"])


def check_callback_list() -> list[str]:
    import types

    import keras

    holder = types.SimpleNamespace()
    mine = keras.callbacks.Callback()
    made = keras.callbacks.CallbackList([mine], add_history=True, add_progbar=True, model=holder)
    order = [type(c).__name__ for c in made.callbacks]
    problems = [] if order == ["Callback", "History", "ProgbarLogger"] else [
        f"CallbackList orders the callbacks {order}, not [user's..., History, ProgbarLogger]"]
    if getattr(holder, "history", None) is not made.callbacks[1]:
        problems.append("CallbackList.set_model no longer sets model.history")
    return problems


def check_async_safe() -> list[str]:
    import keras

    dispatch = getattr(keras.callbacks.CallbackList, "_configure_async_dispatch", None)
    if dispatch is None or "async_safe" not in names_used(dispatch):
        return ["CallbackList no longer reads a callback's async_safe"]
    return []


def check_loss_tracker() -> list[str]:
    import keras

    problems = []
    if "count" not in names_used(keras.metrics.Mean.__init__):
        problems.append("keras.metrics.Mean no longer creates `count`")
    if "_loss_tracker" not in names_used(keras.Model.train_step):
        problems.append("keras.Model.train_step no longer updates self._loss_tracker")
    return problems


def check_flatten_layers() -> list[str]:
    import keras

    fn = getattr(keras.layers.Layer, "_flatten_layers", None)
    if fn is None or "include_self" not in params(fn):
        return ["keras.layers.Layer._flatten_layers(include_self=...) is missing"]
    return []


# Model parallelism (kmp.parallelize(strategy="model_parallel")): Keras 3 on TensorFlow re-runs
# a functional graph without the device scopes its layers were called under (DESIGN.md, "Model
# parallelism on the TensorFlow backend"): placing each call node needs the graph's nodes and
# the hook that runs them. No upstream issue: keras.distribution is JAX-only on TensorFlow by
# design (keras/src/backend/tensorflow/distribution_lib.py).
def check_model_parallel() -> list[str]:
    import keras

    problems = _names.missing("functional graph", "tensorflow variable")
    if problems:
        return problems
    function = _names.resolve("functional graph")
    if params(function._run_through_graph)[:3] != ("self", "inputs", "operation_fn"):
        problems.append("Function._run_through_graph(self, inputs, operation_fn, ...) changed")
    elif "_nodes_by_depth" not in names_used(function._run_through_graph):
        problems.append("Function._run_through_graph no longer walks _nodes_by_depth")
    if "_functional" not in names_used(keras.Sequential.call):
        problems.append("keras.Sequential.call no longer delegates to self._functional")
    variable = _names.resolve("tensorflow variable")
    if "_value" not in names_used(variable._initialize):
        problems.append("the TensorFlow Variable no longer keeps its tf.Variable in _value")
    if "_compute_loss" not in names_used(keras.Model.train_step):
        problems.append("keras.Model.train_step no longer calls self._compute_loss")
    return problems


def check_collective_all_reduce() -> list[str]:
    problems = _names.missing("collective_all_reduce_multi_worker")
    if not problems and params(_names.resolve("collective_all_reduce_multi_worker")) != (
            "strategy",):
        problems.append("_collective_all_reduce_multi_worker(strategy) changed")
    return problems


def check_patch_internals() -> list[str]:
    """The private Keras names the workarounds use beside what they replace are there (what
    they replace is checked before each is applied: `Patch.targets`)."""
    return _names.missing(*PATCH_INTERNALS)


def check_eager_context() -> list[str]:
    problems = _names.missing("eager context")
    if problems:
        return problems
    context = _names.resolve("eager context").Context
    for name in ("device_name", "host_address_space"):
        if not hasattr(context, name):
            problems.append(f"eager context.Context.{name} is missing")
    if "_collective_ops_server_def" not in names_used(context.__init__):
        problems.append("eager context.Context no longer sets _collective_ops_server_def")
    return problems


def check_coordination_store() -> list[str]:
    """What `tf_coordination_context` needs: the eager context's key-value calls, a get that
    takes a timeout (TensorFlow has no non-blocking get), and the coordination service's config."""
    problems = _names.missing("eager context")
    if problems:
        return problems
    context = _names.resolve("eager context").Context
    problems = [f"eager context.Context.{name} is missing" for name in
                ("set_config_key_value", "get_config_key_value", "coordination_service")
                if not hasattr(context, name)]
    if not problems and "timeout_in_ms" not in params(context.get_config_key_value):
        problems.append("eager context.Context.get_config_key_value takes no timeout_in_ms")
    return problems


def check_maybe_merge_call() -> list[str]:
    return _names.missing("maybe_merge_call")


def check_input_lib() -> list[str]:
    problems = _names.missing("distributed iterator")
    if problems:
        return problems
    iterator = _names.resolve("distributed iterator")
    return [f"DistributedIterator.{name} is missing"
            for name in ("get_next_as_optional", "_get_next_no_partial_batch_handling")
            if not hasattr(iterator, name)]
