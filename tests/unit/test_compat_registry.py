"""The registry of every change kmp makes to Keras/TensorFlow (`kmp.compat.PATCHES`).

Every record says what, why and where; two records that wrap one attribute have
a declared order that applying keeps whatever order the calls come in;
`unpatch_keras()` puts back every original; the troubleshooting page's
"symptom → patch" table is the one the registry renders.
"""

from __future__ import annotations

import dataclasses
import pathlib
import types

import keras
import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins import compat
from keras_mgpu_plugins.compat import _index as _compat_index
from keras_mgpu_plugins.compat import _registry as _compat_patches
from keras_mgpu_plugins.compat._checks import resolve
from keras_mgpu_plugins.compat._record import Patch, order_problems
from tests.versions import prerelease

PAGE = pathlib.Path(kmp.__file__).parent.parent / "docs" / "troubleshooting.md"


@pytest.fixture
def clean():
    """Nothing patched during the test; the suite's usual state (the workarounds) after."""
    compat.unpatch_keras()
    yield
    compat.unpatch_keras()
    compat.patch_keras()


def test_every_record_says_what_why_where_and_for_which_versions():
    names = [p.name for p in compat.PATCHES]
    assert len(names) == len(set(names))
    for p in compat.PATCHES:
        assert p.symptom and p.wraps and p.when, p.name
        assert p.upstream.startswith("https://github.com/"), p.name
        assert p.kind in ("workaround", "feature") and p.library in ("keras", "tensorflow")
        # a release CI runs is in every range (pyproject caps it); a nightly in none
        assert p.applies_to(p.installed_version()) is not prerelease(p.library), p.name
        # a patch in force replaced what its check reads: it was there when it was applied
        assert p.name in _compat_patches._applied or p.present() is True, p.name
        # a feature changes results only where it is kmp's data parallelism on a Keras that
        # has none (torch, Keras 3.10 to 3.15), or random layers drawing one device's numbers
        # where asked (random_layers="one_device"): those fail closed like the workarounds
        assert not (p.kind == "feature" and p.changes_results) or p.name.startswith(
            "torch_") or p.name == "random_draws_as_one_device", p.name


def test_every_pair_wrapping_one_attribute_has_a_declared_order_kept_by_the_table():
    assert order_problems(compat.PATCHES) == []
    by_attribute: dict[str, list[str]] = {}
    for p in compat.PATCHES:
        for path in p.wraps:
            by_attribute.setdefault(f"{path}{' (instance)' * p.per_instance}", []).append(p.name)
    shared = {path.rsplit(".", 1)[1]: names for path, names in by_attribute.items()
              if len(names) > 1}
    assert set(shared) == {"_maybe_symbolic_build", "_make_function", "_backend_apply_gradients",
                           "_all_reduce_sum_gradients", "_get_iterator", "fit", "evaluate",
                           "predict", "compile", "compile (instance)", "train_on_batch",
                           "test_on_batch", "predict_on_batch", "train_step (instance)",
                           "predict_step (instance)", "call (instance)",
                           "scale_loss_for_distribution", "unscale_loss_for_distribution"}
    assert shared["scale_loss_for_distribution"] == ["uneven_batches_weighted_by_rows",
                                                     "custom_step_logs_unscaled"]
    assert shared["fit"] == ["parameter_server_methods", "chief_only_progress_bars",
                             "stall_watchdog_on_every_fit", "same_callbacks_on_every_worker",
                             "jax_inputs_as_on_one_device", "same_calls_on_every_worker",
                             "torch_one_model_per_job", "verify_records_calls"]
    assert shared["evaluate"] == shared["predict"] == ["parameter_server_methods",
                                                       "chief_only_progress_bars",
                                                       "jax_inputs_as_on_one_device",
                                                       "same_calls_on_every_worker",
                                                       "torch_one_model_per_job",
                                                       "verify_records_calls"]
    assert shared["call (instance)"] == ["placed_layer_call", "random_layer_rows"]
    assert shared["train_on_batch"] == ["parameter_server_methods", "jax_inputs_as_on_one_device"]
    assert shared["compile"] == ["compile_in_model_strategy_scope",
                                 "compile_adopts_state_made_outside",
                                 "jax_compile_under_model_distribution"]


def test_order_problems_names_an_undeclared_or_reversed_pair():
    def record(name, after=()):
        return Patch(name, "https://github.com/x/y/issues/1", "3.0.0", "4.0.0", lambda: None,
                     wraps=("keras.Model.fit",), after=after)

    assert order_problems([record("a"), record("b")]) == [
        "a and b both wrap keras.Model.fit: neither names the other in after="]
    assert order_problems([record("a", after=("b",)), record("b")]) == [
        "a wraps b (keras.Model.fit) but comes first in the table"]
    assert order_problems([record("a"), record("b", after=("c",))]) == [
        "b: after='c' names no patch", "a and b both wrap keras.Model.fit: neither names the "
        "other in after="]


