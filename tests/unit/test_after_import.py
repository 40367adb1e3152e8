"""`_after_import.when_imported`: how the launcher's workers add the `StallWatchdog` to every
`fit` without importing Keras before the user's code does."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from keras_mgpu_plugins._after_import import _AfterImport, when_imported


@pytest.fixture
def module_name(tmp_path, monkeypatch):
    """A module that exists on sys.path and is not imported yet; forgotten afterwards."""
    name = f"kmp_toy_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]


def test_then_runs_once_after_the_import_not_on_a_look_up(module_name):
    seen = []
    when_imported(module_name, lambda module: seen.append(module.VALUE + 1))
    assert importlib.util.find_spec(module_name) is not None  # a look-up (TensorFlow's, of Keras)
    assert seen == []
    importlib.import_module(module_name)
    importlib.import_module(module_name)
    assert seen == [42]
    assert not any(isinstance(f, _AfterImport) for f in sys.meta_path)


def test_an_imported_module_gets_then_now(module_name):
    module = importlib.import_module(module_name)
    seen = []
    when_imported(module_name, seen.append)
    assert seen == [module]


def test_an_error_of_then_is_a_warning_and_the_import_succeeds(module_name):
    def fail(module):
        raise RuntimeError("no watchdog today")

    when_imported(module_name, fail)
    with pytest.warns(RuntimeWarning, match=f"kmp: after importing {module_name}: RuntimeError: "
                                            "no watchdog today"):
        module = importlib.import_module(module_name)
    assert module.VALUE == 41
