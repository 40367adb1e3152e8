"""Atomic file writes: a file appears at its final name complete, or not at all.

Shared by the checkpointing callbacks. A writer produces the file under a
temporary name in the *same folder* (so the final rename never crosses file
systems), the data is flushed to disk with `fsync`, and `os.replace` moves it to
the final name in one step; the folder is then synced so the rename itself
survives a crash. A process killed at any moment leaves either the previous
file or the new one at the final name, plus at worst a hidden temporary file
whose name contains `TEMP_MARKER`; `remove_stale_temps` clears those.

Remote paths (`is_remote`: `gs://...`, any `scheme://`, as Keras decides) have
no rename: the file is written to a local scratch folder, then copied into
place with one `tf.io.gfile.copy`. Object stores publish an object whole when
its upload completes, so readers see the previous object or the new one;
file systems reached through `tf.io.gfile` (`hdfs://`) may show a partly
copied file while the copy runs.

Example:
    >>> atomic_write("ckpt/model.keras", model.save, suffix=".keras")
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable

#: Part of every temporary name made here: `.{name}.kmp-tmp-{pid}-{random}{suffix}`.
TEMP_MARKER = ".kmp-tmp-"

# The paths Keras writes through `tf.io.gfile` (`keras.src.utils.file_utils.is_remote_path`).
_REMOTE = re.compile(r"^(/cns|/cfs|/gcs|/hdfs|/readahead|/placer|/tfhub|.*://).*$")


def is_remote(path: str) -> bool:
    """Whether Keras treats `path` as remote (`gs://...`, `/gcs/...`, any `scheme://`)."""
    return bool(_REMOTE.match(str(path)))


def isdir(path: str) -> bool:
    """`os.path.isdir`, through `tf.io.gfile` for a remote path."""
    if is_remote(path):
        import tensorflow as tf

        return bool(tf.io.gfile.isdir(path))
    return os.path.isdir(path)


def temp_path(path: str, suffix: str = "") -> str:
    """A fresh hidden temporary path beside `path` that still ends with `suffix`.

    Args:
        path: The final path.
        suffix: Ending the temporary name must keep (Keras picks the format
            from it, e.g. `".keras"` or `".weights.h5"`).

    Returns:
        A path in `path`'s folder that does not exist yet.
    """
    directory, name = os.path.split(path)
    if suffix and name.endswith(suffix):
        name = name[: -len(suffix)]
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    return os.path.join(directory, f".{name}{TEMP_MARKER}{token}{suffix}")


def is_temp_name(name: str) -> bool:
    """Whether a file name was made by `temp_path`."""
    return name.startswith(".") and TEMP_MARKER in name


def fsync_file(path: str) -> None:
    """Flushes a file's data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: str) -> None:
    """Flushes a folder's entries (a rename) to disk, where the OS allows it."""
    if os.name != "posix":  # pragma: no cover - Windows cannot open folders
        return
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. a folder we may write but not read
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on folders
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, write: Callable[[str], object], suffix: str = "") -> None:
    """Calls `write(tmp)`, then moves the complete file `tmp` to `path` atomically.

    Creates `path`'s folder if needed. On any error (or interruption) the
    temporary file is removed and `path` is left as it was. A remote `path`
    is written locally, then copied into place (see the module docstring).

    Args:
        path: The final path (replaced if it exists).
        write: Writes the whole file at the path it is given.
        suffix: Ending the temporary name keeps (see `temp_path`).
    """
    if is_remote(path):
        _upload(path, write)
        return
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    tmp = temp_path(path, suffix)
    try:
        write(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        remove(tmp)
        raise
    fsync_dir(directory)


def _upload(path: str, write: Callable[[str], object]) -> None:
    """`write`s a local scratch file named like `path`, then copies it to `path`."""
    import tensorflow as tf

    scratch = tempfile.mkdtemp(prefix="kmp-upload-")
    try:
        local = os.path.join(scratch, os.path.basename(path))  # keeps the format's ending
        write(local)
        directory = os.path.dirname(path)
        if directory and not directory.endswith(":") and not tf.io.gfile.exists(directory):
            tf.io.gfile.makedirs(directory)  # as Keras does ("gs:" is no folder to make)
        tf.io.gfile.copy(local, path, overwrite=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def remove_stale_temps(directory: str) -> list[str]:
    """Removes the temporaries (`is_temp_name`) that killed writers left in `directory`.

    Temporaries of this process are kept: they may belong to a write in
    flight. Nothing to do for a folder that does not exist, or a remote one
    (remote writes leave no temporary beside their target).

    Returns:
        The names removed.

    Raises:
        OSError: If the folder cannot be listed.
    """
    if is_remote(directory) or not os.path.isdir(directory or "."):
        return []
    own = f"{TEMP_MARKER}{os.getpid()}-"
    stale = [n for n in os.listdir(directory or ".") if is_temp_name(n) and own not in n]
    for name in stale:
        remove(os.path.join(directory, name))
    return stale


def remove(path: str) -> None:
    """Removes a file or folder if it exists; never raises."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
    except OSError:
        pass


def writable_problem(directory: str) -> str | None:
    """Why files cannot be created in `directory` (or where it would be made), or `None`.

    Probes for real (creates and removes a hidden file), so it also answers
    right for read-only file systems and for root, whom permission bits do not
    stop. A folder that does not exist yet is judged by its nearest existing
    parent, where it would be created. Remote paths (`is_remote`) are not
    probed: nothing is created there before the first write, which reports
    their errors.

    Args:
        directory: The folder files will be written to (`""` is the current one).

    Returns:
        A sentence describing the problem, or `None` if files can be written.
    """
    if is_remote(directory):
        return None
    probe = os.path.abspath(directory or ".")
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:  # pragma: no cover - the root always exists
            break
        probe = parent
    if not os.path.isdir(probe):
        return f"{probe!r} exists and is not a folder"
    try:
        fd, name = tempfile.mkstemp(prefix=".kmp-write-test-", dir=probe)
    except OSError as err:
        return f"no file can be created in {probe!r} ({err.strerror or err})"
    os.close(fd)
    os.remove(name)
    return None
