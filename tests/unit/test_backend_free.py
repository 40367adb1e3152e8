"""The backend-free package imports no backend: no TensorFlow, JAX or torch, and neither
`keras_mgpu_plugins.backends` (the dispatcher) nor any module below it, anywhere in a module
(at its top or inside a function).

It reaches a backend only through `keras_mgpu_plugins._backend.active()` (and
`kmp.runtime.of(model)`, built on it), which the dispatcher is handed to when the package's
`__init__` imports it: the same callbacks, samplers, launcher and writers serve every Keras
backend, none loads a framework the job does not use, and no import circle runs through
the backends (which build on these folders).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "keras_mgpu_plugins"

#: The folders that must stay backend-free, and the top-level modules outside them.
FOLDERS = ("callbacks", "samplers", "integrations", "launch", "runtime", "cluster", "io",
           "inputs", "verify")
#: Top-level modules kept as the old public paths of modules moved under
#: `backends/tensorflow/` (documented re-exports of the same module objects), and the
#: package's `__init__`, which imports the dispatcher so that it hands itself to `_backend`.
SHIMS = {"strategy.py", "collective.py", "multi_gpu.py", "__init__.py"}

FRAMEWORKS = {"tensorflow", "jax", "jaxlib", "torch"}
PACKAGE_NAME = "keras_mgpu_plugins"
BACKENDS = f"{PACKAGE_NAME}.backends"
#: The backend packages (`backends/tensorflow`, `backends/jax`, `backends/single`).
BACKEND_PACKAGES = {p.parent.name for p in (PACKAGE / "backends").glob("*/__init__.py")}


def backend_free_modules() -> list[pathlib.Path]:
    paths = [p for folder in FOLDERS for p in sorted((PACKAGE / folder).rglob("*.py"))]
    return paths + [p for p in sorted(PACKAGE.glob("*.py")) if p.name not in SHIMS]


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, path: pathlib.Path) -> str:
    """The module an `ImportFrom` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _forbidden(name: str) -> bool:
    return (name.split(".")[0] in FRAMEWORKS or name == BACKENDS
            or name.startswith(BACKENDS + "."))


def backend_imports(path: pathlib.Path) -> list[str]:
    """`"file:line: module"` for each import of a backend in the module at `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, path)
            names = [module] + [f"{module}.{alias.name}" for alias in node.names
                                if (module == BACKENDS and alias.name in BACKEND_PACKAGES)
                                or (module == PACKAGE_NAME and alias.name == "backends")]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__")):
            names = [node.args[0].value]  # importlib.import_module("tensorflow")
        relative = path.relative_to(PACKAGE.parent)
        found += [f"{relative}:{node.lineno}: {name}" for name in names if _forbidden(name)]
    return found


def test_the_backend_free_package_imports_no_backend():
    found = [hit for path in backend_free_modules() for hit in backend_imports(path)]
    assert not found, (
        "Backend-free modules import a backend (ask keras_mgpu_plugins._backend.active() "
        "or kmp.runtime.of(model) instead):\n" + "\n".join(found))


def test_every_folder_is_walked_with_its_subfolders():
    walked = {str(p.relative_to(PACKAGE)) for p in backend_free_modules()}
    assert {"io/atomic.py", "samplers/gpu.py", "launch/_worker.py", "devices.py"} <= walked
    assert not SHIMS & walked and not any(w.startswith("backends") for w in walked)


@pytest.mark.parametrize("source, hit", [
    ("import tensorflow as tf", "tensorflow"),
    ("def f():\n    from tensorflow.core.framework import summary_pb2", "tensorflow.core.framework"),
    ("import jax.numpy as jnp", "jax.numpy"),
    ("def f():\n    import torch", "torch"),
    ("from keras_mgpu_plugins.backends.tensorflow import runtime", BACKENDS + ".tensorflow"),
    ("from keras_mgpu_plugins.backends import jax", BACKENDS + ".jax"),
    ("from ..backends import single", BACKENDS + ".single"),
    ("def f():\n    from keras_mgpu_plugins import backends", BACKENDS),
    ("from keras_mgpu_plugins.backends import current", BACKENDS),
    ("import importlib\nimportlib.import_module('tensorflow')", "tensorflow"),
])
def test_each_kind_of_backend_import_is_named_with_file_and_line(tmp_path, source, hit):
    folder = tmp_path / "keras_mgpu_plugins" / "io"
    folder.mkdir(parents=True)
    (folder / "probe.py").write_text(f"x = 1\n{source}\n")
    line = 1 + len(source.splitlines())
    found = _probe(folder / "probe.py", tmp_path / "keras_mgpu_plugins")
    assert found[-1] == f"keras_mgpu_plugins/io/probe.py:{line}: {hit}", found


def test_asking_the_active_backend_is_allowed(tmp_path):
    folder = tmp_path / "keras_mgpu_plugins" / "io"
    folder.mkdir(parents=True)
    (folder / "probe.py").write_text(
        "from keras_mgpu_plugins import _backend\nfrom keras_mgpu_plugins._backend import active\n"
        "import keras\nfrom keras_mgpu_plugins.runtime import of\n")
    assert _probe(folder / "probe.py", tmp_path / "keras_mgpu_plugins") == []


def _probe(path: pathlib.Path, package: pathlib.Path) -> list[str]:
    global PACKAGE
    saved, PACKAGE = PACKAGE, package
    try:
        return backend_imports(path)
    finally:
        PACKAGE = saved


def test_every_backend_offers_the_same_functions_and_no_module_hides_one():
    """`backends.current().<function>` works on every backend; a submodule named like a
    function would replace it on the package once imported (`backends/tensorflow/x.py`)."""
    offered = {}
    for name in BACKEND_PACKAGES:
        tree = ast.parse((PACKAGE / "backends" / name / "__init__.py").read_text())
        offered[name] = {node.name for node in tree.body
                         if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")}
        modules = {p.stem for p in (PACKAGE / "backends" / name).iterdir()
                   if p.suffix == ".py" or (p / "__init__.py").exists()}
        assert not offered[name] & modules, (name, offered[name] & modules)
    assert len({frozenset(functions) for functions in offered.values()}) == 1, offered
