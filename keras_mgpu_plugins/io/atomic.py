"""Atomic file writes: a file appears at its final name complete, or not at all.

The package's one atomic writer (checkpoints, backups, heartbeats, the
launcher's result files): `atomic_write(path, write)`, or `write_bytes_atomic`
for data already in memory. A writer produces the file under a
temporary name in the *same folder* (so the final rename never crosses file
systems), the data is flushed to disk with `fsync`, and `os.replace` moves it to
the final name in one step; the folder is then synced so the rename itself
survives a crash. A process killed at any moment leaves either the previous
file or the new one at the final name, plus at worst a hidden temporary file
whose name contains `TEMP_MARKER`; `remove_stale_temps` clears those (the
one cleanup rule of the package: `is_stale`).

Remote paths (`is_remote`: `gs://...`, any `scheme://`, as Keras decides) have
no rename: the file is written to a local scratch folder, then copied into
place with one copy of the backend's remote file functions
(`_backend.active().remote_files()`: `tf.io.gfile` on TensorFlow; the other
backends raise, naming what to do instead). Object stores publish an object whole when
its upload completes, so readers see the previous object or the new one;
file systems reached that way (`hdfs://`) may show a partly
copied file while the copy runs.

Example:
    >>> atomic_write("ckpt/model.keras", model.save, suffix=".keras")
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

#: Part of every temporary name made here: `.{name}.kmp-tmp-{host}-{pid}-{random}{suffix}`.
TEMP_MARKER = ".kmp-tmp-"

#: A temporary untouched for this long is stale whoever made it (a writer that lives
#: keeps its file's modification time fresh; a host can die with its temporaries).
STALE_AFTER_S = 24 * 3600.0

_TOKEN = re.compile(re.escape(TEMP_MARKER) + r"(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-[0-9a-f]{8}")

# The paths Keras writes through `tf.io.gfile` (`keras.src.utils.file_utils.is_remote_path`).
_REMOTE = re.compile(r"^(/cns|/cfs|/gcs|/hdfs|/readahead|/placer|/tfhub|.*://).*$")


def is_remote(path: str) -> bool:
    """Whether Keras treats `path` as remote (`gs://...`, `/gcs/...`, any `scheme://`)."""
    return bool(_REMOTE.match(str(path)))


def isdir(path: str) -> bool:
    """`os.path.isdir`, through the backend's remote file functions for a remote path."""
    if is_remote(path):
        return bool(_remote_files().isdir(path))
    return os.path.isdir(path)


def _remote_files() -> Any:
    """`tf.io.gfile`'s file functions, from the active backend (`remote_files()`)."""
    from keras_mgpu_plugins import _backend

    return _backend.active().remote_files()


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
    token = f"{host_tag()}-{os.getpid()}-{secrets.token_hex(4)}"
    return os.path.join(directory, f".{name}{TEMP_MARKER}{token}{suffix}")


def host_tag(host: str | None = None) -> str:
    """This host's name as temporary names carry it (letters, digits, `_`; 32 at most)."""
    host = socket.gethostname() if host is None else host
    return re.sub(r"[^A-Za-z0-9]", "_", host)[:32] or "_"


def is_temp_name(name: str) -> bool:
    """Whether a file name was made by `temp_path` (or an earlier version of it)."""
    return name.startswith(".") and TEMP_MARKER in name


def is_stale(name: str, age_s: float, host: str | None = None,
             alive: Callable[[int], bool] | None = None) -> bool:
    """The cleanup rule: whether the temporary `name`, unmodified for `age_s`, is abandoned.

    A temporary is stale when it was made on this host by a process that no
    longer runs, or (made anywhere, or named in an older format) when it has
    not been modified for `STALE_AFTER_S`. A live writer's file is never
    stale, whichever job it belongs to; another host's fresh file neither
    (its process cannot be checked from here).

    Args:
        name: A file name (`is_temp_name`).
        age_s: Seconds since the file was last modified.
        host: This host's tag (`host_tag()` if `None`).
        alive: Whether a process id of this host runs (`pid_alive` if `None`).
    """
    if not is_temp_name(name):
        return False
    if age_s > STALE_AFTER_S:
        return True
    match = _TOKEN.search(name)
    if match is None or match["host"] != (host_tag() if host is None else host):
        return False
    return not (pid_alive if alive is None else alive)(int(match["pid"]))


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (`True` where that cannot be told)."""
    if pid <= 0 or os.name != "posix":
        return pid > 0
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process: it exists
        return True
    return True


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


def write_bytes_atomic(path: str, data: bytes | str) -> None:
    """Writes `data` (a `str` as UTF-8) to `path` atomically (`atomic_write`).

    Args:
        path: The final path (replaced if it exists).
        data: The whole content of the file.
    """
    content = data.encode() if isinstance(data, str) else data

    def write(staged: str) -> None:
        with open(staged, "wb") as f:
            f.write(content)

    atomic_write(path, write)


def _upload(path: str, write: Callable[[str], object]) -> None:
    """`write`s a local scratch file named like `path`, then copies it to `path`."""
    scratch = tempfile.mkdtemp(prefix="kmp-upload-")
    try:
        local = os.path.join(scratch, os.path.basename(path))  # keeps the format's ending
        write(local)
        files, directory = _remote_files(), os.path.dirname(path)
        if directory and not directory.endswith(":") and not files.exists(directory):
            files.makedirs(directory)  # as Keras does ("gs:" is no folder to make)
        files.copy(local, path, overwrite=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def remove_stale_temps(directory: str) -> list[str]:
    """Removes the temporaries that writers which died left in `directory` (`is_stale`).

    Another job sharing the folder keeps its temporaries while its writer
    lives, on this host or another. Nothing to do for a folder that does not
    exist, or a remote one (remote writes leave no temporary beside their target).

    Returns:
        The names removed.

    Raises:
        OSError: If the folder cannot be listed.
    """
    if is_remote(directory) or not os.path.isdir(directory or "."):
        return []
    host, now, removed = host_tag(), time.time(), []
    for name in os.listdir(directory or "."):
        if not is_temp_name(name):
            continue
        path = os.path.join(directory, name)
        try:
            age = now - os.lstat(path).st_mtime
        except OSError:  # gone meanwhile (its writer renamed it)
            continue
        if is_stale(name, age, host):
            remove(path)
            removed.append(name)
    return removed


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


def prepare_folder(directory: str) -> str | None:
    """Why files cannot be written in `directory` (`writable_problem`), or `None`.

    Also removes the stale temporaries there (`remove_stale_temps`).
    """
    problem = writable_problem(directory)
    if problem is None:
        try:
            remove_stale_temps(directory)
        except OSError as err:
            problem = f"{directory!r} cannot be listed ({err.strerror or err})"
    return problem