def test_a_patch_applied_late_still_goes_inside_the_ones_declared_to_wrap_it(clean):
    """The launcher without a strategy applies the watchdog first, the strategy's two later:
    the same-callbacks check still wraps the watchdog (the declared order: it compares the
    callbacks each worker was given, not the one the launcher adds), as on the default path."""
    from keras_mgpu_plugins import _same_callbacks, _worker_output
    from keras_mgpu_plugins.callbacks import stall_watchdog

    original = keras.Model.fit
    stall_watchdog.add_to_every_fit(30)
    _same_callbacks.install()
    _worker_output.install()
    assert list(_compat_patches._applied) == [
        "chief_only_progress_bars", "stall_watchdog_on_every_fit", "same_callbacks_on_every_worker"]
    chain, fit = [], keras.Model.fit
    while fit is not original:
        chain.append(pathlib.Path(fit.__code__.co_filename).name)  # wraps copies __module__
        fit = fit.__wrapped__
    assert chain == ["_same_callbacks.py", "stall_watchdog.py", "_worker_output.py"]
    with pytest.raises(RuntimeError, match="cannot undo chief_only_progress_bars alone"):
        compat.remove("chief_only_progress_bars")


def test_the_same_calls_check_wraps_every_other_wrapper_of_fit_whenever_applied(clean):
    """TensorFlow's calls check goes outside the same-callbacks check (the workers meet before
    its all-gather), also when it is applied first; it wraps evaluate and predict too."""
    from keras_mgpu_plugins import _same_callbacks, _worker_output
    from keras_mgpu_plugins.backends.tensorflow import same_calls
    from keras_mgpu_plugins.callbacks import stall_watchdog

    original = {m: getattr(keras.Model, m) for m in ("fit", "evaluate", "predict")}
    same_calls.install()
    stall_watchdog.add_to_every_fit(30)
    _same_callbacks.install()
    _worker_output.install()
    chains = {}
    for name, first in original.items():
        chain, method = [], getattr(keras.Model, name)
        while method is not first:
            chain.append(pathlib.Path(method.__code__.co_filename).name)
            method = method.__wrapped__
        chains[name] = chain
    assert chains == {
        "fit": ["same_calls.py", "_same_callbacks.py", "stall_watchdog.py", "_worker_output.py"],
        "evaluate": ["same_calls.py", "_worker_output.py"],
        "predict": ["same_calls.py", "_worker_output.py"]}
    compat.remove("same_calls_on_every_worker")
    assert keras.Model.evaluate is not original["evaluate"]  # the progress bars' wrapper stays
    assert keras.Model.fit.__code__.co_filename.endswith("_same_callbacks.py")


def test_an_undeclared_pair_is_refused_when_applied(clean, monkeypatch):
    undeclared = tuple(dataclasses.replace(p, after=()) if p.name == "same_callbacks_on_every_worker"
                       else p for p in _compat_patches.PATCHES)
    monkeypatch.setattr(_compat_patches, "PATCHES", undeclared)
    compat.apply("chief_only_progress_bars")
    with pytest.raises(RuntimeError, match="declares no order"):
        compat.apply("same_callbacks_on_every_worker")


def instances():
    """One fresh object per per-instance record, with the arguments kmp gives it."""
    import tensorflow as tf
    from keras.src.trainers.epoch_iterator import EpochIterator

    def model():
        made = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        made.compile("adam", "mse")
        return made

    graph = model()
    return {
        "placed_graph_run": (graph._functional, lambda operation_fn: operation_fn),
        "placed_layer_call": (keras.layers.Dense(2), "/device:CPU:0"),
        "placed_train_step": (model(), 1, None),
        "placed_compile_keeps_placement": (graph,),
        "hybrid_compile_in_strategy_scope": (graph, tf.distribute.get_strategy()),
        "overridden_compile_adopts_its_arguments": (model(), tf.distribute.get_strategy()),
        "placed_optimizer_slots": (model().optimizer,),
        "placement_report_on_first_fit": (model(),),
        "progbar_hidden_keys": (keras.callbacks.History(), lambda: ["hidden"]),
        "multi_gpu_parallel_methods": (model(), types.SimpleNamespace(
            compile=print, fit=print, evaluate=print, predict=print)),
        "multi_gpu_template_watch": (model(), types.SimpleNamespace(_watch=lambda m: m)),
        "verify_noise_rows_reversed": (model(),),
        "random_layer_rows": (keras.layers.Dropout(0.5),),
        "resume_skips_trained_batches": (EpochIterator(x=np.zeros((4, 3)), batch_size=2), 2,
                                         None),
    }


def _record(name):
    return next(p for p in compat.PATCHES if p.name == name)


