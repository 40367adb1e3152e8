"""`launch._source`: the payload keeps each code object's file name and carries its lines."""

from __future__ import annotations

import inspect
import linecache
import pickle
import sys
import types

import cloudpickle

from keras_mgpu_plugins.launch import _source

CELL = '''
def outer(x):
    def inner(y):
        return y + 1
    return [inner(v) for v in x]
'''


def _cell(name: str) -> types.FunctionType:
    """A function of a notebook-like cell: its lines in linecache, under a file that is not."""
    linecache.cache[name] = (len(CELL), None, CELL.splitlines(True), name)
    namespace = {"__name__": "__main__"}  # pickled by value, as __main__ functions are
    exec(compile(CELL, name, "exec"), namespace)
    return namespace["outer"]


def test_plain_cloudpickle_loses_the_file_name():
    fn = _cell("/nonexistent/cell-0.py")
    assert cloudpickle.loads(cloudpickle.dumps(fn)).__code__.co_filename == "<dynamic-code>"


def test_source_and_file_names_travel_with_the_function():
    name = "/nonexistent/cell-1.py"
    data = _source.dumps(_cell(name))
    del linecache.cache[name]  # as in a fresh worker
    fn = _source.loads(data)
    assert fn([1, 2]) == [2, 3]
    assert fn.__code__.co_filename == name
    nested = [c for c in fn.__code__.co_consts if isinstance(c, types.CodeType)]
    assert nested and all(c.co_filename == name for c in nested)
    assert inspect.getsource(fn) == CELL.lstrip("\n")
    linecache.checkcache()  # the seeded entry survives: its file cannot be checked
    assert inspect.getsource(fn) == CELL.lstrip("\n")


def test_code_without_source_keeps_its_file_name_only():
    namespace = {"__name__": "__main__"}
    exec(compile("def f():\n    return 1\n", "<stdin>", "exec"), namespace)
    record = pickle.loads(_source.dumps(namespace["f"]))
    assert record["sources"] == {}
    assert pickle.loads(record["payload"]).__code__.co_filename == "<stdin>"


def test_dash_c_program_is_shipped_only_for_its_own_code(monkeypatch):
    program = "import os\ndef f():\n    return 1\n"
    monkeypatch.setattr(sys, "argv", ["-c"])
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-c", program], raising=False)
    own, other = {"__name__": "__main__"}, {"__name__": "__main__"}
    exec(compile(program, "<string>", "exec"), own)
    exec(compile("x = 1\ndef g():\n    return 2\n", "<string>", "exec"), other)
    assert pickle.loads(_source.dumps(own["f"]))["sources"] == {
        "<string>": program.splitlines(True)}
    # exec'd code also named "<string>" is not the program: its lines would be wrong
    assert pickle.loads(_source.dumps(other["g"]))["sources"] == {}
    assert pickle.loads(_source.dumps((own["f"], other["g"])))["sources"] == {}
