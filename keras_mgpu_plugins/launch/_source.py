"""The payload of `kmp.launch`: `fn` pickled with the source of its code.

cloudpickle sends a function of `__main__` (or of a notebook, or of a module
registered with `cloudpickle.register_pickle_by_value`) by value, and since
cloudpipe/cloudpickle#560 (for #538; cloudpickle 3.1.3 here) it renames the file
of each code object it pickles `"<dynamic-code>"`. In the worker,
`inspect.getsource` then finds no source, so TensorFlow's AutoGraph cannot
convert the function: `tf.function` and `tf.data.Dataset.map` run it as is
("AutoGraph could not transform ... and will run it as-is"), and Python
control flow over tensors (`if x < 0:`) raises `OperatorNotAllowedInGraphError`
where one process works. Even with the file name kept, a notebook cell, a
`python -c` program or a file the worker cannot read would have no source.

`dumps` therefore pickles each code object under its own file name and adds the
source lines of those files as the sending process sees them (`linecache`,
which holds notebook cells; the code of `python -c` from `sys.orig_argv`);
`loads` puts those lines in the worker's `linecache` before unpickling, where
`inspect` and AutoGraph look for them, and tracebacks show them too. Code whose
source the sender does not have either (a script read from stdin) keeps its
file name only: AutoGraph cannot convert it in one process either.
"""

from __future__ import annotations

import io
import linecache
import pickle
import sys
import types
from typing import Any

import cloudpickle


class _SourcePickler(cloudpickle.Pickler):
    """cloudpickle's pickler, keeping each code object's file name and collecting its lines."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=cloudpickle.DEFAULT_PROTOCOL)
        self.sources: dict[str, list[str] | None] = {}
        self._defined: dict[str, set[tuple[str, int]] | None] = {}
        self._plain: dict[int, types.CodeType] = {}

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not types.CodeType or id(obj) in self._plain:
            return super().reducer_override(obj)
        filename = obj.co_filename
        if filename not in self.sources:
            self.sources[filename] = _source_lines(filename)
            self._defined[filename] = _definitions(filename, self.sources[filename])
        defined = self._defined[filename]
        if defined is not None and (obj.co_name, obj.co_firstlineno) not in defined:
            self.sources[filename] = None  # e.g. exec'd code, also named "<string>"
        copy = obj.replace()  # a new object: the memo must not hand `obj` back
        self._plain[id(copy)] = copy  # pickled by cloudpickle as usual
        return _with_filename, (copy, filename)


def dumps(obj: Any) -> bytes:
    """Cloudpickles `obj`, with the source lines of the code it carries by value."""
    buffer = io.BytesIO()
    pickler = _SourcePickler(buffer)
    pickler.dump(obj)
    found = {name: lines for name, lines in pickler.sources.items() if lines}
    return pickle.dumps({"sources": found, "payload": buffer.getvalue()})


def loads(data: bytes) -> Any:
    """Seeds `linecache` with the sources `dumps` shipped, then unpickles the object."""
    record = pickle.loads(data)
    for filename, lines in record["sources"].items():
        # mtime None: `linecache.checkcache` keeps the entry (it cannot stat it).
        linecache.cache[filename] = (sum(map(len, lines)), None, list(lines), filename)
    return pickle.loads(record["payload"])


def _with_filename(code: types.CodeType, filename: str) -> types.CodeType:
    """`code` (rebuilt by cloudpickle as `"<dynamic-code>"`) under its own file name."""
    return code.replace(co_filename=filename)


def _source_lines(filename: str) -> list[str] | None:
    """The lines of `filename` as this process sees them, or `None`."""
    lines = linecache.getlines(filename)
    if lines:
        return lines
    if filename == "<string>":
        return _dash_c_lines()
    return None


def _definitions(filename: str, lines: list[str] | None) -> set[tuple[str, int]] | None:
    """(name, first line) of the code that `lines` define, for a name like `<string>`.

    `None` for a real file (taken as it is, as `inspect` in one process would) or no lines.
    An empty set where `lines` do not compile: nothing matches.
    """
    if not lines or not (filename.startswith("<") and filename.endswith(">")):
        return None
    try:
        todo = [compile("".join(lines), filename, "exec", dont_inherit=True)]
    except (SyntaxError, ValueError):
        return set()
    found = set()
    while todo:
        code = todo.pop()
        found.add((code.co_name, code.co_firstlineno))
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return found


def _dash_c_lines() -> list[str] | None:
    """The program of `python -c PROGRAM`, where this process was started so."""
    argv = getattr(sys, "orig_argv", [])
    if sys.argv[:1] != ["-c"] or "-c" not in argv[1:-1]:
        return None
    lines = argv[argv.index("-c", 1) + 1].splitlines(True)
    if lines and not lines[-1].endswith("\n"):  # as linecache reads a file
        lines[-1] += "\n"
    return lines or None
