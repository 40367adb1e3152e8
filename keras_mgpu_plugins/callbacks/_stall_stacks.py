"""Where a thread is, read from its Python stack (for `StallWatchdog`; no Keras).

- `locate(frame)`: inside TensorFlow or the active Keras backend's framework (a step, a
  collective: possibly waiting
  for a peer), tracing or saving (busy: the clock is paused), or in Python code (the
  innermost user frame);
- `outermost_call(frame)` / `has_frame`: the `tf.function` call a thread is in;
- `format_stacks()`: every thread's stack, as `faulthandler` prints them.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import traceback
from types import FrameType

_TF = f"{os.sep}tensorflow{os.sep}"
_STDLIB = os.path.join(sysconfig.get_paths()["stdlib"], "")
#: Not the user's code: where a frame is reported from the user's point of view.
_LIBRARIES = (_TF, f"{os.sep}keras{os.sep}", f"{os.sep}keras_mgpu_plugins{os.sep}",
              f"{os.sep}ray{os.sep}", "<frozen ")
#: Frames that mean "busy, not stuck": TensorFlow tracing a function, a save in progress.
#: Tracing is `func_graph.py` on the stack (`func_graph_from_py_func` and the graph it
#: builds), not `tracing_compilation.py`: its `call_function` is on the stack of every call
#: of a `tf.function`, also a train step blocked in a collective.
_BUSY = {
    "tracing a function": (f"{_TF}python{os.sep}framework{os.sep}func_graph.py",),
    "saving": (f"{os.sep}keras{os.sep}src{os.sep}saving{os.sep}", f"{os.sep}h5py{os.sep}",
               f"{os.sep}keras_mgpu_plugins{os.sep}io{os.sep}snapshots.py",
               f"{os.sep}keras_mgpu_plugins{os.sep}io{os.sep}atomic.py"),
}


def _short(filename: str) -> str:
    parts = filename.split(os.sep)
    return os.sep.join(parts[-2:]) if len(parts) > 2 else filename


def _describe(frame: FrameType) -> str:
    return f"{frame.f_code.co_name} ({_short(frame.f_code.co_filename)}:{frame.f_lineno})"


#: The packages of a Keras backend whose frames are "inside" it (the backend's own name
#: otherwise), and the name said in reports.
_PACKAGES = {"jax": ("jax", "jaxlib")}
_LABELS = {"jax": "JAX", "jaxlib": "JAX"}


def _framework_folders() -> dict[str, str]:
    """The active Keras backend's package folders, once imported (never imported here), with
    the name to report: frames there are inside it, as frames under `tensorflow/` are
    inside TensorFlow (a user folder of the same name is not)."""
    keras = sys.modules.get("keras")
    backend = getattr(getattr(keras, "backend", None), "backend", None)
    name = backend() if callable(backend) else None
    folders = {}
    for package in _PACKAGES.get(name, (name,)) if name and name != "tensorflow" else ():
        path = getattr(sys.modules.get(package), "__file__", None)
        if path:
            folders[os.path.join(os.path.dirname(path), "")] = _LABELS.get(package, package)
    if folders:  # Keras's layer over it: a thread blocked there waits in the framework's
        # native code (`np.asarray` of a JAX array whose step waits in a collective)
        path = getattr(sys.modules.get(f"keras.src.backend.{name}"), "__file__", None)
        if path:
            folders[os.path.join(os.path.dirname(path), "")] = next(iter(folders.values()))
    return folders


def locate(frame: FrameType | None) -> tuple[str, bool, str]:
    """Where a thread is, from its innermost frame.

    Returns:
        `(busy, inside_tf, where)`: `busy` names a busy state
        (`"tracing a function"`, `"saving"`) or is `""`; `inside_tf` says the
        thread is in a TensorFlow or JAX call (such a frame is nearer the top of
        the stack than any user frame); `where` describes the place in words.
    """
    if frame is None:
        return "", False, "nowhere (the thread has ended)"
    innermost, user, tf_frame, framework = frame, None, None, "TensorFlow"
    busy, folders = "", _framework_folders()
    while frame is not None:
        name = frame.f_code.co_filename
        owner = next((label for folder, label in folders.items() if name.startswith(folder)),
                     None)
        in_framework = owner is not None
        if not busy:
            busy = next((what for what, marks in _BUSY.items()
                         if any(mark in name for mark in marks)), "")
        if user is None and tf_frame is None and (_TF in name or in_framework):
            tf_frame = frame  # a framework call nearer the top than any user code
            framework = owner or "TensorFlow"
        if user is None and not (name.startswith(_STDLIB) or in_framework
                                 or any(lib in name for lib in _LIBRARIES)):
            user = frame
        frame = frame.f_back
    inside_tf = tf_frame is not None
    if tf_frame is not None:
        where = f"inside {framework} at {_describe(tf_frame)}"
        if user is not None:
            where += f", called from {_describe(user)}"
    else:
        where = f"in {_describe(user or innermost)}"
    return busy, inside_tf, where


#: The frame of one call of a `tf.function` (it traces there first if it must).
_CALL_FILE = f"{os.sep}polymorphic_function{os.sep}polymorphic_function.py"


def outermost_call(frame: FrameType | None) -> FrameType | None:
    """The outermost `tf.function` call on a thread's stack (`None` if there is none)."""
    found = None
    while frame is not None:
        if frame.f_code.co_name == "__call__" and frame.f_code.co_filename.endswith(_CALL_FILE):
            found = frame
        frame = frame.f_back
    return found


def has_frame(frame: FrameType | None, target: FrameType) -> bool:
    """Whether `target` (a frame object) is on the stack that ends in `frame`."""
    while frame is not None:
        if frame is target:
            return True
        frame = frame.f_back
    return False


def format_stacks(prefix: str = "") -> str:
    """Every thread's Python stack, innermost call first, like `faulthandler` prints them."""
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = []
    for ident, frame in sys._current_frames().items():
        lines.append(f"Thread 0x{ident:016x} ({names.get(ident, '?')}), most recent call first:")
        for summary in reversed(traceback.extract_stack(frame)):
            lines.append(f'  File "{summary.filename}", line {summary.lineno} in {summary.name}')
        lines.append("")
    return "".join(f"{prefix}{line}\n" for line in lines)