def test_unpatch_keras_puts_back_every_original(clean):
    """Every record applied (the workarounds as `patch_keras`, each feature as kmp applies
    it), then `unpatch_keras()`: every attribute is the original object again."""
    from keras_mgpu_plugins import _same_callbacks, _worker_output
    from keras_mgpu_plugins.backends.tensorflow import same_calls
    from keras_mgpu_plugins.backends.tensorflow.model_parallel import placement
    from keras_mgpu_plugins.backends.tensorflow.parameter_server import cluster as ps_cluster
    from keras_mgpu_plugins.callbacks import stall_watchdog

    paths = [w for p in compat.PATCHES if not p.per_instance and not p.name.startswith("jax_")
             for w in p.wraps]  # the JAX lane's records: tests/jax (no JAX installed here)
    before = {path: resolve(path) for path in paths}
    compat.patch_keras()
    _worker_output.install()
    _same_callbacks.install()
    same_calls.install()
    stall_watchdog.add_to_every_fit(30)
    compat.apply("placed_model_clone_warning")
    compat.apply("random_draws_as_one_device")  # as random_layers="one_device" does
    compat.apply("verify_records_calls")  # as a kmp-verify run does
    compat.apply("csv_logger_resumes")  # as BackupAndRestore does
    for name in ps_cluster.RECORDS:  # as a parameter-server strategy applies them
        compat.apply(name)
    objects = instances()
    own = {name: {a: vars(obj).get(a) for a in _record(name).attributes()}  # Keras sets `build`
           for name, (obj, *_) in objects.items()}
    for name, (obj, *args) in objects.items():
        assert compat.apply_to(name, obj, *args), name
    with placement.recording():
        during = {path: resolve(path) for path in paths}
    assert "placement_records_layer_calls" not in _compat_patches._applied  # removed after
    assert [p for p in paths if during[p] is before[p]] == []  # each one was replaced
    for name, (obj, *_) in objects.items():
        assert name in compat.applied_on(obj)
        assert all(vars(obj).get(a) is not own[name][a] for a in own[name]), name
    compat.unpatch_keras()
    assert [p for p in paths if resolve(p) is not before[p]] == []
    assert _compat_patches._applied == {}
    for name, (obj, *_) in objects.items():
        assert {a: vars(obj).get(a) for a in own[name]} == own[name], name
        assert compat.applied_on(obj) == []


def test_per_instance_patches_keep_their_declared_order(clean):
    """On one model, the hybrid compile must wrap the model-parallel one, not the reverse."""
    import tensorflow as tf

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(RuntimeError, match="declares no such order"):
        compat.apply_to("hybrid_compile_in_strategy_scope", model, tf.distribute.get_strategy())
        compat.apply_to("placed_compile_keeps_placement", model)
    compat.remove_from("hybrid_compile_in_strategy_scope", model)
    assert "compile" not in vars(model)
    compat.apply_to("placed_compile_keeps_placement", model)
    compat.apply_to("hybrid_compile_in_strategy_scope", model, tf.distribute.get_strategy())
    assert compat.applied_on(model) == ["placed_compile_keeps_placement",
                                        "hybrid_compile_in_strategy_scope"]
    with pytest.raises(RuntimeError, match="another patch wrapped its compile"):
        compat.remove_from("placed_compile_keeps_placement", model)


def test_a_feature_outside_its_range_follows_the_same_version_policy(clean, monkeypatch):
    """A feature patch is not results-changing: applied with one warning where its code is
    there, skipped with one where it is not."""
    import warnings

    from keras_mgpu_plugins.compat import _policy

    monkeypatch.setattr(_compat_patches, "_warned_patches", set())
    monkeypatch.setattr(_policy, "_announced", [])
    monkeypatch.setattr(keras, "__version__", "3.16.0")
    with pytest.warns(UserWarning, match=r"not checked with Keras 3\.16\.0 \(newer than"):
        assert compat.apply("chief_only_progress_bars")  # the version policy's one warning
    gone = tuple(dataclasses.replace(p, present=lambda: False)
                 if p.name == "same_callbacks_on_every_worker" else p
                 for p in _compat_patches.PATCHES)
    monkeypatch.setattr(_compat_patches, "PATCHES", gone)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # folded in that one warning: no second
        assert compat.apply("same_callbacks_on_every_worker") is False


def test_the_troubleshooting_index_is_the_one_the_registry_renders():
    page = PAGE.read_text()
    assert _compat_index.BEGIN in page, "run python -m keras_mgpu_plugins.compat._index"
    assert _compat_index.render_into(page) == page, (
        "docs/troubleshooting.md's symptom index is stale: run "
        "python -m keras_mgpu_plugins.compat._index")
    for p in compat.PATCHES:
        assert f"| `{p.name}` |" in page
